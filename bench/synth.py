"""Benchmark: the world generator (`xh.synth`) at growing N: cost per page, the driver's tasks, memory.

    taskset -c 1 .venv/bin/python bench/synth.py --docs 1000000 5230000          # sampled shards, one core
    taskset -c 1 .venv/bin/python bench/synth.py --docs 5230000 --whole          # the whole world, one process
    taskset -c 1 .venv/bin/python bench/synth.py --docs 5230000 --check-titles   # every title unique (names only)

Per N, in this one process: `write_shard` of `--shards` shards of `--docs-per-shard` pages spread over the
world (first, middle, ..., last but one; without FEVER pages, as `bench/scale.py` writes them: what
`workflows/synth.py`'s Ray tasks do), then `write_tasks_and_summary` with its defaults (up to 5,000
questions and 5,000 claims: the driver's part). With `--whole`, every shard instead (what `write_world`
does). Reports CPU seconds of the process (its bz2 threads included) and wall seconds of each part, CPU
per page, peak RSS after the pages and at the end, and the whole world's CPU seconds at the sampled rate.
With `--check-titles`, instead: the title of every page (`xh.synth.title`'s path, no pages built), checked
unique through sorted 64-bit hashes (any equal hashes are compared as titles). One JSON line per N, each
N in its own process. Pages are a function of (seed, index) alone, so sampled shards cost what any do.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

from xh import synth
from xh.synth.writing import write_tasks_and_summary


def peak_rss_mib() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def check_titles(num_docs: int, seed: int) -> dict:
    """Every title of the world, unique? Hashes in a numpy array keep memory small at millions of pages."""
    import numpy as np

    from xh.synth.layout import _layout
    from xh.synth.names import _name

    spec = synth.WorldSpec(num_docs=num_docs, seed=seed)
    layout = _layout(spec)
    cpu, wall = time.process_time(), time.perf_counter()
    hashes = np.fromiter((hash(_name(layout, i).title) for i in range(num_docs)), dtype=np.int64, count=num_docs)
    order = np.argsort(hashes, kind="stable")
    same = np.flatnonzero(hashes[order][1:] == hashes[order][:-1])
    duplicates = [
        (int(order[k]), int(order[k + 1]))
        for k in same
        if _name(layout, int(order[k])).title == _name(layout, int(order[k + 1])).title
    ]
    return {
        "docs": num_docs,
        "titles_checked": num_docs,
        "equal_hashes": len(same),
        "duplicate_titles": len(duplicates),
        "duplicates_first": [[i, j, _name(layout, i).title] for i, j in duplicates[:5]],
        "cpu_s": round(time.process_time() - cpu, 2),
        "wall_s": round(time.perf_counter() - wall, 2),
        "peak_rss_mib": peak_rss_mib(),
        "load_avg_1min": round(os.getloadavg()[0], 1),
        "cpus_allowed": len(os.sched_getaffinity(0)),
    }


def one_size(num_docs: int, args) -> dict:
    spec = synth.WorldSpec(num_docs=num_docs, seed=args.seed)
    count = synth.num_shards(spec, args.docs_per_shard)
    if args.whole:
        picked = list(range(count))
    else:  # spread over the world; the last shard may be short, so the one before it
        last = max(count - 2, 0)
        picked = sorted({round(k * last / max(args.shards - 1, 1)) for k in range(args.shards)})
    with tempfile.TemporaryDirectory(dir=args.work) as root:
        out = synth.output_under(root)
        cpu, wall = time.process_time(), time.perf_counter()
        shards = [
            synth.write_shard(spec, k, out, docs_per_shard=args.docs_per_shard, fever_pages=False) for k in picked
        ]
        pages_cpu, pages_wall = time.process_time() - cpu, time.perf_counter() - wall
        pages = sum(min(num_docs, (k + 1) * args.docs_per_shard) - k * args.docs_per_shard for k in picked)
        rss_pages = peak_rss_mib()
        cpu, wall = time.process_time(), time.perf_counter()
        summary = write_tasks_and_summary(spec, out, shards, docs_per_shard=args.docs_per_shard)
        tasks_cpu, tasks_wall = time.process_time() - cpu, time.perf_counter() - wall
    return {
        "docs": num_docs,
        "shards_written": len(picked),
        "pages_written": pages,
        "pages_cpu_s": round(pages_cpu, 2),
        "pages_wall_s": round(pages_wall, 2),
        "cpu_us_per_page": round(pages_cpu / pages * 1e6, 1),
        "questions": summary.num_questions["total"],
        "claims": summary.num_claims["total"],
        "tasks_cpu_s": round(tasks_cpu, 2),
        "tasks_wall_s": round(tasks_wall, 2),
        "peak_rss_mib_pages": rss_pages,
        "peak_rss_mib": peak_rss_mib(),
        "whole_world_cpu_s": round(pages_cpu / pages * num_docs + tasks_cpu, 1),
        "load_avg_1min": round(os.getloadavg()[0], 1),
        "cpus_allowed": len(os.sched_getaffinity(0)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--docs", type=int, nargs="+", default=[1_000_000, 5_230_000])
    parser.add_argument("--shards", type=int, default=3, help="sampled shards per N")
    parser.add_argument("--docs-per-shard", type=int, default=10_000)
    parser.add_argument("--whole", action="store_true", help="write every shard (the whole world)")
    parser.add_argument("--check-titles", action="store_true", help="only check that every title is unique")
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--work", default=None, help="folder for the temporary output")
    parser.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)  # the child process of one N
    args = parser.parse_args()
    if args.one is not None:
        result = check_titles(args.one, args.seed) if args.check_titles else one_size(args.one, args)
        print(json.dumps(result), flush=True)
        return
    # one process per N: a process's peak RSS is for its lifetime
    for num_docs in args.docs:
        subprocess.run([sys.executable, __file__, *sys.argv[1:], "--one", str(num_docs)], check=True)


if __name__ == "__main__":
    main()
