"""`python -m cbr2.report.compare`: Table 5 layout and order, Δ, honesty checks, chart and CLI, on synthetic runs."""

from __future__ import annotations

import json
import random

import pytest

from cbr2.data.questions import KQAPRO_CATEGORIES
from cbr2.evaluation.metrics import ANSWER_COMPARISON
from cbr2.report.compare import ReportError, load_run, main, plot_per_category, render_table, table_data

PAPER_TABLE_5 = {
    # ablation -> (per category Hits@1 in KQA Pro order, overall), the paper's numbers.
    "full": ([83, 84, 85, 81, 85, 81, 81, 91, 86], 84.11),
    "chain": ([78, 82, 81, 73, 82, 68, 80, 90, 85], 79.89),
    "w/o_reasoning_case": ([77, 75, 79, 62, 77, 65, 77, 85, 75], 74.67),
    "w/o_semantic_case": ([63, 64, 57, 52, 68, 63, 56, 79, 70], 63.56),
    "random_case": ([31, 37, 11, 26, 43, 11, 25, 42, 46], 30.22),
    "w/o_act": ([77, 74, 69, 71, 81, 60, 76, 85, 83], 75.11),
    "w/o_ont": ([79, 81, 78, 78, 80, 77, 79, 88, 83], 80.33),
    "w/o_knowledge": ([80, 77, 76, 74, 82, 70, 76, 85, 84], 78.22),
}
LABELS = ["Full CBR²", "Chain", "-w/o reasoning case", "-w/o semantic case", "random case",
          "-w/o act knowledge", "-w/o ont knowledge", "-w/o knowledge"]
HASH = "a" * 64


def ablation_table(runs):
    """The Table 5 markdown ``compare`` writes (ablation.md) for loaded runs."""
    return render_table(table_data(runs))


def write_run(root, name, per_category, *, ablation=None, benchmark="kqapro", split="val", model="Qwen/Qwen3-8B",
              backend="vllm", seed=0, git="abc123", qhash=HASH, ser=0.0371, hits=None, generation=None,
              comparison=ANSWER_COMPARISON, per_type=None):
    """A run folder whose metrics.json has the structure the runner writes; ``per_category``: cat -> (hits, n);
    ``per_type``: reasoning type -> (hits, n)."""
    n = sum(k for _, k in per_category.values())
    metrics = {
        "hits@1": hits if hits is not None else sum(h * k for h, k in per_category.values()) / n,
        "ser": ser, "ser_before_repair": ser + 0.01, "n": n,
        **({"answer_comparison": comparison} if comparison else {}),
        **({"per_reasoning_type": {t: {"hits@1": h, "ser": ser, "ser_before_repair": ser, "n": k}
                                   for t, (h, k) in per_type.items()}} if per_type else {}),
        "per_category": {c: {"hits@1": h, "ser": ser, "ser_before_repair": ser, "n": k}
                         for c, (h, k) in per_category.items()},
        "errors": {"syntax": 0, "type": 0, "execution": 0, "empty": 0, "wrong": 0},
        "provenance": {
            "config": {"data": {"name": benchmark, "split": split}, "llm": {"backend": backend, "model": model},
                       "prompt": {"format": "chain" if ablation == "chain" else "dag"},
                       **({"generation": generation} if generation else {})},
            "ablation": ablation, "prompt_version": "v1", "git": git, "split": split, "seed": seed, "n": n,
            **({"question_ids_sha256": qhash} if qhash else {}),
        },
    }
    d = root / name
    d.mkdir(parents=True)
    (d / "metrics.json").write_text(json.dumps(metrics), encoding="utf-8")
    (d / "predictions.jsonl").write_text("", encoding="utf-8")
    return d


def paper_runs(root, **kw):
    """The paper's eight Table 5 settings as runs of 100 questions per category."""
    return {ab: write_run(root, ab.replace("/", "_"), {c: (v / 100, 100) for c, v in zip(KQAPRO_CATEGORIES, vals)},
                          ablation=ab, **kw)
            for ab, (vals, _) in PAPER_TABLE_5.items()}


def rows_of(markdown):
    """Table rows (header and rule excluded) split into cells."""
    lines = [line for line in markdown.splitlines() if line.startswith("|")]
    return [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:]]


def test_rows_follow_table_5_whatever_the_argument_order(tmp_path):
    dirs = list(paper_runs(tmp_path).values())
    random.Random(0).shuffle(dirs)
    md = ablation_table([load_run(d) for d in dirs])
    header = next(line for line in md.splitlines() if line.startswith("|"))
    assert [c.strip() for c in header.strip("|").split("|")] == [
        "Category group", "Setting", "CT", "QA", "QAQ", "QN", "QR", "QRQ", "SA", "SB", "VF", "Overall",
        "Δ vs full (points)", "95% CI", "flips", "SER (%)", "n"]
    rows = rows_of(md)
    assert [r[1] for r in rows] == LABELS
    # A group's name stands on its first row only, as in the paper.
    assert [r[0] for r in rows] == ["", "Target Program Format", "Case Recall", "", "", "Knowledge Recall", "", ""]
    assert rows_of(ablation_table([load_run(d) for d in reversed(dirs)])) == rows


def test_numbers_and_delta_match_the_paper(tmp_path):
    dirs = paper_runs(tmp_path)
    rows = {r[1]: r for r in rows_of(ablation_table([load_run(d) for d in dirs.values()]))}
    for (ab, (vals, overall)), label in zip(PAPER_TABLE_5.items(), LABELS):
        row = rows[label]
        assert row[2:11] == [f"{v:.2f}" for v in vals]
        assert row[11] == f"{overall:.2f}"
        assert row[15] == "3.71" and row[16] == "900"
    full = PAPER_TABLE_5["full"][1]
    assert rows["Full CBR²"][12] == "—"
    # The paper's text: -9.44 (w/o reasoning case), -4.22 (Chain), -20.55 (w/o semantic case). The paper
    # subtracts rounded overalls (84.11 - 63.56); Δ here comes from the exact ones (-185/900 = -20.555...).
    assert rows["-w/o reasoning case"][12] == "-9.44"
    assert rows["-w/o semantic case"][12] == "-20.56"
    assert rows["Chain"][12] == "-4.22"
    assert rows["random case"][12] == f"{PAPER_TABLE_5['random_case'][1] - full:+.2f}" == "-53.89"


def test_json_has_the_same_numbers(tmp_path):
    dirs = paper_runs(tmp_path)
    data = table_data([load_run(d) for d in dirs.values()])
    assert [r["setting"] for r in data["rows"]] == LABELS
    chain = data["rows"][1]
    assert chain["per_category"]["QueryRelationQualifier"] == 68.0 and chain["overall"] == 79.89
    assert chain["delta_vs_full"] == -4.22 and chain["ser"] == 3.71 and chain["n"] == 900
    assert data["rows"][0]["delta_vs_full"] is None and data["notes"] == []


def test_positive_delta_and_rounding(tmp_path):
    cats = {c: (0.5, 10) for c in KQAPRO_CATEGORIES}
    full = write_run(tmp_path, "full", cats, ablation="full", hits=0.5)
    better = write_run(tmp_path, "chain", cats, ablation="chain", hits=0.51236)
    rows = rows_of(ablation_table([load_run(better), load_run(full)]))
    assert rows[1][11:13] == ["51.24", "+1.24"]


def test_metaqa_columns(tmp_path):
    hops = {"1-hop": (0.997, 1000), "2-hop": (0.998, 1000), "3-hop": (0.998, 1000)}
    a = write_run(tmp_path, "full", hops, ablation="full", benchmark="metaqa", split="test", ser=0.0)
    b = write_run(tmp_path, "chain", {k: (v - 0.1, n) for k, (v, n) in hops.items()}, ablation="chain",
                  benchmark="metaqa", split="test", ser=0.0)
    md = ablation_table([load_run(b), load_run(a)])
    header = next(line for line in md.splitlines() if line.startswith("|"))
    assert "| Setting | 1-hop | 2-hop | 3-hop | Overall |" in header and "CT" not in header
    rows = rows_of(md)
    assert rows[0][1:6] == ["Full CBR²", "99.70", "99.80", "99.80", "99.77"]
    assert rows[1][1] == "Chain" and rows[1][6] == "-10.00"


def test_config_file_spelling_of_ablation_names(tmp_path):
    cats = {c: (0.8, 10) for c in KQAPRO_CATEGORIES}
    runs = [write_run(tmp_path, n, cats, ablation=n) for n in ("wo_knowledge", "wo_act", "full")]
    data = table_data([load_run(d) for d in runs])
    assert [r["setting"] for r in data["rows"]] == ["Full CBR²", "-w/o act knowledge", "-w/o knowledge"]


def test_generation_switches_tell_runs_of_one_setting_apart(tmp_path):
    cats = {c: (0.8, 10) for c in KQAPRO_CATEGORIES}
    runs = [write_run(tmp_path, name, cats, ablation="full", generation={"constrained": on, "fallback": False})
            for name, on in (("grammar", True), ("single", False))]
    data = table_data([load_run(d) for d in runs])
    assert [r["setting"] for r in data["rows"]] == ["Full CBR² (constrained=False)", "Full CBR² (constrained=True)"]


def test_unnamed_and_duplicate_runs_get_distinct_deterministic_labels(tmp_path):
    cats = {c: (0.8, 10) for c in KQAPRO_CATEGORIES}
    a = write_run(tmp_path, "a", cats, ablation="full", model="Qwen/Qwen3-8B")
    b = write_run(tmp_path, "b", cats, ablation="full", model="meta-llama/Llama-3.1-8B")
    c = write_run(tmp_path / "x", "hf", cats, seed=1)
    d = write_run(tmp_path / "y", "hf", cats, seed=2)
    e = write_run(tmp_path, "chain", {k: (0.7, 10) for k in KQAPRO_CATEGORIES}, ablation="chain",
                  model="meta-llama/Llama-3.1-8B")
    data = table_data([load_run(p) for p in (d, e, c, b, a)])
    labels = [r["setting"] for r in data["rows"]]
    assert labels == ["Full CBR² (model=Qwen/Qwen3-8B)", "Full CBR² (model=meta-llama/Llama-3.1-8B)", "Chain",
                      "hf (seed=1)", "hf (seed=2)"]
    assert [r["group"] for r in data["rows"]][-2:] == ["Other", "Other"]
    # Δ is taken against the full run of the same LLM, not the first one.
    assert data["rows"][2]["delta_vs_full"] == -10.0 and data["rows"][2]["reference"] == labels[1]
    assert labels == [r["setting"] for r in table_data([load_run(p) for p in (a, b, c, d, e)])["rows"]]


def test_identical_configs_fall_back_to_the_folder(tmp_path):
    cats = {c: (0.8, 10) for c in KQAPRO_CATEGORIES}
    a = write_run(tmp_path, "run1", cats, ablation="full")
    b = write_run(tmp_path, "run2", cats, ablation="full")
    labels = [r["setting"] for r in table_data([load_run(b), load_run(a)])["rows"]]
    assert labels == [f"Full CBR² [{a}]", f"Full CBR² [{b}]"]


def test_png_written(tmp_path):
    dirs = paper_runs(tmp_path)
    out = tmp_path / "chart.png"
    plot_per_category([load_run(d) for d in dirs.values()], out)
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


@pytest.mark.parametrize("case", ["missing", "corrupt", "retrieval-only", "no-folder"])
def test_unusable_run_is_named(tmp_path, case):
    d = tmp_path / "the-run"
    if case != "no-folder":
        d.mkdir()
    if case == "corrupt":
        (d / "metrics.json").write_text("{not json", encoding="utf-8")
    elif case == "retrieval-only":
        (d / "metrics.json").write_text(json.dumps({"n": 5, "retrieval": {"n": 5}, "provenance": {}}))
    with pytest.raises(ReportError, match="the-run") as err:
        load_run(d)
    if case == "retrieval-only":
        assert "retrieval-only" in str(err.value) and "hits@1" in str(err.value)


def test_mixing_benchmarks_or_splits_is_refused(tmp_path):
    cats = {c: (0.8, 10) for c in KQAPRO_CATEGORIES}
    kqa = write_run(tmp_path, "kqa", cats, ablation="full")
    meta = write_run(tmp_path, "meta", {"1-hop": (0.9, 10)}, ablation="chain", benchmark="metaqa", split="test")
    with pytest.raises(ReportError, match="different benchmarks"):
        ablation_table([load_run(kqa), load_run(meta)])
    mini = write_run(tmp_path, "mini", cats, ablation="chain", benchmark="mini-kqapro")
    with pytest.raises(ReportError, match="different benchmarks"):
        ablation_table([load_run(kqa), load_run(mini)])
    test = write_run(tmp_path, "test", cats, ablation="chain", split="test")
    with pytest.raises(ReportError, match="different splits"):
        ablation_table([load_run(kqa), load_run(test)])


def test_different_question_sets_llms_and_revisions_are_noted(tmp_path):
    cats = {c: (0.8, 10) for c in KQAPRO_CATEGORIES}
    a = write_run(tmp_path, "a", cats, ablation="full")
    b = write_run(tmp_path, "b", cats, ablation="chain", qhash="b" * 64)
    md = ablation_table([load_run(a), load_run(b)])
    assert md.count("> **Note:**") == 1 and "different question sets" in md
    c = write_run(tmp_path, "c", cats, ablation="random_case", qhash=None, model="other", git="def456")
    notes = table_data([load_run(a), load_run(c)])["notes"]
    assert len(notes) == 3
    assert "No question_ids_sha256 recorded for random case" in notes[0]
    assert "different LLMs" in notes[1] and "different git revisions" in notes[2]
    assert table_data([load_run(a), load_run(write_run(tmp_path, "d", cats, ablation="chain"))])["notes"] == []


def test_cli_writes_markdown_json_and_png(tmp_path, capsys):
    dirs = paper_runs(tmp_path / "runs", qhash=None)
    out = tmp_path / "report"
    assert main([*map(str, dirs.values()), "--out", str(out), "--title", "Ablation"]) == 0
    captured = capsys.readouterr()
    md = (out / "ablation.md").read_text(encoding="utf-8")
    assert md.startswith("# Ablation\n") and md in captured.out
    assert "warning: No question_ids_sha256 recorded" in captured.err and "> **Note:** No question_ids" in md
    data = json.loads((out / "ablation.json").read_text(encoding="utf-8"))
    assert [r["setting"] for r in data["rows"]] == LABELS and data["rows"][4]["overall"] == 30.22
    assert (out / "per_category.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_error_exit_code(tmp_path, capsys):
    ok = write_run(tmp_path, "ok", {c: (0.8, 10) for c in KQAPRO_CATEGORIES}, ablation="full")
    assert main([str(ok), str(tmp_path / "absent"), "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "absent" in err
    assert not (tmp_path / "r").exists()


def test_delta_comes_with_a_paired_bootstrap_interval_and_the_flips(tmp_path):
    """Two runs on the same 40 questions: the full run right on 0-29, the ablation on 5-34."""
    ids = [f"val-{i}" for i in range(40)]
    runs = {}
    for ablation, right in (("full", range(30)), ("chain", range(5, 35))):
        d = write_run(tmp_path, ablation, {"Count": (30 / 40, 40)}, ablation=ablation)
        (d / "predictions.jsonl").write_text("".join(json.dumps({"id": q, "correct": i in right}) + "\n"
                                                     for i, q in enumerate(ids)))
        runs[ablation] = load_run(d)
    row = table_data(list(runs.values()))["rows"][1]
    assert row["delta_vs_full"] == 0.0 and row["flips"] == {"gained": 5, "lost": 5, "n": 40}
    low, high = row["delta_ci"]
    assert low < 0 < high and high - low > 10  # 10 of 40 questions differ: far from a sure zero
    assert "| +0.00 | [" in ablation_table(list(runs.values())) and "| +5 / −5 |" in ablation_table(list(runs.values()))


def test_paired_bootstrap_is_exact_at_the_extremes_and_refuses_unpaired_runs():
    from cbr2.evaluation.metrics import paired_difference

    same = paired_difference([True, False] * 10, [True, False] * 10)
    assert (same["delta"], same["low"], same["high"], same["a_only"], same["b_only"]) == (0.0, 0.0, 0.0, 0, 0)
    better = paired_difference([True] * 20, [False] * 20)
    assert (better["delta"], better["low"], better["high"], better["a_only"]) == (1.0, 1.0, 1.0, 20)
    with pytest.raises(ValueError, match="same questions"):
        paired_difference([True], [True, False])
    one = paired_difference([True], [False])  # one question: nothing to resample but itself
    assert (one["delta"], one["low"], one["high"]) == (1.0, 1.0, 1.0)


@pytest.mark.parametrize("n, right_a, right_b", [(27, 0.41, 0.30), (270, 0.55, 0.52), (900, 0.60, 0.45)])
def test_paired_bootstrap_agrees_with_the_resampling_it_replaced(n, right_a, right_b):
    """scipy's paired bootstrap against the hand-written one it replaced, within that one's own
    seed-to-seed spread, on runs shaped like stored ones (the default 27 questions, 9 x 100)."""
    import numpy as np

    from cbr2.evaluation.metrics import paired_difference

    def replaced(a, b, seed):
        diff = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
        means = diff[np.random.default_rng(seed).integers(0, len(diff), size=(10_000, len(diff)))].mean(axis=1)
        return np.percentile(means, [2.5, 97.5])

    rng = np.random.default_rng(n)
    a = rng.random(n) < right_a
    b = np.where(rng.random(n) < 0.6, a, rng.random(n) < right_b)  # two runs agree on most questions
    old = np.array([replaced(a, b, seed) for seed in range(5)])
    noise = old.max(axis=0) - old.min(axis=0)
    new = paired_difference(a.tolist(), b.tolist())
    assert new["delta"] == pytest.approx(a.mean() - b.mean())
    assert abs(new["low"] - old[0, 0]) <= noise[0] + 1e-12 and abs(new["high"] - old[0, 1]) <= noise[1] + 1e-12
    assert paired_difference(a.tolist(), b.tolist()) == new  # seeded: the same interval every time


def test_a_run_scored_with_an_earlier_answer_comparison_is_noted(tmp_path):
    cats = {c: (0.5, 10) for c in KQAPRO_CATEGORIES}
    runs = [load_run(write_run(tmp_path, "full", cats, ablation="full")),
            load_run(write_run(tmp_path, "old", cats, ablation="chain", comparison=None))]
    notes = table_data(runs)["notes"]
    assert len(notes) == 1 and "Chain" in notes[0] and ANSWER_COMPARISON in notes[0]


def test_reasoning_types_are_tabulated_and_drawn_in_the_figure_5_layout(tmp_path):
    cats = {c: (0.5, 10) for c in KQAPRO_CATEGORIES}
    full = write_run(tmp_path, "full", cats, ablation="full", per_type={"Multi-hop": (0.6, 50), "Zero-shot": (0.1, 5)})
    chain = write_run(tmp_path, "chain", cats, ablation="chain", per_type={"Multi-hop": (0.4, 50)})
    data = table_data([load_run(full), load_run(chain)])
    assert data["reasoning_types"] == ["Multi-hop", "Zero-shot"]
    assert data["rows"][1]["per_reasoning_type"] == {"Multi-hop": 40.0, "Zero-shot": None}
    out = tmp_path / "report"
    assert main([str(full), str(chain), "--out", str(out)]) == 0
    markdown = (out / "ablation.md").read_text()
    assert "| Setting | Overall | Multi-hop | Zero-shot |" in markdown
    assert (out / "reasoning_types.png").stat().st_size > 0
    metaqa = write_run(tmp_path, "m", {"1-hop": (1.0, 3)}, ablation="full", benchmark="metaqa")
    assert main([str(metaqa), "--out", str(tmp_path / "m-report")]) == 0
    assert not (tmp_path / "m-report" / "reasoning_types.png").exists()


def test_runs_of_several_models_make_a_model_size_ladder(tmp_path):
    from cbr2.llm.packaged import parameters_b
    from cbr2.report.compare import ladder_data, render_ladder

    cats = lambda h: {c: (h, 10) for c in KQAPRO_CATEGORIES}
    dirs = [write_run(tmp_path, f"{m}-{a}", cats(h), ablation=a, model=m)
            for m, a, h in [("qwen2.5-coder-1.5b", "full", 0.6), ("qwen2.5-coder-1.5b", "w/o_knowledge", 0.5),
                            ("smollm2-135m", "full", 0.2), ("smollm2-135m", "w/o_knowledge", 0.3)]]
    ladder = ladder_data(table_data([load_run(d) for d in dirs]))
    assert [m["model"] for m in ladder["models"]] == ["smollm2-135m", "qwen2.5-coder-1.5b"]  # by size
    assert parameters_b("Qwen/Qwen3-8B") == 8.0 and ladder["models"][0]["params_b"] == 0.135
    wo = ladder["cells"]["-w/o knowledge"]
    assert (wo["smollm2-135m"]["delta"], wo["qwen2.5-coder-1.5b"]["delta"]) == (10.0, -10.0)
    low, high = wo["smollm2-135m"]["ci"]
    assert low < 30.0 < high and wo["smollm2-135m"]["n"] == 90
    assert "| -w/o knowledge | 30.00 (+10.00) | 50.00 (-10.00) |" in render_ladder(ladder)
    out = tmp_path / "report"
    assert main([*map(str, dirs), "--out", str(out)]) == 0
    assert (out / "ladder.png").stat().st_size > 0 and json.loads((out / "ladder.json").read_text()) == ladder
    assert ladder_data(table_data([load_run(d) for d in dirs[:2]])) is None  # one model: no ladder
    # llm.model unset on llama.cpp is the packaged default, placed by its size.
    default = write_run(tmp_path, "default-full", cats(0.4), ablation="full", model=None, backend="llamacpp")
    ladder = ladder_data(table_data([load_run(d) for d in [*dirs, default]]))
    assert [m["model"] for m in ladder["models"]] == ["smollm2-135m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"]
    assert ladder["models"][1]["params_b"] == 0.49


def test_paired_bootstrap_in_batches_is_bounded_and_exact():
    """Resampled a batch at a time: the interval of one unbatched scipy call, digit for digit, in
    memory that does not grow with the resamples (full validation: 11,797 questions)."""
    import tracemalloc

    import numpy as np
    from scipy.stats import bootstrap

    from cbr2.evaluation.metrics import paired_difference

    rng = np.random.default_rng(1)
    a, b = rng.random(4001) < 0.6, rng.random(4001) < 0.55  # 1,000 resamples a batch: several batches
    whole = bootstrap((a.astype(float), b.astype(float)), lambda x, y, axis: np.mean(x - y, axis=axis), paired=True,
                      vectorized=True, n_resamples=3000, confidence_level=0.95, method="percentile",
                      random_state=np.random.default_rng(7))
    batched = paired_difference(a.tolist(), b.tolist(), resamples=3000, seed=7)
    assert (batched["low"], batched["high"]) == (whole.confidence_interval.low, whole.confidence_interval.high)
    a, b = rng.random(11_797) < 0.6, rng.random(11_797) < 0.55
    tracemalloc.start()
    try:
        paired_difference(a.tolist(), b.tolist(), resamples=3000)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 150 * 2**20  # one batch of 3,000 resamples would hold ~280 MB of indices alone
