"""``python train.py``: fine-tune, validate and export the structural retriever.

A run's id hashes what determines its result (``data``, ``structural``, ``seed`` and the
``trainer`` settings that change the trained weights: step limits, precision ...), so the same
command reuses the same run folder and resumes from its newest checkpoint, while a run with
another budget gets a folder and an export of its own; where it runs (``trainer.devices``,
``num_nodes``, ``strategy`` ...) can change between attempts (``RUN_INDEPENDENT_TRAINER_KEYS``).
``trainer.precision=auto`` (the default) is resolved first, for the hardware the run trains on
(``resolve_precision``), so the id, the run's ``config.yaml`` and the export hold the precision
that trained.

Under SLURM (``slurm/train.sbatch``) Lightning's ``SLURMEnvironment`` does the distribution: one
DDP process per task, sized here from the allocation. Before the time limit SLURM sends SIGUSR1;
Lightning then saves ``hpc_ckpt_N.ckpt`` into the run folder and requeues the job, whose next
start resumes from that file.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.fabric.plugins.environments import SLURMEnvironment
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger, Logger
from omegaconf import DictConfig, OmegaConf

from cbr2.common import slurm
from cbr2.common.console import progress, route_library_loggers
from cbr2.common.devices import GPU_ACCELERATORS
from cbr2.common.provenance import git_hash
from cbr2.common.tracking import announce, wandb_mode
from cbr2.config import ConfigError, StructuralTrainConfig, TrainDataConfig, WandbConfig
from cbr2.data.benchmarks import structural_name
from cbr2.structural.checkpoints import export_checkpoint
from cbr2.structural.data import PairDataModule
from cbr2.structural.module import StructuralRetriever

log = logging.getLogger(__name__)
route_library_loggers()  # `import lightning` above gave its logger a handler of its own

MONITOR = "val/sketch_hit@5"
"""The metric that picks the best checkpoint."""
_RESERVED = ("logger", "callbacks", "default_root_dir")  # train() sets these Trainer arguments itself
_HPC_CKPT = re.compile(r"hpc_ckpt_(\d+)\.ckpt")
"""What Lightning names the checkpoint it saves on SLURM's requeue signal (in ``default_root_dir``)."""
PRECISION_AUTO = "auto"
"""The ``trainer.precision`` that ``resolve_precision`` replaces (Lightning has no such value)."""


RUN_INDEPENDENT_TRAINER_KEYS = frozenset({
    # Where and on how much hardware the run goes. A requeued SLURM job may land on another
    # allocation, and slurm_sizing() fills devices and num_nodes from it: the requeued attempt
    # must find its own run folder and resume, so these cannot change the id.
    "accelerator", "devices", "num_nodes", "strategy", "plugins",
    # What is logged or shown while training, not what is trained.
    "log_every_n_steps", "enable_progress_bar", "enable_model_summary", "profiler", "enable_autolog_hparams",
    "model_registry",
    # Checks and sanity passes that leave the weights alone.
    "detect_anomaly", "num_sanity_val_steps", "inference_mode",
    # Read by test() and predict(), which train() never calls.
    "limit_test_batches", "limit_predict_batches",
})
"""``trainer.*`` keys left out of the run id; every other one (step and epoch budgets,
precision, gradient clipping and accumulation, validation schedule ...) changes what is trained
or which checkpoint is exported, so it is part of the id."""


def run_id(data: TrainDataConfig, structural: StructuralTrainConfig, seed: int, trainer: DictConfig) -> str:
    """Ten hex digits of the SHA-256 of the resolved ``data``, ``structural``, ``seed`` and
    ``trainer`` (without ``RUN_INDEPENDENT_TRAINER_KEYS``).

    Runs that train differently (a 40-step run and a default one, say) get their own run folder
    and export; attempts of one run on other hardware share them, so a requeued job resumes.
    ``train`` hashes the precision ``resolve_precision`` chose: ``auto`` on CPUs hashes as
    ``32-true``, the default before ``auto``, so those runs keep their id and resume; an attempt
    on GPUs that train in another precision is another run.

    Args:
        data: The ``data`` section.
        structural: The ``structural`` section.
        seed: ``seed``.
        trainer: The ``trainer`` section.
    """
    identity = {"data": OmegaConf.to_container(data, resolve=True),
                "structural": OmegaConf.to_container(structural, resolve=True), "seed": seed}
    identity["trainer"] = {k: v for k, v in OmegaConf.to_container(trainer, resolve=True).items()
                           if k not in RUN_INDEPENDENT_TRAINER_KEYS}
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:10]


class LineProgress(Callback):
    """Training progress as ``cbr2.common.console.progress`` shows it: a bar on a terminal, and in a log
    file a line every 30 s with the step, the loss and the time left, while the run goes on.

    Replaces Lightning's bar (``trainer.enable_progress_bar``, off unless set), whose rich display
    reaches a log file only when training ends, and numbers epochs from 0 against
    ``max_epochs - 1`` (``Epoch 1/1`` for the second of two).
    """

    def __init__(self) -> None:
        self.bar: Any = None  # a tqdm, while training

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.is_global_zero:
            return
        total = trainer.estimated_stepping_batches
        total = int(total) if total != float("inf") else None
        params = sum(p.numel() for p in pl_module.parameters())
        trainable = sum(p.numel() for p in pl_module.parameters() if p.requires_grad)
        log.info("training %s: %.1f M parameters (%.1f M trainable), %s optimiser steps", type(pl_module).__name__,
                 params / 1e6, trainable / 1e6, total if total is not None else "an unknown number of")
        self.bar = progress(total=total, desc="train", unit="step", initial=trainer.global_step, logger=log)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if self.bar is None:
            return
        loss = trainer.callback_metrics.get("train/loss")
        epochs = f"/{trainer.max_epochs}" if trainer.max_epochs and trainer.max_epochs > 0 else ""
        self.bar.set_postfix_str(f"epoch {trainer.current_epoch + 1}{epochs}"
                                 + (f" · loss {float(loss):.4f}" if loss is not None else ""), refresh=False)
        self.bar.update(trainer.global_step - self.bar.n)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.bar is None or trainer.sanity_checking:
            return
        shown = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val/")}
        log.info("validation after step %d (epoch %d): %s", trainer.global_step, trainer.current_epoch + 1,
                 ", ".join(f"{k} {v:.4f}" for k, v in sorted(shown.items())) or "no metrics")

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def auto_precision(trainer: Mapping[str, Any]) -> tuple[str, str]:
    """The precision ``trainer.precision=auto`` trains in with these ``trainer.*`` settings on
    this machine, and why, in a few words.

    ``bf16-mixed`` when the run trains on CUDA GPUs (``trainer.accelerator`` ``auto``, ``gpu`` or
    ``cuda`` with CUDA visible) that compute in bfloat16, ``16-mixed`` on older CUDA GPUs, else
    ``32-true`` (CPUs, Apple's MPS).

    Raises:
        ConfigError: When the run would train on CUDA GPUs in processes forked from this one
            (``trainer.strategy=ddp_fork``, ``ddp_notebook``): asking CUDA about bfloat16 initialises
            it here, and Lightning cannot fork a process that has.
    """
    accelerator = str(trainer.get("accelerator", "auto")).lower()
    if accelerator not in ("auto", *GPU_ACCELERATORS) or not torch.cuda.is_available():
        return "32-true", "no CUDA GPU trains this run"
    strategy = str(trainer.get("strategy", ""))
    if "fork" in strategy or "notebook" in strategy:
        raise ConfigError(f"trainer.precision=auto asks CUDA about bfloat16, after which trainer.strategy={strategy} "
                          "cannot fork; set trainer.precision=bf16-mixed (A100, H100 ...), 16-mixed (V100, T4) or 32-true")
    # Without including_emulation=False torch also says yes where bfloat16 is only emulated, and
    # slow (compute capability 7.x: V100, T4).
    if torch.cuda.is_bf16_supported(including_emulation=False):
        return "bf16-mixed", "CUDA GPUs with bfloat16"
    # V100s and T4s have float16 tensor cores but no bfloat16: float16 autocast, with the loss
    # scaling Lightning's 16-mixed adds against float16's narrow range.
    return "16-mixed", "CUDA GPUs without bfloat16"


def resolve_precision(trainer: Mapping[str, Any]) -> Any:
    """The precision a run with these ``trainer.*`` settings trains in, logged in one line:
    ``trainer.precision`` as given, or for ``auto`` ``auto_precision``'s choice.

    Args:
        trainer: The ``trainer`` section.

    Returns:
        ``trainer.precision`` itself unless it is ``auto``; else what ``auto`` stands for here.

    Raises:
        ConfigError: As ``auto_precision``.
    """
    given = trainer.get("precision")
    if given != PRECISION_AUTO:
        log.info("precision %s (trainer.precision as given)", given)
        return given
    chosen, why = auto_precision(trainer)
    log.info("precision %s (trainer.precision=auto: %s)", chosen, why)
    return chosen


def _trainer_kwargs(trainer: DictConfig) -> dict[str, Any]:
    """``lightning.Trainer``'s keyword arguments from the ``trainer`` section, checked."""
    kwargs = OmegaConf.to_container(trainer, resolve=True)
    for key in _RESERVED:
        if key in kwargs:
            raise ConfigError(f"trainer.{key} is set by train.py and cannot be overridden")
    valid = set(inspect.signature(L.Trainer.__init__).parameters) - {"self", *_RESERVED}
    unknown = sorted(set(kwargs) - valid)
    if unknown:
        raise ConfigError(f"unknown trainer key(s) {', '.join(f'trainer.{k}' for k in unknown)}; "
                          f"valid keys are lightning.Trainer's arguments: {', '.join(sorted(valid))}")
    # LineProgress shows progress and the parameter count; Lightning's own bar and its model
    # table (which prints "Total FLOPs: 0" for a model it cannot trace) only where asked for.
    kwargs.setdefault("enable_progress_bar", False)
    kwargs.setdefault("enable_model_summary", False)
    return kwargs


def slurm_sizing(kwargs: dict[str, Any]) -> dict[str, Any]:
    """``lightning.Trainer`` arguments with ``devices`` and ``num_nodes`` taken from the SLURM job.

    In a job that Lightning manages (``SLURMEnvironment``: started with ``srun``, not named
    ``bash`` or ``interactive``), Lightning runs one DDP process per SLURM task and rejects a
    ``devices`` other than ``--ntasks-per-node`` or a ``num_nodes`` other than the job's node
    count. So ``devices: auto`` becomes the former and an unset ``num_nodes`` the latter; values
    given explicitly are kept (Lightning names a mismatch). Anywhere else nothing changes.

    Args:
        kwargs: The ``trainer.*`` keyword arguments.

    Returns:
        A new dict when something was filled in, else ``kwargs`` itself.
    """
    if not slurm.in_job():
        return kwargs
    if not SLURMEnvironment.detect():
        log.info("SLURM job not managed by Lightning (no srun, or an interactive job name): "
                 "trainer.devices and trainer.num_nodes stay as configured")
        return kwargs
    sized = dict(kwargs)
    tasks, nodes = slurm.tasks_per_node(), slurm.num_nodes()
    if sized.get("devices", "auto") == "auto" and tasks is not None:
        sized["devices"] = tasks
    if sized.get("num_nodes") is None and nodes is not None:
        sized["num_nodes"] = nodes
    log.info("SLURM job of %s node(s) x %s task(s) per node (visible GPUs: %s): trainer.num_nodes=%s, "
             "trainer.devices=%s", nodes, tasks, slurm.visible_gpus(), sized.get("num_nodes", 1),
             sized.get("devices", "auto"))
    return sized


def resume_checkpoint(run_dir: Path) -> Path | None:
    """The checkpoint a new attempt of the run in ``run_dir`` starts from, or None.

    Two kinds compete: ``checkpoints/last.ckpt`` (saved at validations and when fitting ends) and
    the ``hpc_ckpt_N.ckpt`` Lightning saves on SLURM's requeue signal (the highest N is its
    latest). The newer file holds the later state; an HPC file wins a tie (it was written on the
    job's way out). Passing the choice to ``fit`` replaces Lightning's own lookup, which under SLURM
    would load the HPC file even when ``last.ckpt`` is newer.
    """
    candidates: list[tuple[int, bool, Path]] = []  # (mtime, is HPC, path): max() is the newest
    last = run_dir / "checkpoints" / "last.ckpt"
    if last.is_file():
        candidates.append((last.stat().st_mtime_ns, False, last))
    numbered = [(int(m.group(1)), p) for p in run_dir.glob("hpc_ckpt_*.ckpt")
                if (m := _HPC_CKPT.fullmatch(p.name)) and p.is_file()]
    if numbered:
        hpc = max(numbered)[1]
        candidates.append((hpc.stat().st_mtime_ns, True, hpc))
    return max(candidates)[2] if candidates else None


def _validate_as_is(module: StructuralRetriever, dm: PairDataModule, kwargs: dict[str, Any], out: Path,
                    loggers: list[Logger] | bool) -> dict[str, float]:
    """Validation metrics of the module's weights as they are, from a Trainer of its own.

    In a SLURM job, ``Trainer.validate`` without ``ckpt_path`` first loads the newest
    ``hpc_ckpt_N.ckpt`` of the Trainer's ``default_root_dir``, the run folder for the training
    Trainer: the baseline would not be the untrained backbone, nor the validation after fitting
    the weights fitting ended with (a stale requeue state). Lightning asks
    ``SLURMEnvironment.detect()`` there whatever cluster environment the Trainer was given, so this
    Trainer's root is a folder that holds no requeue checkpoint (and is never created).
    """
    validator = L.Trainer(**{**kwargs, "enable_checkpointing": False}, logger=loggers, callbacks=[],
                          default_root_dir=out / "validation")
    validator.validate(module, datamodule=dm, verbose=False)
    return dict(module.val_metrics)


def _loggers(wandb: WandbConfig, data_name: str, config: dict[str, Any], out: Path, rid: str) -> list[Logger]:
    """The run's loggers (CSV, and W&B unless ``wandb.mode=disabled``), each given ``config`` as hyperparameters.

    Args:
        wandb: The ``wandb`` section.
        data_name: ``data.name`` (names the W&B run when ``wandb.name`` is unset).
        config: The resolved configuration, as plain data.
        out: The run folder.
        rid: The run id.
    """
    loggers: list[Logger] = [CSVLogger(out, name="logs")]
    try:
        mode = wandb_mode(wandb.mode)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    if mode != "disabled":
        from lightning.pytorch.loggers import WandbLogger  # imports wandb

        name = wandb.name or f"structural-{data_name}-{rid}"
        wandb_logger = WandbLogger(name=name, save_dir=str(out), mode=mode,
                                   project=wandb.project, entity=wandb.entity, group=wandb.group)
        # Lightning passes anonymous=None to wandb.init, and W&B warns on every run that the setting is gone.
        getattr(wandb_logger, "_wandb_init", {}).pop("anonymous", None)
        loggers.append(wandb_logger)
    for logger in loggers:
        logger.log_hyperparams(config)
    return loggers


def _recorded_run_id(out: Path) -> str | None:
    """The run id an earlier attempt in ``out`` recorded (in ``baseline.json``), if readable."""
    try:
        saved = json.loads((out / "baseline.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return saved.get("run_id") if isinstance(saved, dict) else None


def _baseline(module: StructuralRetriever, dm: PairDataModule, kwargs: dict[str, Any], out: Path, rid: str,
              loggers: list[Logger]) -> dict[str, float]:
    """Validation metrics of the untrained backbone, computed once per run (logged at step 0)."""
    cached = out / "baseline.json"
    try:
        saved = json.loads(cached.read_text(encoding="utf-8"))
        if saved["run_id"] == rid:
            return dict(saved["metrics"])
    except (OSError, ValueError, KeyError, TypeError):  # none yet, or unreadable: computed again
        pass
    metrics = _validate_as_is(module, dm, kwargs, out, loggers)
    if module.trainer.is_global_zero:
        cached.write_text(json.dumps({"run_id": rid, "metrics": metrics}, indent=2) + "\n", encoding="utf-8")
    return metrics


def train(cfg: DictConfig) -> dict[str, Any]:
    """Train the structural retriever and export its best checkpoint.

    Validates the untrained backbone first (the baseline), fits with
    ``lightning.Trainer(**cfg.trainer)`` (``trainer.precision=auto`` resolved by
    ``resolve_precision``; in a SLURM job sized by ``slurm_sizing``; resuming
    from the newer of the run's ``last.ckpt`` and SLURM requeue checkpoint, see
    ``resume_checkpoint``), then exports the weights with the best ``val/sketch_hit@5``. Only
    global rank zero exports.

    Args:
        cfg: A ``TrainConfig`` (see ``configs/train.yaml``).

    Returns:
        ``checkpoint`` (the exported folder; None on other ranks), ``best`` and ``baseline``
        (validation metrics), ``run_id``, ``run_dir``, ``resumed_from`` (the checkpoint fitting
        started from, or None), ``steps`` (optimiser steps so far), ``elapsed_s`` (this call's
        wall time) and ``pairs_per_s`` (training pairs per second of training steps in this
        call, all ranks together).

    Raises:
        ConfigError: On an unknown ``trainer.*`` key, a reserved one, a bad ``wandb.mode``, or
            ``trainer.precision=auto`` with a fork-started strategy on CUDA GPUs.
        ValueError: On data that cannot make training and validation pairs.
    """
    started = time.perf_counter()
    L.seed_everything(cfg.seed, workers=True)
    # Before the id: it, config.yaml, the loggers' hyperparameters and the export's metadata all
    # hold the precision that trains.
    precision = resolve_precision(cfg.trainer)
    if precision != cfg.trainer.get("precision"):
        cfg = OmegaConf.merge(cfg, {"trainer": {"precision": precision}})
    rid = run_id(cfg.data, cfg.structural, cfg.seed, cfg.trainer)
    name = structural_name(cfg.data)  # data.name; for your own cases, with their content's hash
    out = Path(cfg.output_dir) if cfg.output_dir else Path("outputs") / "train" / name / rid
    s = cfg.structural
    dm = PairDataModule(cfg.data.name, cfg.data.root, label=s.label, label_bins=s.label_bins,
                        pairs_per_epoch=s.pairs_per_epoch, val_pairs=s.val_pairs, holdout=s.holdout,
                        batch_size=s.batch_size, seed=cfg.seed, hit_queries=s.sketch_hit_queries,
                        hit_pool=s.sketch_hit_pool, kb=cfg.data.kb, cases=cfg.data.cases)
    dm.setup("fit")  # fail on bad data before any model is loaded
    kwargs = slurm_sizing(_trainer_kwargs(cfg.trainer))
    # Before any logger starts a W&B run: a backbone that cannot load fails here.
    module = StructuralRetriever(s.backbone, max_seq_length=s.max_seq_length, lr=s.lr, warmup_ratio=s.warmup_ratio)
    out.mkdir(parents=True, exist_ok=True)
    checkpointing = ModelCheckpoint(dirpath=out / "checkpoints", filename="best-{epoch}-{step}", monitor=MONITOR,
                                    mode="max", save_last=True, save_top_k=1, auto_insert_metric_name=False)
    config = OmegaConf.to_container(cfg, resolve=True)  # what the loggers and the export's metadata record
    loggers = _loggers(cfg.wandb, cfg.data.name, config, out, rid)
    try:
        trainer = L.Trainer(**kwargs, logger=loggers, callbacks=[checkpointing, LineProgress()], default_root_dir=out)
    except TypeError as err:  # a valid name with a value Lightning rejects
        raise ConfigError(f"trainer: {err}") from err
    if trainer.is_global_zero:
        OmegaConf.save(cfg, out / "config.yaml", resolve=True)
        (out / "git.txt").write_text(f"{git_hash() or 'unknown'}\n", encoding="utf-8")
    log.info("run %s in %s", rid, out)

    resume = resume_checkpoint(out)
    earlier = _recorded_run_id(out)
    if resume and earlier not in (None, rid):
        # Only an explicit output_dir can hold another run: the default folder is named by the id.
        log.warning("%s holds run %s, trained with another configuration; run %s continues from its checkpoint "
                    "(choose another output_dir to start afresh)", out, earlier, rid)
    try:
        before = time.perf_counter()
        baseline = _baseline(module, dm, kwargs, out, rid, loggers)
        log.info("start-up: %.1f s, the untrained baseline's validation %.1f s of it (sketch-hit of %d held-out "
                 "questions against %d)", time.perf_counter() - started, time.perf_counter() - before,
                 len(dm.hit_queries), len(dm.hit_pool))
        _fit(trainer, module, dm, kwargs, out, loggers, resume, checkpointing)
    finally:
        _finish_wandb(loggers)

    seconds = module.train_seconds
    result: dict[str, Any] = {
        "checkpoint": None, "best": {}, "baseline": baseline, "run_id": rid, "run_dir": str(out),
        "resumed_from": str(resume) if resume else None, "steps": trainer.global_step,
        "pairs_per_s": module.train_pairs * trainer.world_size / seconds if seconds else 0.0,
    }
    if trainer.is_global_zero:
        result["best"], result["checkpoint"] = _export(cfg.structural, cfg.data, config, module,
                                                       checkpointing.best_model_path, baseline, out, rid,
                                                       trainer.global_step, name)
    result["elapsed_s"] = time.perf_counter() - started
    if trainer.is_global_zero:
        log.info("best %s %.4f (untrained %.4f); %.1f pairs/s; %.0f s", MONITOR,
                 result["best"].get(MONITOR, float("nan")), baseline.get(MONITOR, float("nan")),
                 result["pairs_per_s"], result["elapsed_s"])
    return result


def _fit(trainer: Any, module: StructuralRetriever, dm: PairDataModule, kwargs: dict[str, Any], out: Path,
         loggers: list[Logger], resume: Path | None, checkpointing: ModelCheckpoint) -> None:
    """Fit from ``resume`` (or from the start); a fit that never validated validates once at its end."""
    module.val_metrics = {}
    if resume:
        kind = "SLURM requeue checkpoint" if _HPC_CKPT.fullmatch(resume.name) else "last checkpoint"
        log.info("resuming from the %s %s", kind, resume)
    trainer.fit(module, datamodule=dm, ckpt_path=resume)
    if not checkpointing.best_model_path:
        # Fitting stopped before its first validation (trainer.max_steps within the first epoch):
        # validate the weights there are, which are then the ones exported; logged as Lightning
        # logs a validation (float32 values and the epoch) at the last step.
        metrics = _validate_as_is(module, dm, kwargs, out, loggers=False)
        logged = {k: torch.tensor(v, dtype=torch.float32).item() for k, v in metrics.items()}
        for logger in loggers:
            logger.log_metrics({**logged, "epoch": trainer.current_epoch}, step=trainer.global_step)
            logger.save()


def _export(structural: StructuralTrainConfig, data: TrainDataConfig, config: dict[str, Any],
            module: StructuralRetriever, best_path: str, baseline: dict[str, float], out: Path, rid: str, steps: int,
            name: str) -> tuple[dict[str, float], str]:
    """Load the best weights (the last ones when fitting never validated) and export them with
    their metadata, under ``name`` (``structural_name``); the best validation metrics and the exported folder.

    Args:
        structural: The ``structural`` section (``backbone``, ``checkpoints_dir``: where the export goes).
        data: The ``data`` section (``name``, ``root``, recorded).
        config: The resolved configuration, as plain data (recorded).
        module: The trained module.
        best_path: The best Lightning checkpoint; empty when fitting never validated.
        baseline: The untrained backbone's validation metrics.
        out: The run folder.
        rid: The run id.
        steps: Optimiser steps trained.
        name: The export's data name (``structural_name``).
    """
    if best_path:
        # Our own run's file: it holds Lightning's loop state besides tensors, hence weights_only=False.
        state = torch.load(best_path, map_location="cpu", weights_only=False)
        module.load_state_dict(state["state_dict"])
        best = state.get("cbr2_val_metrics") or {}
    else:
        best = dict(module.val_metrics)
    meta = {"data": {"name": data.name, "root": data.root}, "backbone": structural.backbone,
            "metrics": best, "baseline": baseline, "config": config,
            "git": git_hash(), "run_dir": str(out.resolve()), "run_id": rid, "steps": steps,
            "lightning_checkpoint": best_path or None}
    return best, str(export_checkpoint(module.encoder, structural.checkpoints_dir, name, rid, meta))


def _finish_wandb(loggers: list[Logger]) -> None:
    # Lightning leaves the W&B run open; a later train() in this process would write into it.
    if any(type(logger).__name__ == "WandbLogger" for logger in loggers):
        import wandb

        run = wandb.run
        if run is not None:
            wandb.finish()
            announce(run)
