"""Benchmark: `xh serve` over HTTP at 1, 8 and 32 concurrent clients, against `Pipeline` in a plain loop.

    .venv/bin/python bench/serve.py                          # 2,000-doc world, 64 questions, MiniLM, 2 CPUs
    .venv/bin/python bench/serve.py --docs 800 --questions 32 --clients 1 8 32

Sets up a generated world and a registered `xh-bench@champion` (MiniLM backbone, untrained: latency does
not depend on the weights) as bench/score.py does, then measures in the same process and run:

    loop     the version's `Pipeline` (its recorded graph half, then its model half) called on one
             question at a time in a plain loop, with as many torch threads as a model replica has
    serve    the Serve app (`workflows.serve.serving`: ingress, graph-half replica, model replica with
             `@serve.batch`) on a local Ray cluster of `--num-cpus`, each client posting one question at a
             time to `POST /answer` on loopback, `--clients` of them at once

Each side answers the same questions (every client takes the next one not yet asked). One JSON line per
side and concurrency: p50_ms and p99_ms (latency of one question), qps (questions/s over the wall time),
and for serve, ratio (its qps / the loop's); a last line gives the machine and the load average before
and after (other work on a shared machine slows both sides, not necessarily alike).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import threading
import time
from pathlib import Path

from score import register, setup  # bench/score.py: the world, its index and the registered model


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))]


def figures(name: str, latencies: list[float], wall_s: float, **extra) -> dict:
    return {
        "name": name,
        **extra,
        "questions": len(latencies),
        "p50_ms": round(1000 * percentile(latencies, 50), 1),
        "p99_ms": round(1000 * percentile(latencies, 99), 1),
        "qps": round(len(latencies) / wall_s, 3),
    }


def loop(cfg, questions: list[dict], threads: int) -> dict:
    """The version's pipeline in this process, one question at a time."""
    import torch

    from xh.pipeline import Pipeline
    from xh.serve import graph_half, served_model
    from xh.storage.store import Store

    torch.set_num_threads(threads)
    model = served_model(cfg)
    with tempfile.TemporaryDirectory() as folder:
        graphs = graph_half(cfg, Store.from_config(cfg), model, folder)
        weights = Pipeline.load(model=f"models:/{model['name']}/{model['version']}")
        latencies, start = [], time.perf_counter()
        for q in questions:
            asked = time.perf_counter()
            built, _ = graphs.graphs([{"qid": q["_id"], "question": q["question"], "type": None}])
            weights.predict(built)
            latencies.append(time.perf_counter() - asked)
        return figures("loop", latencies, time.perf_counter() - start, threads=threads)


def clients(url: str, questions: list[dict], concurrency: int) -> dict:
    """`concurrency` threads, each posting the next unasked question until none is left."""
    from xh.serve import call

    latencies, lock, left, failed = [], threading.Lock(), list(questions), []

    def client() -> None:
        while True:
            with lock:
                if not left:
                    return
                q = left.pop()
            asked = time.perf_counter()
            status, body = call(f"{url}/answer", {"id": q["_id"], "question": q["question"]}, timeout_s=600)
            with lock:
                latencies.append(time.perf_counter() - asked)
                if status != 200 or body.get("error"):
                    failed.append(body)

    threads = [threading.Thread(target=client) for _ in range(concurrency)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failed:
        raise RuntimeError(f"{len(failed)} questions got no answer, e.g. {failed[0]}")
    return figures("serve", latencies, time.perf_counter() - start, clients=concurrency)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=2000)
    parser.add_argument("--questions", type=int, default=64, help="questions per side and concurrency")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--num-cpus", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the model replica and the loop")
    parser.add_argument("--max-batch-size", type=int, default=16)
    parser.add_argument("--backbone", default=None, help="default: the MiniLM of the offline extra")
    args = parser.parse_args()

    import ray

    from workflows.serve import serving
    from xh.config import load_config
    from xh.model.backbones import resolve_backbone
    from xh.serve import free_port
    from xh.tracking import configure

    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        ray.init(address="local", num_cpus=args.num_cpus, include_dashboard=False, log_to_driver=False)
        base, questions, model_dir = setup(work, args.docs, args.questions, resolve_backbone(args.backbone))
        register(base, work, model_dir)
        cfg = load_config(
            None,
            [
                *base,
                "serve.model=models:/xh-bench@champion",
                f"serve.port={free_port()}",
                f"serve.model_threads={args.threads}",
                f"serve.max_batch_size={args.max_batch_size}",
                f"serve.graph_cpus={args.num_cpus / 2}",
                f"serve.model_cpus={args.num_cpus / 2}",
            ],
        )
        configure(cfg.mlflow)
        questions = questions[: args.questions]
        baseline = loop(cfg, questions, args.threads)
        print(json.dumps(baseline), flush=True)
        with serving(cfg) as served:
            clients(served["url"], questions[:2], 1)  # both halves loaded, the first batch compiled
            for concurrency in args.clients:
                line = clients(served["url"], questions, concurrency)
                line["ratio"] = round(line["qps"] / baseline["qps"], 3)
                print(json.dumps(line), flush=True)
        ray.shutdown()
    print(
        json.dumps(
            {
                "name": "machine",
                "machine": f"{platform.machine()}, {os.cpu_count()} cores",
                "num_cpus": args.num_cpus,
                "docs": args.docs,
                "backbone": args.backbone or "all-MiniLM-L6-v2 (the offline extra)",
                "load_average_before": [round(x, 1) for x in load_before],
                "load_average_after": [round(x, 1) for x in os.getloadavg()],
            }
        )
    )


if __name__ == "__main__":
    main()
