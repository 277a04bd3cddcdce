"""``python -m cbr2.llm.smoke``: each environment check fails at once, saying what to do."""

from __future__ import annotations

import pytest

from cbr2.llm import smoke


def test_no_cuda_is_said_at_once():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    with pytest.raises(smoke.SmokeError, match="no CUDA"):
        smoke.check_cuda()
    assert smoke.main(["--no-tier"]) == 2


def test_the_vllm_requirement_is_the_projects_extra():
    assert smoke.vllm_requirement().startswith("vllm>=")


def test_missing_weights_are_named(tmp_path, monkeypatch):
    with pytest.raises(smoke.SmokeError, match="no config.json"):
        smoke.check_weights(str(tmp_path), "llm.model")
    (tmp_path / "config.json").write_text("{}")
    assert smoke.check_weights(str(tmp_path), "llm.model").endswith("folder")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(smoke.SmokeError, match="not in the Hugging Face cache"):
        smoke.check_weights("nobody-here/no-such-model-x", "llm.model")
