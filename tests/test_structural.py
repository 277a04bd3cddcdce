"""The structural retriever: labels, pair sampling, the data cut, the loss, exports and ``train.py``."""

import json
import logging
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from cbr2.config import CONFIG_DIR, ConfigError, TrainConfig, load_config
from cbr2.data.benchmarks import EMBEDDED_ROOT, Benchmark
from cbr2.kopl.sketch import sketch
from cbr2.retrieval.index import build_index, search
from cbr2.structural.checkpoints import META_FILE, find_checkpoint
from cbr2.structural.data import PairDataModule, PairStream, QuestionSet, ResumableLoader, collate_pairs, split_holdout
from cbr2.structural.labels import LABELS, PairSampler, SketchTable, lcs, seqmatch

ROOT = Path(__file__).resolve().parents[1]
ONE_HOP = ("Find", "Relate", "QueryName")
TWO_HOP = ("Find", "Relate", "Relate", "QueryName")


@pytest.fixture(scope="module")
def kqapro_train():
    return Benchmark("mini-kqapro").questions("train")


@pytest.fixture(scope="module")
def tiny_root(tmp_path_factory):
    """A KQA Pro folder whose training split is mini-kqapro's first 120 questions: validation stays cheap."""
    root = tmp_path_factory.mktemp("tiny-kqapro")
    items = json.loads((EMBEDDED_ROOT / "mini-kqapro" / "train.json").read_text(encoding="utf-8"))[:120]
    (root / "train.json").write_text(json.dumps(items), encoding="utf-8")
    (root / "kb.json").symlink_to(EMBEDDED_ROOT / "mini-kqapro" / "kb.json")
    return root


# ------------------------------------------------------------------------------ labels

def test_label_values():
    assert seqmatch(ONE_HOP, TWO_HOP) == pytest.approx(2 * 3 / 7)  # 2·matches / total length
    assert lcs(ONE_HOP, TWO_HOP) == pytest.approx(3 / 4)  # LCS / longer length
    assert seqmatch(("A", "B"), ("B", "A")) == pytest.approx(0.5)  # order matters
    # difflib's greedy matching finds 4 of these in one argument order and 5 in the other: take the better.
    a = ("FindAll", "FilterStr", "FilterConcept", "Find", "Relate", "FilterConcept", "And", "FindAll", "FilterYear",
         "FilterConcept", "QueryRelation")
    b = ("FindAll", "FilterStr", "FilterConcept", "FindAll", "FilterStr", "FilterConcept", "SelectBetween")
    assert seqmatch(a, b) == seqmatch(b, a) == pytest.approx(2 * 5 / 18)
    for fn in LABELS.values():
        assert fn(TWO_HOP, TWO_HOP) == 1.0
        assert fn(("Find", "QueryAttr"), ("FindAll", "Count")) == 0.0


def test_label_computed_once_per_distinct_sketch_pair(monkeypatch):
    calls = []

    def counting(a, b):
        calls.append(frozenset([a, b]) if a != b else frozenset([a]))
        return seqmatch(a, b)

    monkeypatch.setitem(LABELS, "seqmatch", counting)
    sketches = [ONE_HOP, TWO_HOP, ONE_HOP, ("Find", "QueryAttr"), TWO_HOP, ONE_HOP]
    table = SketchTable(sketches, "seqmatch")
    assert len(table) == 3 and not calls  # labels are computed for drawn pairs, not for every pair
    pairs = PairSampler(table, bins=5).sample(np.random.default_rng(0), 200)
    # 3 cross pairs and the self-pairs of the two sketches with two questions, each computed once
    assert len(calls) == len(set(calls)) == 5
    i, j = table.of_question[0], table.of_question[1]
    assert table.label(i, j) == table.label(j, i) == pytest.approx(6 / 7)
    assert all(y == seqmatch(sketches[a], sketches[b]) for a, b, y in pairs)
    assert [list(m) for m in table.members] == [[0, 2, 5], [1, 4], [3]]


def _random_sketches(n, rng, functions=None):
    """``n`` distinct random sketches of 2-15 functions."""
    functions = functions or ["Find", "FindAll", "Relate", "FilterConcept", "FilterStr", "FilterNum", "And", "Or",
                              "QueryName", "QueryAttr", "Count", "SelectBetween", "VerifyStr", "QFilterYear"]
    out = set()
    while len(out) < n:
        out.add(tuple(rng.choice(functions, size=rng.integers(2, 16))))
    return sorted(out)


def test_bin_scores_bound_seqmatch_and_equal_lcs(kqapro_train):
    """The bins' scores: ``lcs`` exactly, and for ``seqmatch`` an upper bound within the stated error."""
    distinct = sorted({sketch(q.program) for q in kqapro_train})
    rng = np.random.default_rng(0)
    random = _random_sketches(300, rng)
    for pool in (distinct, random):
        exact = SketchTable(pool, "lcs")
        scores = exact.bin_scores(slice(0, len(pool)), 0)
        assert all(scores[i, j] == lcs(pool[i], pool[j]) for i, j in rng.integers(len(pool), size=(2000, 2)))
        bound = SketchTable(pool, "seqmatch").bin_scores(slice(0, len(pool)), 0)
        iu = np.triu_indices(len(pool))
        labels = np.array([seqmatch(pool[i], pool[j]) for i, j in zip(*iu, strict=True)])
        error = bound[iu] - labels
        assert error.min() >= 0  # never below difflib's ratio
        bins_apart = np.minimum((bound[iu] * 5).astype(int), 4) != np.minimum((labels * 5).astype(int), 4)
        if pool is distinct:  # what BIN_SCORERS states for mini-kqapro
            assert error.mean() < 0.003 and error.max() < 0.25 and bins_apart.mean() < 0.01
            assert np.mean(error == 0) > 0.98  # the same float where difflib finds a longest match
        else:  # long random sketches are harder for difflib's greedy matching
            assert error.mean() < 0.03 and bins_apart.mean() < 0.1


def test_sampler_finds_the_kth_pair_of_every_bin(kqapro_train):
    """Counts and the scored row find exactly the pair a full enumeration has in that place."""
    sketches = [sketch(q.program) for q in kqapro_train[:400]]
    for label in LABELS:
        table = SketchTable(sketches, label)
        sampler = PairSampler(table, bins=5)
        scores = table.bin_scores(slice(0, len(table)), 0)
        self_ok = [len(m) >= 2 for m in table.members]
        enumerated = {b: [] for b in range(5)}
        for i in range(len(table)):
            for j in range(i, len(table)):
                if i != j or self_ok[i]:
                    enumerated[min(int(scores[i, j] * 5), 4)].append((i, j))
        assert [len(enumerated[b]) for b in range(5)] == list(sampler.sizes)
        bins = np.repeat(sampler.nonempty, 30)
        ks = np.random.default_rng(0).integers(sampler.sizes[bins])
        found = sampler._pairs(bins, ks)
        assert [tuple(p) for p in found.tolist()] == [enumerated[b][k] for b, k in zip(bins, ks, strict=True)]


@pytest.mark.slow  # about 20 s: 2·10⁸ sketch pairs scored
def test_label_stage_at_20000_distinct_sketches_is_linear_in_memory():
    """Counting 20,000 distinct sketches' pairs (2·10⁸) holds nothing of their square."""
    import tracemalloc

    n = 20_000
    sketches = _random_sketches(n, np.random.default_rng(1))
    tracemalloc.start()
    try:
        table = SketchTable(sketches, "seqmatch")
        sampler = PairSampler(table, bins=5)
        pairs = sampler.sample(np.random.default_rng(0), 200)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert sampler.sizes.sum() == n * (n - 1) // 2  # every pair counted (no sketch has two questions)
    assert peak < 200 * 2**20  # a float64 label matrix alone would be 3.2 GB
    kept = sum(a.nbytes for a in vars(sampler).values() if isinstance(a, np.ndarray))
    assert kept <= 2 * n * 5 * 8 + 2 * n  # per-sketch counts only
    assert len(table._labels) <= 200 and all(0 <= y <= 1 for _, _, y in pairs)


def test_sampler_covers_every_label_bin_evenly(kqapro_train):
    sketches = [sketch(q.program) for q in kqapro_train]
    sampler = PairSampler(SketchTable(sketches, "seqmatch"), bins=5)
    pairs = sampler.sample(np.random.default_rng(0), 5000)
    shares = Counter(min(int(y * 5), 4) for _, _, y in pairs)
    assert all(0.15 < shares[b] / 5000 < 0.25 for b in range(5)), shares
    for a, b, y in pairs[:500]:
        assert a != b and y == pytest.approx(seqmatch(sketches[a], sketches[b]))
    # Uniform question pairs would be mostly dissimilar: that is what binning corrects.
    rng = np.random.default_rng(0)
    uniform = [seqmatch(sketches[a], sketches[b]) for a, b in rng.integers(len(sketches), size=(2000, 2))]
    assert np.mean(np.array(uniform) < 0.4) > 0.4


def test_sampler_is_deterministic_by_seed():
    sketches = [ONE_HOP, TWO_HOP, ONE_HOP, ("Find", "QueryAttr"), TWO_HOP, ONE_HOP]
    sampler = PairSampler(SketchTable(sketches), bins=5)

    def draw(seed):
        return sampler.sample(np.random.default_rng(seed), 50)

    assert draw(1) == draw(1) and draw(1) != draw(2)


def test_ddp_ranks_and_epochs_draw_different_pairs(kqapro_train):
    pool = QuestionSet.of(kqapro_train[:300])
    stream = PairStream(pool, PairSampler(SketchTable(pool.sketches)), pairs_per_epoch=64, seed=0)
    rank0, rank1 = stream.pairs(0, rank=0, world=2), stream.pairs(0, rank=1, world=2)
    assert len(rank0) == len(rank1) == 32 and rank0 != rank1
    assert stream.pairs(0) == stream.pairs(0) != stream.pairs(1)  # a new draw each epoch, reproducibly
    assert len(stream.pairs(0, worker=0, workers=3)) + len(stream.pairs(0, worker=2, workers=3)) == 43
    assert len(list(stream)) == len(stream) == 64


def test_the_training_loader_resumes_inside_an_epoch(kqapro_train):
    pool = QuestionSet.of(kqapro_train[:300])

    def loader(epoch=0):
        stream = PairStream(pool, PairSampler(SketchTable(pool.sketches)), pairs_per_epoch=40, seed=0,
                            epoch_fn=lambda: epoch)
        return ResumableLoader(stream, lambda: (epoch, 3), batch_size=8, collate_fn=collate_pairs)

    first = loader()
    whole = [a for a, _, _ in first]
    assert len(whole) == 5
    state = first.state_dict()  # what Lightning saves: 3 batches of epoch 0 were completed
    assert state == {"epoch": 0, "batches": 3}
    resumed = loader()
    resumed.load_state_dict(state)
    assert [a for a, _, _ in resumed] == whole[3:]  # the rest of the epoch, not its start again
    assert [a for a, _, _ in resumed] == whole  # only the resumed pass skips
    later = loader(epoch=1)
    later.load_state_dict(state)  # a state of an earlier epoch skips nothing
    assert len([a for a, _, _ in later]) == 5


# -------------------------------------------------------------------------- data cut

def test_holdout_split_is_disjoint_and_deterministic(kqapro_train):
    fit, held = split_holdout(kqapro_train, 0.1)
    assert {q.qid for q in fit}.isdisjoint(q.qid for q in held)
    assert len(fit) + len(held) == len(kqapro_train) and 0.07 < len(held) / len(kqapro_train) < 0.13
    assert split_holdout(kqapro_train, 0.1) == (fit, held)
    assert {q.qid for q in held} <= {q.qid for q in split_holdout(kqapro_train, 0.2)[1]}  # by id hash only


def test_pairs_never_cross_the_cut(tiny_root):
    dm = PairDataModule("kqapro", str(tiny_root), pairs_per_epoch=40, val_pairs=20, holdout=0.25, batch_size=8)
    dm.setup("fit")
    fit, held = set(dm.fit_pool.texts), set(dm.heldout.texts)
    val = [b for b in dm.val_dataloader()]
    assert sum(len(labels) for _, _, labels in val) == 20
    assert all(t in held for a, b, _ in val for t in a + b)
    texts_a, texts_b, labels = next(iter(dm.train_dataloader()))
    assert len(texts_a) == len(texts_b) == 8 and labels.dtype == torch.float32
    assert all(t in fit for t in texts_a + texts_b)


def test_sketch_hit_sets_are_bounded_by_id_hash(tiny_root):
    dm = PairDataModule("kqapro", str(tiny_root), pairs_per_epoch=40, val_pairs=20, holdout=0.25, batch_size=8,
                        hit_queries=10, hit_pool=30)
    dm.setup("fit")
    assert (len(dm.hit_queries), len(dm.hit_pool)) == (10, 30)
    assert set(dm.hit_queries.qids) <= set(dm.heldout.qids) and set(dm.hit_pool.qids) <= set(dm.fit_pool.qids)
    assert dm.fit_pool.first_by_hash(30) == dm.hit_pool  # by id only: the same in every run and seed
    assert set(dm.fit_pool.first_by_hash(20).qids) < set(dm.hit_pool.qids)  # a smaller cap keeps a subset
    whole = dm.fit_pool.first_by_hash(len(dm.fit_pool))
    assert whole is dm.fit_pool
    where = {qid: i for i, qid in enumerate(dm.fit_pool.qids)}
    assert all((text, sk) == (dm.fit_pool.texts[where[qid]], dm.fit_pool.sketches[where[qid]])
               for qid, text, sk in zip(*vars(dm.hit_pool).values(), strict=True))  # rows stay together
    with pytest.raises(ConfigError, match="sketch_hit_pool"):
        PairDataModule("kqapro", str(tiny_root), hit_pool=0)


# ------------------------------------------------------------------------------ model

def _training_loss(emb_a, emb_b, labels):
    """The loss ``training_step`` returns for a batch whose pairs embed as given."""
    from types import SimpleNamespace

    from cbr2.structural.module import StructuralRetriever

    fake = SimpleNamespace(_embed_pairs=lambda a, b: (emb_a, emb_b), log=lambda *args, **kwargs: None, train_pairs=0)
    return StructuralRetriever.training_step(fake, (["a"] * len(labels), ["b"] * len(labels), labels), 0)


def test_the_loss_on_hand_made_embeddings():
    emb_a = torch.tensor([[1.0, 0.0], [3.0, 0.0]])
    emb_b = torch.tensor([[0.0, 2.0], [1.0, 0.0]])  # cosines 0 and 1, whatever the norms
    loss = _training_loss(emb_a, emb_b, torch.tensor([0.5, 0.25]))
    assert loss.item() == pytest.approx(((0 - 0.5) ** 2 + (1 - 0.25) ** 2) / 2)


def test_the_loss_is_sentence_transformers_cosine_similarity_loss():
    try:
        from sentence_transformers.sentence_transformer.losses import CosineSimilarityLoss
    except ImportError:  # sentence-transformers < 6
        from sentence_transformers.losses import CosineSimilarityLoss

    reference = CosineSimilarityLoss(model=torch.nn.Identity())  # the model only embeds, which is done here
    generator = torch.Generator().manual_seed(0)
    for batch, dim in [(1, 4), (16, 384), (33, 8)]:
        emb_a, emb_b = torch.randn(batch, dim, generator=generator), torch.randn(batch, dim, generator=generator)
        labels = torch.rand(batch, generator=generator)
        emb_b[0] = 2.5 * emb_a[0]  # a cosine of exactly 1 among them
        assert _training_loss(emb_a, emb_b, labels).item() == pytest.approx(
            reference.compute_loss_from_embeddings([emb_a, emb_b], labels).item(), rel=1e-6)


@pytest.mark.parametrize("total, ratio", [(1, 0.1), (7, 0.1), (10, 0.1), (25, 0.3), (160, 0.1), (40, 0.0)])
def test_the_schedule_is_the_warm_up_and_decay_it_replaced_step_by_step(total, ratio):
    """transformers' linear schedule, counted from one step in, gives the learning rate the
    project's own LambdaLR gave at every step: warm-up from lr/(warmup+1), then decay to 0."""
    from types import SimpleNamespace

    from cbr2.structural.module import StructuralRetriever

    def replaced(step, warmup):
        return (step + 1) / (warmup + 1) if step < warmup else max(0.0, (total - step) / max(1, total - warmup))

    weight = torch.nn.Parameter(torch.zeros(2))
    fake = SimpleNamespace(trainer=SimpleNamespace(estimated_stepping_batches=total),
                           hparams=SimpleNamespace(lr=1e-4, warmup_ratio=ratio), parameters=lambda: [weight])
    setup = StructuralRetriever.configure_optimizers(fake)  # only reads trainer, hparams and parameters
    optimizer, scheduler = setup["optimizer"], setup["lr_scheduler"]["scheduler"]
    seen = []
    for _ in range(total + 2):
        seen.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    warmup = int(total * ratio)
    assert seen == pytest.approx([1e-4 * replaced(step, warmup) for step in range(total + 2)], rel=1e-12, abs=1e-18)
    assert seen[0] > 0 and seen[total] == 0.0


def test_validation_ranking_orders_by_inner_product():
    pool = np.eye(3, dtype=np.float32)
    queries = np.array([[0.1, 0.9, 0.5], [1.0, 0.0, 0.2]], dtype=np.float32)
    assert search(build_index(pool, "flat"), queries, 2)[1].tolist() == [[1, 2], [0, 2]]


# -------------------------------------------------------------------------- exports

def _fake_export(root: Path, name: str, data: str, created: str) -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    (folder / META_FILE).write_text(json.dumps({"data": {"name": data}, "created": created}))
    return folder


def test_find_checkpoint_picks_newest_of_the_dataset(tmp_path, caplog):
    assert find_checkpoint(tmp_path / "missing", "mini-kqapro") is None
    _fake_export(tmp_path, "a", "mini-kqapro", "2025-01-01T00:00:00+00:00")
    newest = _fake_export(tmp_path, "b", "mini-kqapro", "2025-03-01T00:00:00+00:00")
    _fake_export(tmp_path, "c", "mini-metaqa", "2025-06-01T00:00:00+00:00")
    _fake_export(tmp_path, ".d-being-written", "mini-kqapro", "2025-07-01T00:00:00+00:00")
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / META_FILE).write_text("{not json")
    (tmp_path / "no-meta").mkdir()
    (tmp_path / ".gitkeep").touch()
    assert find_checkpoint(tmp_path, "mini-kqapro") == newest
    assert find_checkpoint(tmp_path, "mini-metaqa") == tmp_path / "c"
    assert find_checkpoint(tmp_path, "kqapro") is None
    assert "broken" in caplog.text and "no-meta" in caplog.text


# -------------------------------------------------------------------------- precision

def _train_cfg(*overrides):
    return load_config(list(overrides), files=[CONFIG_DIR / "train.yaml"], schema=TrainConfig)


def _gpus(monkeypatch, bf16: bool) -> None:
    """Make torch see CUDA GPUs that compute in bfloat16, or that only emulate it (a V100's, for which
    torch's default ``including_emulation=True`` says yes)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: bf16 or including_emulation)


def _run_id(cfg, precision=None):
    """The run id of ``cfg``, with ``trainer.precision`` replaced by ``precision`` (as ``train`` does) when given."""
    from cbr2.structural.train import run_id

    trainer = OmegaConf.merge(cfg.trainer, {"precision": precision}) if precision is not None else cfg.trainer
    return run_id(cfg.data, cfg.structural, cfg.seed, trainer)


def test_auto_precision_on_cpus_is_32_true_and_keeps_the_run_id(monkeypatch, caplog):
    from cbr2.structural.train import resolve_precision

    caplog.set_level(logging.INFO, logger="cbr2.structural.train")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cfg = _train_cfg()
    assert cfg.trainer.precision == "auto"  # the schema's default
    resolved = resolve_precision(cfg.trainer)
    assert resolved == "32-true" and cfg.trainer.precision == "auto"
    assert "precision 32-true (trainer.precision=auto: no CUDA GPU trains this run)" in caplog.text
    # 32-true was the default before auto: a run trained on CPUs then keeps its id, and resumes.
    assert _run_id(cfg, resolved) == _run_id(_train_cfg("trainer.precision=32-true"))
    _gpus(monkeypatch, bf16=True)
    assert resolve_precision(_train_cfg("trainer.accelerator=cpu").trainer) == "32-true"  # GPUs left unused


def test_auto_precision_on_cuda_gpus(monkeypatch):
    from cbr2.structural.train import resolve_precision

    _gpus(monkeypatch, bf16=True)
    for accelerator in ("auto", "gpu", "cuda"):
        assert resolve_precision(_train_cfg(f"trainer.accelerator={accelerator}").trainer) == "bf16-mixed"
    bf16 = resolve_precision(_train_cfg().trainer)
    _gpus(monkeypatch, bf16=False)
    fp16 = resolve_precision(_train_cfg().trainer)
    assert fp16 == "16-mixed"
    cfg = _train_cfg()
    assert len({_run_id(cfg, bf16), _run_id(cfg, fp16), _run_id(_train_cfg("trainer.precision=32-true"))}) == 3
    with pytest.raises(ConfigError, match="trainer.strategy=ddp_fork"):  # asking CUDA would stop the fork
        resolve_precision(_train_cfg("trainer.strategy=ddp_fork").trainer)


def test_an_explicit_precision_is_used_as_given(monkeypatch, caplog):
    from cbr2.structural.train import resolve_precision

    caplog.set_level(logging.INFO, logger="cbr2.structural.train")
    _gpus(monkeypatch, bf16=True)
    cfg = _train_cfg("trainer.precision=32-true")
    assert resolve_precision(cfg.trainer) == "32-true"
    assert "precision 32-true (trainer.precision as given)" in caplog.text
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for given in ("bf16-mixed", "16-mixed"):
        assert resolve_precision(_train_cfg(f"trainer.precision={given}").trainer) == given


# ---------------------------------------------------------------------------- train()

def _cfg(tiny_root, tmp_path, *extra):
    return load_config([
        "data.name=kqapro", f"data.root={tiny_root}", "structural.holdout=0.25", "structural.pairs_per_epoch=16",
        "structural.val_pairs=16", "structural.batch_size=8", "trainer.max_epochs=10", "trainer.max_steps=2",
        "trainer.accelerator=cpu",
        "trainer.devices=1", "trainer.enable_progress_bar=false", "trainer.enable_model_summary=false",
        "wandb.mode=disabled", f"output_dir={tmp_path / 'run'}", f"structural.checkpoints_dir={tmp_path / 'ckpt'}",
        *extra], files=[CONFIG_DIR / "train.yaml"], schema=TrainConfig)


@pytest.mark.slow
def test_train_exports_a_loadable_checkpoint_and_resumes(tiny_root, tmp_path):
    from sentence_transformers import SentenceTransformer

    from cbr2.structural.train import train

    result = train(_cfg(tiny_root, tmp_path))
    assert result["steps"] == 2 and result["resumed_from"] is None and result["pairs_per_s"] > 0
    path = Path(result["checkpoint"])
    assert path.parent == tmp_path / "ckpt" and find_checkpoint(tmp_path / "ckpt", "kqapro") == path
    assert SentenceTransformer(str(path), device="cpu").encode(["Which is taller?"]).shape == (1, 384)
    meta = json.loads((path / META_FILE).read_text())
    assert meta["data"] == {"name": "kqapro", "root": str(tiny_root)}
    for metrics in (meta["metrics"], meta["baseline"], result["best"]):
        assert {"val/mse", "val/spearman", "val/sketch_hit@1", "val/sketch_hit@5"} <= set(metrics)
    assert meta["metrics"] == result["best"] and meta["backbone"] and meta["created"]
    assert meta["config"]["trainer"]["precision"] == "32-true"  # what trainer.precision=auto trained in
    run = tmp_path / "run"
    assert "precision: 32-true" in (run / "config.yaml").read_text() and (run / "git.txt").is_file()
    assert "val/sketch_hit@5" in next(run.glob("logs/*/metrics.csv")).read_text()

    again = train(_cfg(tiny_root, tmp_path, "trainer.max_steps=4"))  # same folder: picks up where it stopped
    assert again["resumed_from"] == str(run / "checkpoints" / "last.ckpt")
    assert again["steps"] == 4 and again["baseline"] == result["baseline"]
    # Another budget is another run: it is exported beside the 2-step run's export, not over it.
    assert again["run_id"] != result["run_id"] and Path(again["checkpoint"]) != path and path.is_dir()
    assert find_checkpoint(tmp_path / "ckpt", "kqapro") == Path(again["checkpoint"])


@pytest.mark.slow
def test_train_with_offline_wandb(tiny_root, tmp_path, monkeypatch):
    from cbr2.structural.train import train

    for var in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "wandb-home"))
    result = train(_cfg(tiny_root, tmp_path, "wandb.mode=offline", "trainer.max_steps=1"))
    assert Path(result["checkpoint"]).is_dir()
    assert list((tmp_path / "run").rglob("offline-run-*")), "no offline W&B run written"


def test_unknown_trainer_key_is_a_config_error(tiny_root, tmp_path):
    from cbr2.structural.train import train

    with pytest.raises(ConfigError, match="trainer.max_stepz"):
        train(_cfg(tiny_root, tmp_path, "trainer.max_stepz=3"))
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_train_cli_rejects_unknown_key(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "train.py"), "structural.nope=1"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, check=False,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 2
    assert "error:" in proc.stderr and "structural.nope" in proc.stderr
    assert not any(tmp_path.iterdir())


def test_online_wandb_falls_back_to_offline_without_a_route(monkeypatch, caplog):
    from cbr2.common import tracking

    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")  # discard port: nothing listens
    assert tracking.wandb_mode("online", timeout_s=0.5) == "offline"
    assert "unreachable" in caplog.text
    assert tracking.wandb_mode("disabled") == "disabled"
    monkeypatch.setattr(tracking, "_reachable", lambda *a: True)
    assert tracking.wandb_mode("online") == "online"
