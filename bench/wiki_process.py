"""Benchmark: Wikipedia processing on Ray Data against a plain single-process loop, same parser, same run.

    .venv/bin/python bench/wiki_process.py                 # 200,000 generated documents
    .venv/bin/python bench/wiki_process.py --docs 20000    # a quick look

Generates (once, cached under runs/bench/) a HotpotQA-format dump, then processes it three ways into
the same tables: the loop (`xh.stages.wiki.write_tables(..., local=True)`: every step in this process), the Ray
Data pipeline with 1 worker, and with 2 workers. Prints docs/s for each and the ratios:

    per-core   pipeline docs/s per worker / loop docs/s    (target >= 0.8)
    scaling    2 workers / 1 worker                        (target >= 1.6)

for the whole job and for its first half alone (reading and parsing the files), as one JSON line at the end.
Ray's start-up is paid once before the timings and not counted.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def generate(num_docs: int, docs_per_shard: int, cache: Path) -> Path:
    from workflows import synth as synth_workflow
    from xh.config import load_config

    world = cache / f"world-{num_docs}-{docs_per_shard}"
    if not (world / "world" / "truth" / "summary.json").exists():
        shutil.rmtree(world, ignore_errors=True)
        cfg = load_config(
            None,
            [
                f"storage.root={world}",
                f"synth.num_docs={num_docs}",
                f"synth.docs_per_shard={docs_per_shard}",
                "synth.num_questions=10",
                "synth.num_claims=10",
                "synth.fever_pages=false",
            ],
        )
        print(f"generating {num_docs:,} documents ...", flush=True)
        print(json.dumps(synth_workflow.run(cfg)), flush=True)
    return world / "world" / "wiki"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--docs", type=int, default=200_000)
    parser.add_argument("--docs-per-shard", type=int, default=10_000)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--cache", default=str(ROOT / "runs" / "bench"))
    args = parser.parse_args()

    import ray

    from workflows import wiki
    from xh.config import load_config
    from xh.stages import wiki as wiki_stage
    from xh.storage.store import Store
    from xh.wiki import process

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    cache = Path(args.cache)
    dump = generate(args.docs, args.docs_per_shard, cache)
    store = Store()
    files = process.input_files([store.at(str(dump))], "hotpot")
    out = cache / "tables"

    start = time.perf_counter()
    loop = wiki_stage.write_tables(store.at(str(out / "loop")), files, "hotpot", partitions=args.partitions, local=True)
    loop_s = time.perf_counter() - start
    # the loop's first half alone, for the read-phase comparison
    process.clear_output(store.at(str(out / "loop-read")))
    start = time.perf_counter()
    for k, uri in enumerate(files):
        process.stage_file("hotpot", uri, k, store.at(str(out / "loop-read")), args.partitions, 250_000)
    loop_read_s = time.perf_counter() - start
    print(f"loop: {loop['docs'] / loop_s:,.0f} docs/s ({loop_s:.1f} s; read half {loop_read_s:.1f} s)", flush=True)

    results = {}
    for workers in (1, 2):
        cfg = load_config(
            None,
            [
                "wiki.format=hotpot",
                f"wiki.inputs=['{dump}']",
                f"wiki.output={out / f'ray-{workers}'}",
                f"wiki.workers={workers}",
                f"wiki.partitions={args.partitions}",
            ],
        )
        start = time.perf_counter()
        summary = wiki.run(cfg)
        seconds = time.perf_counter() - start
        counts = [k for k in loop if k not in (*wiki_stage.TIMINGS, "output")]
        assert {k: summary[k] for k in counts} == {k: loop[k] for k in counts}, "the pipeline and the loop disagree"
        results[workers] = {"seconds": seconds, "read_seconds": summary["read_seconds"]}
        print(
            f"ray data, {workers} worker(s): {summary['docs'] / seconds:,.0f} docs/s ({seconds:.1f} s; "
            f"read half {summary['read_seconds']:.1f} s)",
            flush=True,
        )

    docs = loop["docs"]
    rate = lambda s: docs / s  # noqa: E731
    figures = {
        "docs": docs,
        "files": len(files),
        "cpus": os.cpu_count(),
        "machine": platform.machine(),
        "loop_docs_per_s": round(rate(loop_s)),
        "ray1_docs_per_s": round(rate(results[1]["seconds"])),
        "ray2_docs_per_s": round(rate(results[2]["seconds"])),
        "per_core_ratio": round(rate(results[2]["seconds"]) / 2 / rate(loop_s), 3),
        "one_worker_vs_loop": round(loop_s / results[1]["seconds"], 3),
        "scaling_2_vs_1": round(results[1]["seconds"] / results[2]["seconds"], 3),
        "read_half": {
            "loop_docs_per_s": round(rate(loop_read_s)),
            "ray1_docs_per_s": round(rate(results[1]["read_seconds"])),
            "ray2_docs_per_s": round(rate(results[2]["read_seconds"])),
            "per_core_ratio": round(rate(results[2]["read_seconds"]) / 2 / rate(loop_read_s), 3),
            "scaling_2_vs_1": round(results[1]["read_seconds"] / results[2]["read_seconds"], 3),
        },
    }
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
