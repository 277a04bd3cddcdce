"""Sentence encoders run by ONNX Runtime on the CPU: the ``onnx`` and ``onnx-int8`` encoder backends.

A sentence-transformers model (the packaged MiniLM, a trained structural checkpoint, any local
or hub encoder) is exported once from its own weights to an ONNX graph of its whole forward
pass (transformer, pooling, normalisation), into a folder of the cache root named by its weights
fingerprint and the backend. ONNX Runtime's transformer optimizer then fuses each layer's
attention, its residual LayerNorms, its GELU and the embeddings into single kernels (still
float32: the fused graph is checked against torch like the plain one). The folder is built in a
temporary folder beside it, checked, and renamed into place under a build lock, so concurrent
jobs export once and never read a half-written graph. ``onnx-int8`` further quantizes the fused
graph's matrix products to 8-bit integer weights (ONNX Runtime's dynamic quantization).

Tokenisation stays the model's own, and texts are batched in the same order as
sentence-transformers batches them, so only the forward pass changes engine. ``onnx`` matches
the torch embeddings to float32 rounding; ``onnx-int8`` is faster and approximate
(``benchmarks/encoding.py`` measures both speed and the top-10 overlap of searches).

Why not sentence-transformers' own ``backend="onnx"``: it goes through ``optimum``, whose ONNX
Runtime package pins transformers below 4.58, and the project runs on transformers 5.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from cbr2.common.errors import SetupError
from cbr2.common.files import publish_folder
from cbr2.common.locks import build_lock

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

log = logging.getLogger(__name__)

ONNX_BACKENDS = ("onnx", "onnx-int8")
"""The encoder backends this module runs (CPU only: the installed ONNX Runtime is the CPU build)."""

EXPORT_FORMAT = 2
"""Bump when the exported graph or its quantization changes; older exports are then rebuilt."""

MARKER = "export.json"
"""Written last into an export folder: its presence says the folder is complete."""

OPSET = 17
"""ONNX opset of the export (ONNX Runtime 1.16 and later run it; it has LayerNormalization)."""

MAX_EXPORT_ERROR = 1e-3
"""Largest difference allowed between an fp32 export's embeddings and torch's on the check texts."""

_CHECK_TEXTS = ("a", "Which city is the capital of Australia?", "Marie Curie | date of birth | 1867-11-07",
                ("How many films directed by someone born in the same year as the director of the film "
                 "that won the award for best picture have a running time longer than two hours?"))
"""Texts of different lengths, encoded in one padded batch by both engines after an export."""


def export_dir(root: str | Path, fingerprint: str, backend: str) -> Path:
    """Where the export of the weights ``fingerprint`` for ``backend`` lives under the cache ``root``."""
    return Path(root) / "encoders" / f"{fingerprint}-{backend}-v{EXPORT_FORMAT}"


def _features(model: SentenceTransformer, texts: Sequence[str]) -> dict[str, Any]:
    """The model's own tokenisation of ``texts`` (``preprocess`` in sentence-transformers 6, ``tokenize`` before)."""
    prepare = getattr(model, "preprocess", None) or model.tokenize
    return prepare(list(texts))


def _tensor_inputs(features: dict[str, Any]) -> list[str]:
    """The tokenizer outputs that are tensors, in a fixed order (the graph's inputs)."""
    import torch

    return sorted(k for k, v in features.items() if isinstance(v, torch.Tensor))


def _transformers(model: SentenceTransformer) -> list[Any]:
    """The Hugging Face models inside ``model`` (sentence-transformers' ``Transformer`` modules)."""
    return [m.auto_model for m in model if hasattr(m, "auto_model")]


def export_onnx(model: SentenceTransformer, folder: Path) -> Path:
    """Write ``model.onnx``, the model's whole forward pass to the sentence embedding, into ``folder``.

    Uses torch's TorchScript-based exporter (``dynamo=False``): the torch.export-based one needs
    onnxscript and does not trace every transformers attention implementation yet. Attention is
    traced in its ``eager`` implementation (the same arithmetic as the default SDPA): its plain
    MatMul-Softmax-MatMul is what ONNX Runtime's attention fusion recognises, while SDPA's trace
    (with its NaN guards on masked rows) is left unfused. The model's own setting is restored.

    Returns:
        The graph's path.
    """
    import torch

    features = _features(model, _CHECK_TEXTS)
    names = _tensor_inputs(features)

    class _Forward(torch.nn.Module):
        """Positional tensors in, sentence embedding out: the signature an ONNX graph needs."""

        def __init__(self, inner: torch.nn.Module):
            super().__init__()
            self.inner = inner

        def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
            return self.inner(dict(zip(names, tensors, strict=True)))["sentence_embedding"]

    path = folder / "model.onnx"
    axes = {name: {0: "batch", 1: "tokens"} for name in names} | {"sentence_embedding": {0: "batch"}}
    model = model.to("cpu").eval()
    inner = [m for m in _transformers(model) if hasattr(m, "set_attn_implementation")]
    before = [m.config._attn_implementation for m in inner]
    with torch.no_grad(), warnings.catch_warnings():
        # The tracer warns about Python branches on shapes (padding checks) that are constant for
        # an encoder's full attention mask; the exporter warns that it is the older of two.
        warnings.simplefilter("ignore")
        try:
            for m in inner:
                m.set_attn_implementation("eager")
            torch.onnx.export(_Forward(model), tuple(features[n].cpu() for n in names), str(path), dynamo=False,
                              input_names=names, output_names=["sentence_embedding"], dynamic_axes=axes,
                              opset_version=OPSET, do_constant_folding=True)
        finally:
            for m, implementation in zip(inner, before, strict=True):
                m.set_attn_implementation(implementation)
    return path


def fuse(model: SentenceTransformer, source: Path, target: Path) -> dict[str, int]:
    """Write ``source`` with each layer's operators fused into ONNX Runtime's transformer kernels.

    ONNX Runtime's offline transformer optimizer (``model_type="bert"``, the encoder-only layout
    of BERT, MiniLM, RoBERTa) replaces each attention block by one ``Attention`` node, each
    residual add and LayerNorm by ``SkipLayerNormalization``, the FFN's bias and GELU by
    ``BiasGelu`` and the embeddings by ``EmbedLayerNormalization``. Its own basic optimizations
    are left to the session (``opt_level=0``), so the file stays independent of the CPU.

    Args:
        model: The encoder the graph was exported from: its heads and hidden size.
        source: The plain export.
        target: Where the fused graph goes.

    Returns:
        How many nodes of each fused kind the graph has (the kinds with none left out).
    """
    from onnxruntime.transformers.optimizer import optimize_model

    config = _transformers(model)[0].config
    with _quiet_root_logger():  # the optimizer logs every fusion at INFO on module-named loggers
        fused = optimize_model(str(source), model_type="bert", num_heads=config.num_attention_heads,
                               hidden_size=config.hidden_size, opt_level=0)
    fused.save_model_to_file(str(target))
    return {kind: n for kind, n in fused.get_fused_operator_statistics().items() if n}


@contextlib.contextmanager
def _quiet_root_logger() -> Iterator[None]:
    """Only errors from loggers that inherit the root logger's level, while the block runs."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(max(level, logging.ERROR))
    try:
        yield
    finally:
        root.setLevel(level)


def quantize_int8(source: Path, target: Path) -> None:
    """8-bit weights for the graph's matrix products (dynamic quantization of the activations).

    Only ``MatMul`` is quantized (the attention output and FFN projections): the embeddings and
    the fused ``Attention`` nodes, with their query/key/value projections, stay float32. Weights
    are per output channel with the reduced 7-bit range, which avoids the saturation of AVX2's
    8-bit multiply-add.
    """
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with _quiet_root_logger():  # the quantizer logs a pre-processing hint on the root logger
        # The fused kernels are in ONNX Runtime's own operator domain, which ONNX's shape
        # inference does not type: their outputs are float32.
        quantize_dynamic(str(source), str(target), weight_type=QuantType.QInt8, per_channel=True,
                         reduce_range=True, op_types_to_quantize=["MatMul"],
                         extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})


def _session(path: Path, threads: int):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3  # ONNX Runtime's own warnings about unused initializers
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _check_export(model: SentenceTransformer, graph: Path) -> float:
    """Largest absolute difference between torch's and the graph's embeddings of the check texts.

    One padded batch of texts of different lengths: an export whose traced shapes or attention
    mask were frozen at the example's would differ here.
    """
    features = _features(model, _CHECK_TEXTS)
    names = _tensor_inputs(features)
    # Against the model's own encode (what the torch backend computes), in one batch as well.
    expected = model.encode(list(_CHECK_TEXTS), batch_size=len(_CHECK_TEXTS), convert_to_numpy=True,
                            show_progress_bar=False)
    got = _session(graph, 1).run(None, {n: features[n].cpu().numpy() for n in names})[0]
    return float(np.abs(got - expected).max())


def ensure_export(model: SentenceTransformer, root: str | Path, fingerprint: str, backend: str) -> Path:
    """The export folder of ``model`` for ``backend``, exporting it now when no complete one exists.

    Args:
        model: The torch encoder, loaded on any device.
        root: The cache root (the configuration's ``cache_dir``; ``cache_root``).
        fingerprint: ``weights_fingerprint`` of ``model``: the folder belongs to these weights.
        backend: ``onnx`` or ``onnx-int8``.

    Raises:
        SetupError: When the fp32 graph does not reproduce torch's embeddings.
    """
    if backend not in ONNX_BACKENDS:
        raise ValueError(f"not an ONNX backend: {backend!r}")
    dest = export_dir(root, fingerprint, backend)
    if (dest / MARKER).is_file():
        return dest
    with build_lock(dest, f"the {backend} export of encoder {fingerprint}"):
        if not (dest / MARKER).is_file():  # another job may have exported it while this one waited
            _export_into(model, dest, fingerprint, backend)
    return dest


def _export_into(model: SentenceTransformer, dest: Path, fingerprint: str, backend: str) -> None:
    start = time.perf_counter()
    log.info("exporting the encoder to ONNX (%s) in %s, once", backend, dest)

    def build(tmp: Path) -> None:
        fp32 = export_onnx(model, tmp)
        error = _check_export(model, fp32)
        if error > MAX_EXPORT_ERROR:
            raise SetupError(f"the ONNX export of the encoder differs from torch by {error:.2g} on its check texts "
                             "(more than float rounding): use retrieval.encoder_backend=torch")
        fused, fused_error = _fuse_checked(model, fp32)
        if backend == "onnx-int8":
            quantize_int8(fp32, tmp / "model.int8.onnx")
            fp32.unlink()
            (tmp / "model.int8.onnx").rename(fp32)
        record = {"format": EXPORT_FORMAT, "backend": backend, "weights": fingerprint, "opset": OPSET,
                  "inputs": _tensor_inputs(_features(model, ["x"])), "fused": fused,
                  "fp32_max_error": error if fused_error is None else fused_error,
                  "dim": int(_embedding_dim(model))}
        (tmp / MARKER).write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
        tmp.chmod(0o755)  # mkdtemp makes it private; a cache folder is shared by the jobs of a user

    # A folder already there has no marker (ensure_export checked it under the lock): incomplete.
    publish_folder(dest, build, replace=True)
    log.info("exported the %s encoder in %.1f s", backend, time.perf_counter() - start)


def _fuse_checked(model: SentenceTransformer, graph: Path) -> tuple[dict[str, int], float | None]:
    """Replace ``graph`` by its fused form when that reproduces torch's embeddings, else keep it.

    Fusion only speeds the graph up, and the plain graph has passed the check: an encoder whose
    layout the optimizer does not know (or misreads) keeps running, unfused, with a warning.

    Returns:
        The fused graph's node counts of each fused kind and its check error; ``({}, None)`` when
        ``graph`` stays unfused.
    """
    target = graph.with_name("model.fused.onnx")
    try:
        kinds = fuse(model, graph, target)
        error = _check_export(model, target)
    except Exception as err:  # noqa: BLE001 - any failure of the optimizer leaves the checked plain graph
        log.warning("ONNX Runtime's transformer optimizer failed on this encoder (%s): running it unfused", err)
        target.unlink(missing_ok=True)
        return {}, None
    if error > MAX_EXPORT_ERROR:
        log.warning("the fused ONNX graph differs from torch by %.2g on the check texts: running it unfused", error)
        target.unlink()
        return {}, None
    target.replace(graph)
    return kinds, error


def _embedding_dim(model: SentenceTransformer) -> int:
    getter = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
    return getter()


class OnnxEncoder:
    """A sentence encoder whose forward pass runs in ONNX Runtime; the interface ``encoders.encode`` uses.

    Args:
        model: The torch encoder the graph was exported from; kept for its tokenizer.
        folder: The export folder (``ensure_export``).
        fingerprint: The cache identity of these embeddings (weights, backend and export format).
        threads: ONNX Runtime's threads; torch's thread count (what the torch path would use) when unset.
    """

    device = "cpu"

    def __init__(self, model: SentenceTransformer, folder: Path, fingerprint: str, threads: int | None = None):
        import torch

        record = json.loads((folder / MARKER).read_text(encoding="utf-8"))
        self.backend: str = record["backend"]
        self.fingerprint = fingerprint
        self.folder = folder
        self._model = model
        self._inputs: list[str] = record["inputs"]
        self._dim: int = record["dim"]
        self._session = _session(folder / "model.onnx", threads or torch.get_num_threads())

    def get_embedding_dimension(self) -> int:
        """Dimension of the embeddings."""
        return self._dim

    def encode(self, texts: Sequence[str], batch_size: int = 32, normalize_embeddings: bool = True,
               show_progress_bar: bool = False, **_: Any) -> np.ndarray:
        """Embeddings of ``texts``, one row each, in their order.

        Texts are batched longest first, as sentence-transformers does, so each padded batch
        holds texts of similar length.

        Args:
            texts: What to embed.
            batch_size: Texts per forward pass.
            normalize_embeddings: Scale each row to unit length.
            show_progress_bar: Log a progress bar over the batches.
        """
        from cbr2.common.console import progress

        texts = list(texts)
        out = np.empty((len(texts), self._dim), dtype=np.float32)
        order = np.argsort([-len(t) for t in texts], kind="stable")
        with progress(total=len(texts), unit="text", desc="encoding", logger=log,
                      disable=not show_progress_bar) as bar:
            for start in range(0, len(texts), batch_size):
                rows = order[start: start + batch_size]
                features = _features(self._model, [texts[i] for i in rows])
                feed = {name: features[name].cpu().numpy() for name in self._inputs}
                out[rows] = self._session.run(None, feed)[0]
                bar.update(len(rows))
        if normalize_embeddings:
            out /= np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)
        return out

    def __repr__(self) -> str:
        return f"OnnxEncoder({self.backend}, {str(self.folder)!r})"
