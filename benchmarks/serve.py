"""``cbr2 serve`` under load: requests per second and latency with concurrent clients.

    python benchmarks/serve.py                                   # starts cbr2 serve (the CPU default): 24 requests, 4 clients
    python benchmarks/serve.py -n 24 -c 4 --data mini-kqapro --split val --out outputs/serve-bench.json
    python benchmarks/serve.py --url http://127.0.0.1:8000 -n 50 -c 8 --questions my_questions.txt
    python benchmarks/serve.py -n 24 -c 4 -- --batch-size 4 structural.checkpoint=sentence-transformers/all-MiniLM-L6-v2

Without ``--url`` it starts ``cbr2 serve`` on a free port of 127.0.0.1 (the arguments after ``--``
are the service's: ``--config``, ``--ablation``, ``--batch-size``, ``key=value``), waits until
``/api/health`` answers (the service has loaded and made its warm-up generation then), and stops
it (Ctrl-C) at the end; its log goes to a file named in the output. Then ``--warm`` requests
(not counted), then ``-n`` requests from ``-c`` clients, each sending its next question as soon
as its last was answered. The questions are a benchmark split's (``--data``, ``--split``; in the
split's order, as many different ones as there are requests: a question asked twice at once is
answered once) or a file's (``--questions``: one a line, or JSONL with ``"question"``).

Printed: the result as JSON (``--out`` writes it too), then one line: requests per second, the
latency's p50, p95 and max, the errors by status, how many programs ran to an answer, and the
machine's load average before and after the requests (other work on the machine slows every figure).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def percentile(values: list[float], q: float) -> float | None:
    """The ``q``-th percentile (0-100) by linear interpolation between ranks; None without values."""
    if not values:
        return None
    xs = sorted(values)
    rank = (len(xs) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return xs[low] + (xs[high] - xs[low]) * (rank - low)


def read_questions(args: argparse.Namespace) -> tuple[list[str], str]:
    """The questions to send and where they came from."""
    if args.questions:
        path = Path(args.questions)
        lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        texts = [json.loads(line)["question"] if path.suffix == ".jsonl" else line for line in lines]
        return texts, str(path)
    from cbr2.data.benchmarks import Benchmark

    bench = Benchmark(args.data, args.root)
    split = args.split or bench.family.eval_split
    return [q.question for q in bench.questions(split)], f"{args.data} {split}"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_service(args: argparse.Namespace, serve_args: list[str], log_path: Path) -> tuple[subprocess.Popen, str]:
    """``cbr2 serve`` in a child process on a free port; its URL."""
    port = free_port()
    command = [args.python, "-m", "cbr2.cli", "serve", "--port", str(port), *serve_args]
    print(f"starting: {' '.join(command)} (log: {log_path})", file=sys.stderr, flush=True)
    log = log_path.open("w", encoding="utf-8")
    child = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                             env={**os.environ, "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "1")})
    log.close()  # the child holds its own descriptor
    return child, f"http://127.0.0.1:{port}"


def stop_service(child: subprocess.Popen) -> int | None:
    """Ctrl-C, as a person stops it; killed after 60 s."""
    if child.poll() is None:
        child.send_signal(signal.SIGINT)
        try:
            child.wait(60)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait(10)
    return child.returncode


def wait_healthy(url: str, seconds: float, child: subprocess.Popen | None, log_path: Path | None) -> dict[str, Any]:
    """``/api/health`` once it answers 200."""
    import httpx

    deadline = time.monotonic() + seconds
    while True:
        if child is not None and child.poll() is not None:
            tail = log_path.read_text(encoding="utf-8", errors="replace")[-2000:] if log_path else ""
            raise SystemExit(f"error: cbr2 serve exited with {child.returncode} before it was ready:\n{tail}")
        try:
            response = httpx.get(f"{url}/api/health", timeout=10)
            if response.status_code == 200:
                return response.json()
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            raise SystemExit(f"error: {url}/api/health did not answer within {seconds:g} s")
        time.sleep(0.5)


def run_requests(url: str, texts: list[str], concurrency: int, timeout_s: float) -> list[dict[str, Any]]:
    """Each text POSTed once; ``concurrency`` clients, each with its own connection."""
    import httpx

    local = threading.local()

    def one(text: str) -> dict[str, Any]:
        if not hasattr(local, "client"):
            local.client = httpx.Client(timeout=timeout_s)
        started = time.perf_counter()
        try:
            response = local.client.post(f"{url}/api/ask", json={"question": text})
        except httpx.HTTPError as err:
            return {"status": type(err).__name__, "seconds": time.perf_counter() - started, "answered": False}
        seconds = time.perf_counter() - started
        ok = response.status_code == 200
        body = response.json() if response.headers.get("content-type", "").startswith("application/json") else {}
        return {"status": str(response.status_code), "seconds": seconds,
                "answered": bool(ok and body.get("answered")),
                "own_question": bool(ok and body.get("question") == " ".join(text.split())),
                "error": None if ok else body.get("error")}

    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        return list(pool.map(one, texts))


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    serve_args = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", help="a running service (default: start cbr2 serve here)")
    parser.add_argument("-n", "--requests", type=int, default=24, help="requests timed (default 24)")
    parser.add_argument("-c", "--concurrency", type=int, default=4, help="clients at once (default 4)")
    parser.add_argument("--data", default="mini-kqapro", help="the benchmark whose questions are sent")
    parser.add_argument("--root", default=None, help="its data folder (data.root), for the real datasets")
    parser.add_argument("--split", default=None, help="its split (default: its evaluation split)")
    parser.add_argument("--questions", metavar="FILE", help="questions from a file instead: one a line, or .jsonl")
    parser.add_argument("--warm", type=int, default=1, help="requests sent first, not timed (default 1)")
    parser.add_argument("--timeout", type=float, default=1800, help="a client's seconds per request (default 1800)")
    parser.add_argument("--start-timeout", type=float, default=1800, help="seconds to wait for the service to start")
    parser.add_argument("--python", default=sys.executable, help="the service's interpreter (default this one)")
    parser.add_argument("--out", type=Path, help="also write the JSON result here")
    args = parser.parse_args(argv)
    if args.requests < 1 or args.concurrency < 1 or args.warm < 0:
        parser.error("-n and -c are at least 1, --warm at least 0")

    texts, source = read_questions(args)
    if len(texts) < args.warm + args.requests:
        print(f"note: {source} has {len(texts)} questions for {args.warm + args.requests} requests: some repeat",
              file=sys.stderr)
    texts = [texts[i % len(texts)] for i in range(args.warm + args.requests)]
    load_at_start = os.getloadavg()
    child, log_path, startup_s = None, None, None
    url = args.url.rstrip("/") if args.url else None
    if url is None:
        log_path = Path(tempfile.mkdtemp(prefix="cbr2-serve-bench-")) / "serve.log"
        started = time.perf_counter()
        child, url = start_service(args, serve_args, log_path)
    try:
        health = wait_healthy(url, args.start_timeout, child, log_path)
        if child is not None:
            startup_s = time.perf_counter() - started
        print(f"service ready: {health['benchmark']}, {health['backend']} {health['model']}", file=sys.stderr, flush=True)
        warm = run_requests(url, texts[:args.warm], min(args.concurrency, max(args.warm, 1)), args.timeout) \
            if args.warm else []
        batches_before = wait_healthy(url, 60, child, log_path)["service"]["queue"]["batches"]
        load_before = os.getloadavg()
        began = time.perf_counter()
        results = run_requests(url, texts[args.warm:], args.concurrency, args.timeout)
        wall_s = time.perf_counter() - began
        load_after = os.getloadavg()
        after = wait_healthy(url, 60, child, log_path)
    finally:
        exit_code = stop_service(child) if child is not None else None

    latencies = [r["seconds"] for r in results]
    statuses = Counter(r["status"] for r in results)
    errors = [r for r in results if r["status"] != "200"]
    out = {
        "url": url if args.url else None,
        "service": {"started_here": child is not None, "args": serve_args, "startup_s": startup_s,
                    "load_s": health["service"].get("load_s"), "warm_up_s": health["service"].get("warm_up_s"),
                    "log": str(log_path) if log_path else None, "exit_code": exit_code,
                    "batch_size": health["service"]["queue"]["batch_size"],
                    "batches": after["service"]["queue"]["batches"] - batches_before},
        "benchmark": health["benchmark"], "backend": health["backend"], "model": health["model"],
        "case_views": health["case_views"]["used"], "ablation": health["ablation"],
        "questions": source, "distinct": len(set(texts[args.warm:])),
        "requests": args.requests, "concurrency": args.concurrency,
        "warm": [round(r["seconds"], 3) for r in warm],
        "wall_s": round(wall_s, 3), "requests_per_s": round(args.requests / wall_s, 4),
        "latency_s": {k: round(v, 3) for k, v in (("p50", percentile(latencies, 50)),
                                                   ("p95", percentile(latencies, 95)),
                                                   ("max", max(latencies)), ("mean", sum(latencies) / len(latencies)),
                                                   ("min", min(latencies)))},
        "status": dict(sorted(statuses.items())), "errors": len(errors),
        "error_messages": sorted({str(r.get("error")) for r in errors})[:5],
        "answered": sum(r["answered"] for r in results),
        "own_question": sum(r.get("own_question", False) for r in results),
        "load_average": {k: [round(x, 2) for x in v] for k, v in (("at_start", load_at_start), ("before", load_before),
                                                                  ("after", load_after))},
        "cpus": os.cpu_count(),
    }
    text = json.dumps(out, indent=2)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n", encoding="utf-8")
    lat = out["latency_s"]
    print(f"serve: {args.requests} requests, {args.concurrency} clients, {out['distinct']} questions "
          f"({out['backend']} {out['model']}): {out['requests_per_s']:.3f} req/s, latency p50 {lat['p50']:.2f} s "
          f"p95 {lat['p95']:.2f} s max {lat['max']:.2f} s, errors {out['errors']}"
          f"{' ' + json.dumps(out['status']) if out['errors'] else ''}, answered {out['answered']}/{args.requests}, "
          f"{out['service']['batches']} batches; load {load_before[0]:.2f} -> {load_after[0]:.2f} ({out['cpus']} CPUs)")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
