"""Issue 14, classes 3-6: damaged caches and prediction files, bad option values, run ids of training."""

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cbr2.config import CONFIG_DIR, ConfigError, TrainConfig, load_config
from cbr2.retrieval.cache import EmbeddingStore

ROOT = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------- 3. the embedding cache

def _embed(calls):
    def embed(texts):
        calls.append(len(texts))
        rng = np.random.default_rng(len(texts))
        x = rng.standard_normal((len(texts), 8)).astype(np.float32)
        return x / np.linalg.norm(x, axis=1, keepdims=True)
    return embed


def _rewrite_embeddings(entry, array):
    """Store ``array`` as the entry's vectors with a matching checksum: only dtype/shape checks can tell."""
    from cbr2.common.files import file_sha256

    np.save(entry / "embeddings.npy", array, allow_pickle=False)
    meta = json.loads((entry / "meta.json").read_text())
    meta["embeddings_sha256"] = file_sha256(entry / "embeddings.npy")
    (entry / "meta.json").write_text(json.dumps(meta))


def _damage(entry, how):
    if how.startswith("meta="):  # valid JSON, not the meta object
        (entry / "meta.json").write_text(how[len("meta="):])
    elif how == "meta_dim_text":
        meta = json.loads((entry / "meta.json").read_text())
        (entry / "meta.json").write_text(json.dumps({**meta, "dim": "eight"}))
    elif how == "meta_no_checksum":
        meta = json.loads((entry / "meta.json").read_text())
        del meta["embeddings_sha256"]
        (entry / "meta.json").write_text(json.dumps(meta))
    elif how == "meta_truncated":
        (entry / "meta.json").write_text((entry / "meta.json").read_text()[:30])
    elif how == "no_embeddings":
        (entry / "embeddings.npy").unlink()
    elif how == "truncated_embeddings":
        (entry / "embeddings.npy").write_bytes((entry / "embeddings.npy").read_bytes()[:100])
    elif how == "flipped_byte":
        raw = bytearray((entry / "embeddings.npy").read_bytes())
        raw[-3] ^= 0xFF
        (entry / "embeddings.npy").write_bytes(bytes(raw))
    elif how == "float64":
        _rewrite_embeddings(entry, np.load(entry / "embeddings.npy").astype(np.float64))
    elif how == "wrong_shape":
        _rewrite_embeddings(entry, np.load(entry / "embeddings.npy")[:, :4].copy())
    elif how == "a_file":
        import shutil

        shutil.rmtree(entry)
        entry.write_text("not a cache entry")
    else:
        raise AssertionError(how)


@pytest.mark.parametrize("how", ["meta=[]", "meta=3", 'meta="x"', "meta=null", "meta={}", "meta_dim_text",
                                 "meta_no_checksum", "meta_truncated", "no_embeddings", "truncated_embeddings",
                                 "flipped_byte", "float64", "wrong_shape", "a_file"])
def test_any_damaged_cache_entry_is_rebuilt_once_with_one_warning(tmp_path, caplog, how):
    store, calls = EmbeddingStore(tmp_path / "cache"), []
    texts = [f"t{i}" for i in range(5)]
    good, _ = store.get("facts", texts, "enc", "w", _embed(calls))
    (entry,) = [p for p in (tmp_path / "cache").iterdir() if not p.name.startswith(".")]
    _damage(entry, how)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="cbr2.retrieval.cache"):
        rebuilt, index = store.get("facts", texts, "enc", "w", _embed(calls))
    assert calls == [5, 5], "the damaged entry must be encoded again"
    assert np.array_equal(rebuilt, good) and index.ntotal == 5
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and entry.name in warnings[0] and "unusable" in warnings[0], warnings
    assert entry.is_dir()
    store.get("facts", texts, "enc", "w", _embed(calls))
    assert calls == [5, 5], "the rebuilt entry must be reused, not encoded on every run"


# ---------------------------------------------------------------- 4. predictions.jsonl and resume

def _rec(qid, **extra):
    return {"id": qid, "question": f"question {qid} → é", "generated": "r1: Find[x] → QueryName[]",
            "prompt_hash": "p", "generation_key": "g", **extra}


def _lines(*records):
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records).encode()


LAST_LINE_DAMAGE = {
    "truncated_json": lambda good: good + _lines(_rec("q3"))[:25],
    "truncated_utf8": lambda good: good + _lines(_rec("q3"))[: _lines(_rec("q3")).index("→".encode()) + 1],
    "garbage": lambda good: good + b"\x00\xff\xfe garbage",
    "json_list": lambda good: good + b"[1, 2]\n",
    "json_string": lambda good: good + b'"x"\n',
    "json_null": lambda good: good + b"null",
    "no_id": lambda good: good + b'{"question": "where is the id?"}\n',
    "numeric_id": lambda good: good + b'{"id": 3}\n',
    "blank_line": lambda good: good + b"\n",
}


@pytest.mark.parametrize("damage", list(LAST_LINE_DAMAGE))
def test_any_damage_to_the_last_line_is_dropped_and_the_file_cut_back(tmp_path, caplog, damage):
    from cbr2.evaluation.records import load_predictions

    path = tmp_path / "predictions.jsonl"
    good = _lines(_rec("q1"), _rec("q2"))
    path.write_bytes(LAST_LINE_DAMAGE[damage](good))
    records = load_predictions(path, repair=True)
    assert list(records) == ["q1", "q2"] and records["q2"] == _rec("q2")
    assert f"{path}:3" in caplog.text and "damaged last line" in caplog.text
    assert path.read_bytes() == good  # valid JSONL again, ready to be appended to


@pytest.mark.parametrize("damage", list(LAST_LINE_DAMAGE))
def test_damage_before_the_last_line_is_refused_naming_file_and_line(tmp_path, damage):
    from cbr2.evaluation.records import load_predictions

    path = tmp_path / "predictions.jsonl"
    damaged = LAST_LINE_DAMAGE[damage](_lines(_rec("q1")))
    if not damaged.endswith(b"\n"):
        damaged += b"\n"
    path.write_bytes(damaged + _lines(_rec("q4")))
    before = path.read_bytes()
    with pytest.raises(ValueError, match=r"predictions\.jsonl:2: corrupt record"):
        load_predictions(path, repair=True)
    assert path.read_bytes() == before  # refused, not modified


def test_readers_that_do_not_write_leave_the_file_alone(tmp_path):
    from cbr2.evaluation.records import load_predictions

    path = tmp_path / "predictions.jsonl"
    path.write_bytes(_lines(_rec("q1")) + b'{"id": "q2", "gen')  # the run may still be appending
    assert list(load_predictions(path)) == ["q1"]  # what a report or a merge reads
    assert path.read_bytes().endswith(b'"gen')


def test_a_repeated_id_is_refused_unless_identical_or_superseded(tmp_path):
    from cbr2.evaluation.records import load_predictions

    path = tmp_path / "predictions.jsonl"
    path.write_bytes(_lines(_rec("q1"), _rec("q2"), _rec("q1")))  # the same record twice: harmless
    assert list(load_predictions(path)) == ["q1", "q2"]
    path.write_bytes(_lines(_rec("q1"), _rec("q2"), _rec("q1", generated="something else")))
    with pytest.raises(ValueError, match=r"predictions\.jsonl: lines 1 and 3 both hold id 'q1'"):
        load_predictions(path)
    # Legitimate repetitions: a stale record generated again, a fallback's pending first pass corrected.
    path.write_bytes(_lines(_rec("q1", prompt_hash="old"), _rec("q2", fallback={"pending": True}),
                            _rec("q1", generated="new"), _rec("q2", fallback={"fired": True})))
    records = load_predictions(path)
    assert records["q1"]["generated"] == "new" and records["q2"]["fallback"] == {"fired": True}


def test_a_lone_surrogate_round_trips_exactly(tmp_path):
    from cbr2.evaluation.records import append_record, read_records

    record = _rec("q1", generated="r1: Find[\ud800] → QueryName[] é")
    path = tmp_path / "predictions.jsonl"
    with path.open("a", encoding="utf-8") as handle:
        append_record(handle, record)
        append_record(handle, _rec("q2"))
    assert [r for _, r in read_records(path)] == [record, _rec("q2")]
    # Only the record that cannot be UTF-8 is written with escapes; the others stay readable.
    assert path.read_text(encoding="utf-8").splitlines() == [json.dumps(record), json.dumps(_rec("q2"), ensure_ascii=False)]


class _Echo:
    """A backend that writes ``text(question)`` for each prompt and counts what it generated."""

    calls: list[str] = []  # noqa: RUF012 - reset by the fixture
    text = staticmethod(lambda q: "r1: Find[X] → QueryName[]")
    capabilities = frozenset()  # it takes no grammar: the runs here decode unconstrained

    def __init__(self, cfg):
        pass

    def identity(self):
        return {"backend": "echo"}

    def render(self, prompt):
        return prompt.text

    def generate(self, prompts, on_result=None):
        from cbr2.common.records import Completion

        out = []
        for i, p in enumerate(prompts):
            _Echo.calls.append(p.qid)
            out.append(Completion(_Echo.text(p.qid)))
            if on_result:
                on_result(i, out[-1])
        return out


@pytest.fixture()
def echo(monkeypatch):
    from cbr2 import llm

    monkeypatch.setitem(llm.BACKENDS, "echo", "test_hardening:_Echo")
    _Echo.calls = []
    return _Echo


def _evaluate(tmp_path, *overrides):
    from cbr2.run.runner import run_evaluation

    cfg = load_config([f"output_dir={tmp_path / 'run'}", "llm.backend=echo", "eval.per_category=null", "eval.limit=6",
                       "wandb.mode=disabled", "generation.constrained=false", "retrieval.cases=none",
                       "retrieval.k_ontology=0", "retrieval.k_facts=0", *overrides])
    return run_evaluation(cfg), tmp_path / "run" / "predictions.jsonl"


def test_a_run_cut_inside_a_utf8_character_resumes(tmp_path, echo):
    metrics, pred = _evaluate(tmp_path)
    data = pred.read_bytes()
    last_start = data.rstrip(b"\n").rfind(b"\n") + 1
    cut = data.index("→".encode(), last_start) + 1  # inside the arrow's three bytes
    pred.write_bytes(data[:cut])
    echo.calls = []
    again, _ = _evaluate(tmp_path)
    assert len(echo.calls) == 1 and again["n"] == metrics["n"] == 6
    assert [json.loads(line)["id"] for line in pred.read_text(encoding="utf-8").splitlines()] == \
        [json.loads(line)["id"] for line in data.decode().splitlines()]


def test_generated_text_with_a_lone_surrogate_is_written_and_resumed(tmp_path, echo, monkeypatch):
    from cbr2.run import run_folder

    monkeypatch.setattr(echo, "text", staticmethod(lambda q: "r1: Find[\ud800] → QueryName[]"))
    # report.md quotes generated text too; its writer (cbr2.report.run_report) is checked apart from this one.
    monkeypatch.setattr(run_folder, "write_report", lambda *a, **k: None)
    metrics, pred = _evaluate(tmp_path)
    records = [json.loads(line) for line in pred.read_text(encoding="utf-8").splitlines()]
    assert metrics["n"] == 6 and all(r["generated"] == "r1: Find[\ud800] → QueryName[]" for r in records)
    echo.calls = []
    assert _evaluate(tmp_path)[0]["n"] == 6 and not echo.calls  # read back as cached, not generated again


def test_an_unreadable_config_beside_predictions_is_a_clear_refusal(tmp_path):
    from cbr2.run.run_folder import check_same_config

    (tmp_path / "predictions.jsonl").write_bytes(_lines(_rec("q1")))
    (tmp_path / "config.yaml").write_text("data: [oops\n")
    with pytest.raises(ValueError, match=r"config\.yaml is not a readable config .*choose another output_dir"):
        check_same_config(tmp_path, load_config([]))
    (tmp_path / "config.yaml").write_text("- 1\n")
    with pytest.raises(ValueError, match=r"not a mapping"):
        check_same_config(tmp_path, load_config([]))


# ---------------------------------------------------------------- 5. option values

@pytest.mark.parametrize("override, message", [
    ("eval.timeout_s=0", "eval.timeout_s=0.0: must be greater than 0"),
    ("eval.timeout_s=-1", "eval.timeout_s=-1.0: must be greater than 0"),
    ("eval.limit=0", "eval.limit=0: must be at least 1 (0 would evaluate no question"),
    ("eval.limit=-3", "eval.limit=-3: must be at least 1"),
    ("eval.per_category=-1", "eval.per_category=-1: must be at least 1"),
    ("eval.skip_per_category=-1", "eval.skip_per_category=-1: must be at least 0"),
    ("eval.num_shards=0", "eval.num_shards=0: must be at least 1"),
    ("wandb.mode=onlin", "unknown wandb.mode 'onlin' (did you mean online"),
    ("prompt.format=tree", "unknown prompt.format 'tree'; expected one of dag, chain"),
    ("llm.backend=gld", "unknown llm.backend 'gld' (did you mean gold?)"),
    ("llm.dtype=fp13", "unknown llm.dtype 'fp13'"),
    ("llm.temperature=-0.5", "llm.temperature=-0.5: must be at least 0"),
    ("llm.top_p=1.5", "llm.top_p=1.5: must be in (0, 1]"),
    ("llm.max_new_tokens=0", "llm.max_new_tokens=0: must be at least 1"),
    ("data.name=kqa", "unknown data.name 'kqa'"),
    ("data.split=dev", "data.split='dev' is not a kqapro split"),
    ("retrieval.cases=dua", "unknown retrieval.cases 'dua'"),
    ("retrieval.index=lsh", "unknown retrieval.index 'lsh'"),
    ("retrieval.k_facts=-1", "retrieval.k_facts=-1: must be at least 0"),
    ("retrieval.k_semantic=-2", "retrieval.k_semantic=-2: must be at least 0"),
    ("generation.canonicalize_threshold=1.5", "generation.canonicalize_threshold=1.5: must be in [0, 1]"),
    ("generation.max_lines=0", "generation.max_lines=0: must be at least 1"),
])
def test_bad_option_values_fail_when_the_config_is_built(override, message):
    with pytest.raises(ConfigError) as err:
        load_config([override], files=[CONFIG_DIR / "evaluate.yaml"])
    assert message in str(err.value)


@pytest.mark.parametrize("override, message", [
    ("structural.holdout=0", "structural.holdout=0.0: must be in (0, 1)"),
    ("structural.lr=0", "structural.lr=0.0: must be greater than 0"),
    ("structural.label=lsc", "unknown structural.label 'lsc' (did you mean lcs?)"),
    ("structural.batch_size=0", "structural.batch_size=0: must be at least 1"),
    ("wandb.mode=onlien", "unknown wandb.mode 'onlien' (did you mean online"),
])
def test_bad_training_option_values_fail_when_the_config_is_built(override, message):
    with pytest.raises(ConfigError) as err:
        load_config([override], files=[CONFIG_DIR / "train.yaml"], schema=TrainConfig)
    assert message in str(err.value)


def test_every_bad_value_is_named_at_once_and_good_edges_pass():
    with pytest.raises(ConfigError, match=r"eval\.limit=0.*; eval\.timeout_s=0\.0"):
        load_config(["eval.limit=0", "eval.timeout_s=0"])
    cfg = load_config(["eval.limit=null", "eval.per_category=null", "retrieval.k_facts=0", "llm.temperature=0",
                       "prompt.case_triples=null", "data.name=mini-metaqa", "data.split=dev", "wandb.mode=disabled"])
    assert cfg.eval.limit is None and cfg.data.split == "dev"


@pytest.mark.parametrize("text, where, what", [
    ("eval:\n  limit: [1\n", ":3:", "not valid YAML"),
    ("eval:\n limit: 1\n  per_category: 2\n", ":3:", "not valid YAML"),
    ("- eval.limit=3\n", ":1:", "holds a YAML list, not a mapping"),
    ("3\n", ":1:", "holds a YAML int, not a mapping"),
    ('"eval"\n', ":1:", "holds a YAML str, not a mapping"),
])
def test_a_bad_config_file_is_a_one_line_error_naming_file_and_line(tmp_path, text, where, what):
    path = tmp_path / "mine.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_config([], files=[CONFIG_DIR / "evaluate.yaml", path])
    message = str(err.value)
    assert message.startswith(f"{path}{where}") and what in message and "\n" not in message


def test_empty_config_file_is_no_change(tmp_path):
    (tmp_path / "empty.yaml").write_text("# nothing yet\n")
    assert load_config([], files=[tmp_path / "empty.yaml"]) == load_config([])


def _cli(script, *args, cwd):
    return subprocess.run([sys.executable, str(ROOT / script), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300, check=False, env={**os.environ, "HF_HUB_OFFLINE": "1"})


@pytest.mark.slow
def test_the_clis_exit_2_with_one_line_on_bad_files_and_values(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("eval: {limit: 3\n")
    proc = _cli("evaluate.py", "--config", str(bad), cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    (line,) = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert f"{bad}:" in line and "not valid YAML" in line
    proc = _cli("evaluate.py", "eval.timeout_s=0", cwd=tmp_path)
    assert proc.returncode == 2 and "eval.timeout_s=0.0: must be greater than 0" in proc.stderr
    proc = _cli("train.py", "wandb.mode=onlin", cwd=tmp_path)  # used to fail only after loading data and model
    assert proc.returncode == 2 and "unknown wandb.mode 'onlin'" in proc.stderr and "Traceback" not in proc.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["bad.yaml"]  # nothing written


# ---------------------------------------------------------------- 6. run ids of training

def _train_cfg(*overrides):
    return load_config(list(overrides), files=[CONFIG_DIR / "train.yaml"], schema=TrainConfig)


def _run_id(cfg):
    from cbr2.structural.train import run_id

    return run_id(cfg.data, cfg.structural, cfg.seed, cfg.trainer)


def test_runs_that_train_differently_get_different_ids():
    base = _run_id(_train_cfg())
    others = [_run_id(_train_cfg(o)) for o in ("trainer.max_steps=40", "trainer.max_epochs=5", "structural.lr=3e-5",
                                               "trainer.precision=bf16-mixed", "trainer.accumulate_grad_batches=2",
                                               "seed=1")]
    assert len({base, *others}) == 1 + len(others)


def test_attempts_on_other_hardware_keep_the_id():
    base = _run_id(_train_cfg())
    for o in (["trainer.devices=4", "trainer.strategy=ddp"], ["trainer.num_nodes=2"], ["trainer.accelerator=gpu"],
              ["trainer.log_every_n_steps=1", "trainer.enable_progress_bar=false"]):
        assert _run_id(_train_cfg(*o)) == base, o

