"""What a user reads: config errors in the project's words and runs labelled by what they ran."""

from __future__ import annotations

import sys

import pytest

from cbr2.config import CONFIG_DIR, ConfigError, ablation, load_config, setting_of

DEFAULTS = [CONFIG_DIR / "evaluate.yaml"]


@pytest.mark.parametrize("override, message", [
    ("eval.per_categry=3", "unknown key 'eval.per_categry' (did you mean eval.per_category"),
    ("retrieval.k_fact=3", "unknown key 'retrieval.k_fact' (did you mean retrieval.k_facts"),
    ("eval.zzz=1", "unknown key 'eval.zzz'; the keys of eval are eval.limit, "),
    ("zzz.k=1", "unknown key 'zzz'; keys start with one of cache_dir, data, eval, generation"),
    ("eval.per_category=three", "eval.per_category takes null or an integer, not 'three'"),
    ("generation.constrained=maybe", "generation.constrained takes true or false, not 'maybe'"),
    ("eval.timeout_s=abc", "eval.timeout_s takes a number, not 'abc'"),
    ("eval=3", "that is a group of keys, not a value"),
    ("eval.executor=kop", "unknown eval.executor 'kop' (did you mean kopl?); expected one of cbr2, kopl"),
    ("wandb.mode=onlin", "unknown wandb.mode 'onlin' (did you mean online"),
])
def test_config_errors_suggest_the_fix_in_the_projects_words(override, message):
    with pytest.raises(ConfigError) as err:
        load_config([override], DEFAULTS)
    text = str(err.value)
    assert message in text, text
    assert "reference_type" not in text and "object_type" not in text  # no OmegaConf internals
    assert len(text) < 400  # a suggestion, not all 56 keys


@pytest.mark.parametrize("overrides, files, setting", [
    ([], [], "w/o_knowledge"),  # the CPU default recalls no knowledge
    ([], ["full"], "full"),
    (["llm.model=smollm2-135m", "retrieval.k_ontology=10", "retrieval.k_facts=3"], [], "full"),  # other knobs
    (["retrieval.k_ontology=10"], [], "w/o_act"),  # an override is the same setting as the files
    ([], ["w/o_act"], "w/o_act"),
    (["retrieval.k_facts=0"], ["full"], "w/o_act"),
    ([], ["wo_knowledge"], "w/o_knowledge"),  # the file spelling is accepted too
    ([], ["chain"], "chain"),
    ([], ["random_case"], "random_case"),
    (["prompt.format=chain", "retrieval.k_facts=0"], ["full"], None),  # two changes: no Table 5 row
    (["prompt.format=chain"], [], None),  # the chain form without knowledge: no row either
])
def test_a_run_is_labelled_by_the_setting_its_configuration_is_in(overrides, files, setting):
    # The setting's files as plain layers (full.yaml, then its delta): labelling reads values only.
    cfg = load_config(overrides, DEFAULTS + [f for name in files for f in dict.fromkeys([ablation("full").file,
                                                                                          ablation(name).file])])
    assert setting_of(cfg) == setting


def test_the_paper_config_is_the_full_method_too():
    assert setting_of(load_config([], DEFAULTS + [CONFIG_DIR / "paper.yaml"])) == "full"


def test_report_labels_a_default_run_full(tmp_path):
    import json

    from cbr2.report.compare import load_run, table_data

    run = tmp_path / "llamacpp"
    run.mkdir()
    metrics = {"hits@1": 0.5, "ser": 0.0, "n": 2, "per_category": {"Count": {"hits@1": 0.5, "n": 2}},
               "provenance": {"ablation": None, "setting": "full", "config": {"data": {"name": "mini-kqapro"}}}}
    (run / "metrics.json").write_text(json.dumps(metrics))
    assert [r["setting"] for r in table_data([load_run(run)])["rows"]] == ["Full CBR²"]


class _Clock:
    """tqdm's clock, moved by hand."""

    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def _progress_lines(caplog, monkeypatch, steps, total=4, **kwargs):
    """The lines ``progress`` logs off a terminal when an update comes at each time of ``steps``."""
    import logging

    from cbr2.common.console import progress

    clock = _Clock()
    monkeypatch.setattr("tqdm.std.time", clock)
    # pytest's stderr is no terminal
    with caplog.at_level(logging.INFO, logger="cbr2.progress"), \
            progress(total=total, desc="generate", unit="q", **kwargs) as bar:
        for t in steps:
            clock.now = 1000.0 + t
            bar.update()
    return [r.getMessage() for r in caplog.records if r.name == "cbr2.progress"]


def test_progress_off_a_terminal_is_a_line_every_30_s_with_the_time_left(caplog, monkeypatch):
    from cbr2.common.console import LINE_EVERY_S

    assert LINE_EVERY_S == 30
    lines = _progress_lines(caplog, monkeypatch, steps=[10, 20, 31, 40, 45, 62], total=10)
    # One line at the start, one at each update 30 s or more after the last line, one at the end.
    assert [ln.split(" · ")[0] for ln in lines] == ["generate 0/10 (0%)", "generate 3/10 (30%)",
                                                    "generate 6/10 (60%)", "generate 6/10 (60%)"]
    assert lines[1] == "generate 3/10 (30%) · 10.33s/q · 00:31 elapsed · about 01:12 left"
    assert lines[2] == "generate 6/10 (60%) · 10.33s/q · 01:02 elapsed · about 00:41 left"


def test_progress_rates_count_only_what_this_process_did(caplog, monkeypatch):
    lines = _progress_lines(caplog, monkeypatch, steps=[30, 60], total=10, initial=6)
    assert lines[1] == "generate 7/10 (70%) · 30.00s/q · 00:30 elapsed · about 01:30 left"


def test_a_display_inside_another_logs_plain_lines(caplog):
    import logging

    from cbr2.common.console import progress

    # pytest's stderr is no terminal: the logged lines, as in a Slurm job's log
    with caplog.at_level(logging.INFO, logger="cbr2.progress"), progress(total=2, desc="retrieve", unit="q") as outer:
        with progress(total=3, desc="encoding", unit="text") as inner:
            inner.update(3)
        outer.update(2)
    lines = [r.getMessage() for r in caplog.records if r.name == "cbr2.progress"]
    assert any(ln.startswith("encoding 3/3") for ln in lines) and any(ln.startswith("retrieve 2/2") for ln in lines)
    assert all("\x1b" not in ln and ln.strip() for ln in lines), lines


def test_progress_on_a_terminal_is_a_tqdm_bar(monkeypatch, caplog):
    import io
    import sys

    from cbr2.common.console import progress

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    with progress(total=3, desc="generate", unit="q") as bar:
        bar.update(3)
    assert "generate: 100%|" in terminal.getvalue() and "3/3" in terminal.getvalue()
    assert not [r for r in caplog.records if r.name == "cbr2.progress"]


def test_training_progress_numbers_epochs_from_one(caplog, monkeypatch):
    import logging
    from types import SimpleNamespace

    from cbr2.structural.train import LineProgress

    class Module:
        def parameters(self):
            import torch
            return [torch.nn.Parameter(torch.zeros(10))]

    monkeypatch.setattr("cbr2.common.console.LINE_EVERY_S", 0)
    trainer = SimpleNamespace(is_global_zero=True, estimated_stepping_batches=8, global_step=0, max_epochs=2,
                              current_epoch=0, callback_metrics={}, sanity_checking=False)
    callback = LineProgress()
    with caplog.at_level(logging.INFO, logger="cbr2.structural.train"):
        callback.on_train_start(trainer, Module())
        trainer.global_step, trainer.current_epoch, trainer.callback_metrics = 5, 1, {"train/loss": 0.25}
        callback.on_train_batch_end(trainer, Module(), None, None, 0)
    line = caplog.records[-1].getMessage()
    assert line.startswith("train 5/8 (62%)") and "epoch 2/2" in line and "loss 0.2500" in line and "left" in line


@pytest.mark.slow
def test_one_logging_setup_prints_lightning_once_and_drops_its_noise():
    import subprocess
    import sys

    code = (
        "import logging, lightning\n"  # Lightning imported first, as train.py does
        "from cbr2.common.console import setup_logging\n"
        "setup_logging()\n"
        "rz = logging.getLogger('lightning.pytorch.utilities.rank_zero')\n"
        "rz.info('hello once'); rz.info('GPU available: False, used: False'); rz.info('GPU available: True')\n"
        "rz.info('💡 Tip: try installing litlogger')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert proc.stderr.count("hello once") == 1
    assert "GPU available: True" in proc.stderr
    assert "GPU available: False" not in proc.stderr and "Tip" not in proc.stderr


@pytest.mark.slow  # a fresh interpreter that imports Lightning and torch
def test_lightning_imported_after_the_setup_prints_once_too():
    import subprocess
    import sys

    code = (
        "import logging\n"
        "from cbr2.common.console import setup_logging\n"
        "setup_logging()\n"
        "import cbr2.structural.train\n"  # on-demand training imports Lightning inside an evaluation
        "logging.getLogger('lightning.pytorch.utilities.rank_zero').info('fit stopped')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    assert proc.stderr.count("fit stopped") == 1, proc.stderr


def test_the_log_goes_to_stderr_as_it_is_when_a_message_is_logged(monkeypatch):
    import io
    import logging as std_logging

    from cbr2.common.console import setup_logging

    first, second = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stderr", first)
    setup_logging()
    monkeypatch.setattr(sys, "stderr", second)  # a server's, a notebook's, a capturing caller's
    first.close()  # the old stream is gone: writing to it would raise
    std_logging.getLogger("cbr2.test").info("where does this go")
    assert "where does this go" in second.getvalue()
