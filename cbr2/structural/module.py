"""The structural retriever as a LightningModule: loss, optimiser schedule and validation metrics.

Both questions of a pair go through the same encoder (shared weights); the cosine of their
embeddings regresses on the similarity of their programs' sketches (mean squared error).
Validation reports how well cosines rank held-out pairs (``val/spearman``) and what the
retriever is for: whether a held-out question's nearest fit-pool questions include one with
its exact sketch (``val/sketch_hit@k``).
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Any

import lightning as L
import numpy as np
import torch
import torch.nn.functional as F
from scipy.stats import spearmanr

from cbr2.common.errors import ConfigError
from cbr2.retrieval.encoders import encode, resolve_model
from cbr2.retrieval.index import build_index, search
from cbr2.retrieval.metrics import sketch_hit_at_k
from cbr2.structural.data import Batch, QuestionSet

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

HIT_KS = (1, 5)
"""The k of the logged ``val/sketch_hit@k``."""


def sketch_hits(queries: QuestionSet, q_emb: np.ndarray, pool: QuestionSet, pool_emb: np.ndarray,
                ks: tuple[int, ...] = HIT_KS) -> dict[str, float]:
    """``{"val/sketch_hit@k": ...}`` of ``queries`` retrieving from ``pool`` by inner product.

    Ranks with the same exact FAISS search that evaluation's case retrieval uses.
    """
    _, top = search(build_index(pool_emb, "flat"), q_emb, max(ks))
    retrieved = [[pool.sketches[j] for j in row] for row in top]
    return {f"val/sketch_hit@{k}": sketch_hit_at_k(queries.sketches, retrieved, k) for k in ks}


def _embed(encoder: SentenceTransformer, texts: list[str], device: torch.device) -> torch.Tensor:
    # ``tokenize`` before sentence-transformers 6; both pad to the longest text and truncate.
    tokenize = getattr(encoder, "preprocess", None) or encoder.tokenize
    features = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in tokenize(texts).items()}
    return encoder(features)["sentence_embedding"]  # (N, D)


def freeze_unused(encoder: SentenceTransformer) -> list[str]:
    """Freeze the parameters the sentence embedding does not depend on; return their names.

    BERT's pooler, for one, is loaded but unused by mean pooling. DDP fails on a trainable
    parameter without a gradient, so one forward-backward pass on a dummy text finds them.
    """
    encoder.zero_grad(set_to_none=True)
    _embed(encoder, ["which one"], encoder.device).sum().backward()
    unused = [name for name, p in encoder.named_parameters() if p.requires_grad and p.grad is None]
    for name, p in encoder.named_parameters():
        if name in unused:
            p.requires_grad_(False)
        p.grad = None
    return unused


class StructuralRetriever(L.LightningModule):
    """A SentenceTransformer fine-tuned on sketch similarity.

    Validation reads the held-out questions and the fit pool from the trainer's
    ``PairDataModule`` (``hit_queries`` and ``hit_pool``, bounded parts of them) for sketch-hit@k.

    Args:
        backbone: Encoder to start from (hub id, local folder or packaged hub id).
        max_seq_length: Tokens the encoder reads per question.
        lr: Peak AdamW learning rate.
        warmup_ratio: Share of the optimisation steps with linear warm-up (then linear decay to 0).
        eval_batch_size: Questions per forward pass when encoding for sketch-hit@k.

    Attributes:
        encoder: The SentenceTransformer being trained.
        frozen: Names of the encoder's parameters left untrained (see ``freeze_unused``).
        val_metrics: The latest full validation's metrics.
        train_pairs: Pairs trained on by this process in this session.
        train_seconds: Seconds this process spent in training steps in this session.
    """

    # The training settings have their one default in the config (StructuralTrainConfig), none here.
    def __init__(self, backbone: str, *, max_seq_length: int, lr: float, warmup_ratio: float,
                 eval_batch_size: int = 128):
        super().__init__()
        self.save_hyperparameters()
        from sentence_transformers import SentenceTransformer

        self.encoder = SentenceTransformer(resolve_model(backbone), device="cpu")
        self.encoder.max_seq_length = max_seq_length
        self.frozen = freeze_unused(self.encoder)
        self.encoder.train()  # Lightning expects every submodule in training mode when fitting starts
        self.val_metrics: dict[str, float] = {}
        self.train_pairs, self.train_seconds = 0, 0.0
        self._val_cos: list[torch.Tensor] = []
        self._val_labels: list[torch.Tensor] = []
        self._batch_start = 0.0

    def forward(self, texts: list[str]) -> torch.Tensor:
        """``(N, D)`` embeddings of ``texts``, with gradients when training."""
        return _embed(self.encoder, texts, self.device)

    def _embed_pairs(self, texts_a: list[str], texts_b: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        emb = self(list(texts_a) + list(texts_b))  # one forward pass for both sides: (2B, D)
        return emb[:len(texts_a)], emb[len(texts_a):]

    # ------------------------------------------------------------------ training

    def training_step(self, batch: Batch, batch_idx: int) -> torch.Tensor:
        texts_a, texts_b, labels = batch
        emb_a, emb_b = self._embed_pairs(texts_a, texts_b)
        # sentence-transformers' CosineSimilarityLoss, computed as it does (tests/test_structural.py
        # compares the two); the class itself holds the encoder as a submodule, which would give
        # every weight a second name in the checkpoints. float32 whatever the training precision:
        # cosines near 1 need the mantissa.
        loss = F.mse_loss(F.cosine_similarity(emb_a.float(), emb_b.float(), dim=-1), labels.float())  # (B,) vs (B,)
        self.log("train/loss", loss, prog_bar=True, batch_size=len(labels))
        self.train_pairs += len(labels)
        return loss

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        self._batch_start = time.perf_counter()

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        # After the optimiser step: pairs/s counts forward, backward and update.
        self.train_seconds += time.perf_counter() - self._batch_start

    def configure_optimizers(self) -> dict[str, Any]:
        from transformers import get_linear_schedule_with_warmup

        total = self.trainer.estimated_stepping_batches
        if not math.isfinite(total):
            raise ConfigError("the number of training steps is unknown; set trainer.max_steps or trainer.max_epochs")
        total = max(1, int(total))
        warmup = int(total * self.hparams.warmup_ratio)
        optimizer = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)
        # Linear warm-up, then linear decay to 0, as transformers schedules it, but counted from one
        # step in (last_epoch=0; LambdaLR then reads the peak from initial_lr): the first step trains
        # at lr/(warmup+1), not at 0, and step s at lr*(s+1)/(warmup+1) until the peak.
        for group in optimizer.param_groups:
            group["initial_lr"] = group["lr"]
        scheduler = get_linear_schedule_with_warmup(optimizer, warmup + 1, total + 1, last_epoch=0)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    # ---------------------------------------------------------------- validation

    def on_validation_epoch_start(self) -> None:
        self._val_cos.clear()
        self._val_labels.clear()

    def validation_step(self, batch: Batch, batch_idx: int) -> None:
        texts_a, texts_b, labels = batch
        emb_a, emb_b = self._embed_pairs(texts_a, texts_b)
        self._val_cos.append(F.cosine_similarity(emb_a.float(), emb_b.float(), dim=-1))  # (B,)
        self._val_labels.append(labels.float())

    def on_validation_epoch_end(self) -> None:
        if self.trainer.sanity_checking:  # two batches say nothing; skip the costly sketch-hit
            return
        cos, labels = torch.cat(self._val_cos), torch.cat(self._val_labels)
        if self.trainer.world_size > 1:  # each DDP rank scored a shard of the pairs
            cos, labels = self.all_gather(cos).reshape(-1), self.all_gather(labels).reshape(-1)
        cos, labels = cos.cpu().numpy(), labels.cpu().numpy()
        metrics = {"val/mse": float(np.mean((cos - labels) ** 2)),
                   "val/spearman": float(spearmanr(cos, labels).statistic)}
        # Every rank computes sketch-hit on the same weights, so all log the same numbers.
        dm = self.trainer.datamodule
        batch = self.hparams.eval_batch_size
        metrics |= sketch_hits(dm.hit_queries, encode(self.encoder, dm.hit_queries.texts, batch, progress=False),
                               dm.hit_pool, encode(self.encoder, dm.hit_pool.texts, batch, progress=False))
        self.val_metrics = metrics
        self.log_dict(metrics, sync_dist=True)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # The metrics a checkpoint was chosen for travel with it, so the best one's are known on resume.
        checkpoint["cbr2_val_metrics"] = dict(self.val_metrics)
