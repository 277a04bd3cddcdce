"""Encoder backends (retrieval.encoder_backend): ONNX exports, their cache identity, deduplication, GPU refusal."""

from __future__ import annotations

import json

import numpy as np
import pytest

from cbr2.common.devices import Devices, check_devices
from cbr2.common.errors import ConfigError, SetupError
from cbr2.config import Config, compose
from cbr2.retrieval.cache import EmbeddingStore
from cbr2.retrieval.encoders import encode, load_encoder, resolve_backend, unique_texts, weights_fingerprint
from cbr2.retrieval.index import build_index, search
from cbr2.retrieval.onnx_backend import export_onnx
from cbr2.run.runner import device_settings

pytest.importorskip("onnxruntime")

MINILM = "sentence-transformers/all-MiniLM-L6-v2"
ONE_GPU = Devices(cuda=1, faiss_build="gpu", faiss_gpus=1, torch_version="2.14.0", vllm_cpu=False)

FACTS = [f"{who} | {key} | {value}" for who, key, value in [
    ("Marie Curie", "date of birth", "1867-11-07"), ("Marie Curie", "country of citizenship", "Poland"),
    ("Warsaw", "population", "1790658"), ("Warsaw", "country", "Poland"), ("Paris", "population", "2148000"),
    ("Paris", "country", "France"), ("France", "capital", "Paris"), ("Poland", "capital", "Warsaw"),
    ("The Godfather", "director", "Francis Ford Coppola"), ("The Godfather", "publication date", "1972"),
    ("Francis Ford Coppola", "date of birth", "1939-04-07"), ("Canberra", "country", "Australia"),
    ("Australia", "capital", "Canberra"), ("Mount Everest", "elevation above sea level", "8848 metre"),
    ("K2", "elevation above sea level", "8611 metre"), ("Nile", "length", "6650 kilometre"),
    ("Amazon", "length", "6400 kilometre"), ("Albert Einstein", "award received", "Nobel Prize in Physics"),
    ("Albert Einstein", "date of birth", "1879-03-14"), ("Berlin", "population", "3645000"),
    ("Germany", "capital", "Berlin"), ("Tokyo", "population", "13960000"), ("Japan", "capital", "Tokyo"),
    ("Inception", "director", "Christopher Nolan"), ("Inception", "publication date", "2010"),
    ("Christopher Nolan", "country of citizenship", "United Kingdom"), ("London", "country", "United Kingdom"),
    ("Pablo Picasso", "date of birth", "1881-10-25"), ("Guernica", "creator", "Pablo Picasso"),
    ("Lake Baikal", "area", "31722 square kilometre"),
]]
QUESTIONS = [
    "When was Marie Curie born?", "What is the population of Warsaw?", "Which country is Paris in?",
    "Who directed The Godfather?", "What is the capital of Australia?", "How high is Mount Everest?",
    "How long is the Nile?", "Which award did Albert Einstein receive?", "Who directed Inception?",
    "Who painted Guernica?", "What is the capital of Japan?", "How large is Lake Baikal?",
]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return str(tmp_path_factory.mktemp("exports"))


@pytest.fixture(scope="module")
def structural_folder(tmp_path_factory):
    """A fine-tuned checkpoint's shape: a sentence-transformers folder of changed weights, saved locally."""
    import torch

    model = load_encoder(MINILM, "cpu", "torch")
    folder = tmp_path_factory.mktemp("structural") / "retriever"
    model.save(str(folder))
    from sentence_transformers import SentenceTransformer

    tuned = SentenceTransformer(str(folder), device="cpu")
    with torch.no_grad():  # a small step away from the backbone, as a short fine-tuning is
        for param in tuned.parameters():
            param.add_(0.01 * torch.randn_like(param))
    tuned.save(str(folder))
    return str(folder)


def _top(base, queries, k):
    return search(build_index(base, "flat"), queries, k)[1]


@pytest.mark.parametrize("name", [MINILM, "structural"])
def test_onnx_backend_searches_like_torch(name, structural_folder, cache):
    name = structural_folder if name == "structural" else name
    torch_model = load_encoder(name, "cpu", "torch", cache)
    onnx_model = load_encoder(name, "cpu", "onnx", cache)
    ref_f, ref_q = encode(torch_model, FACTS, 8), encode(torch_model, QUESTIONS, 8)
    got_f, got_q = encode(onnx_model, FACTS, 8), encode(onnx_model, QUESTIONS, 8)
    assert got_f.shape == ref_f.shape and got_f.dtype == np.float32
    assert np.allclose(np.linalg.norm(got_f, axis=1), 1, atol=1e-5)
    assert np.abs(got_f - ref_f).max() < 1e-4 and np.abs(got_q - ref_q).max() < 1e-4
    assert (_top(got_f, got_q, 5) == _top(ref_f, ref_q, 5)).all()


def test_the_export_is_fused_and_leaves_the_torch_model_as_it_was(cache, tmp_path):
    torch_model = load_encoder(MINILM, "cpu", "torch", cache)
    before = torch_model[0].auto_model.config._attn_implementation
    export_onnx(torch_model, tmp_path)  # traced with eager attention, which fuses
    assert torch_model[0].auto_model.config._attn_implementation == before
    record = json.loads((load_encoder(MINILM, "cpu", "onnx", cache).folder / "export.json").read_text())
    layers = torch_model[0].auto_model.config.num_hidden_layers
    # One Attention per layer, its two residual LayerNorms fused: nothing of a layer left unfused.
    assert record["fused"]["Attention"] == layers and record["fused"]["SkipLayerNormalization"] == 2 * layers
    assert record["fused"]["EmbedLayerNormalization"] == 1 and record["fp32_max_error"] < 1e-4


def test_int8_backend_loads_and_mostly_agrees(cache):
    torch_model = load_encoder(MINILM, "cpu", "torch", cache)
    int8 = load_encoder(MINILM, "cpu", "onnx-int8", cache)
    ref = _top(encode(torch_model, FACTS, 8), encode(torch_model, QUESTIONS, 8), 1)
    got = _top(encode(int8, FACTS, 8), encode(int8, QUESTIONS, 8), 1)
    assert (ref == got).mean() >= 0.75  # approximate by design; benchmarks/encoding.py measures it at scale


def test_each_backend_has_its_own_cache_entries(cache, tmp_path):
    models = {b: load_encoder(MINILM, "cpu", b, cache) for b in ("torch", "onnx", "onnx-int8")}
    prints = {b: weights_fingerprint(m) for b, m in models.items()}
    assert len(set(prints.values())) == 3
    store = EmbeddingStore(tmp_path)
    for backend, model in models.items():
        store.get("facts", FACTS, MINILM, prints[backend], lambda t, m=model: encode(m, t, 8))
    assert len([p for p in tmp_path.iterdir() if p.name.startswith("facts-")]) == 3
    # Loading again reuses the export and keeps the identity, so the cache entry is hit.
    load_encoder.cache_clear()
    assert weights_fingerprint(load_encoder(MINILM, "cpu", "onnx", cache)) == prints["onnx"]


class _Recording:
    """An encoder that embeds a text as its length and first letter and records what it was given."""

    def __init__(self):
        self.seen: list[str] = []

    def encode(self, texts, **_):
        self.seen += texts
        out = np.array([[len(t), ord(t[0])] for t in texts], dtype=np.float32)
        return out / np.linalg.norm(out, axis=1, keepdims=True)


def test_repeated_texts_are_encoded_once_and_rows_keep_their_order():
    texts = ["bb", "a", "bb", "ccc", "a", "bb", "dddd"]
    model = _Recording()
    got = encode(model, texts, 2)
    assert sorted(model.seen) == ["a", "bb", "ccc", "dddd"]
    assert np.array_equal(got, _Recording().encode(texts))
    distinct, positions = unique_texts(texts)
    assert [distinct[i] for i in positions] == texts


def test_auto_is_onnx_on_a_cpu_and_torch_on_a_gpu():
    assert resolve_backend("auto", "cpu") == "onnx"
    assert resolve_backend("auto", "cuda:0") == "torch"
    assert resolve_backend("torch", "cuda") == "torch"
    with pytest.raises(ConfigError, match="retrieval.encoder_backend=onnx-int8"):
        resolve_backend("onnx-int8", "cuda")


@pytest.mark.parametrize("device", ["cuda", "auto"])
def test_a_cpu_only_backend_on_a_gpu_node_stops_at_start(device):
    cfg = compose(Config, overrides=["retrieval.encoder_backend=onnx", f"retrieval.device={device}"])
    with pytest.raises(SetupError, match=r"^retrieval.encoder_backend=onnx ") as err:
        check_devices(**device_settings(cfg), dev=ONE_GPU)
    assert "\n" not in str(err.value)
    cpu = compose(Config, overrides=["retrieval.encoder_backend=onnx", "retrieval.device=cpu"])
    check_devices(**device_settings(cpu), dev=ONE_GPU)
    torch_there = compose(Config, overrides=[f"retrieval.device={device}"])
    check_devices(**device_settings(torch_there), dev=ONE_GPU)  # auto: torch there
