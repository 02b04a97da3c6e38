"""Benchmark: how many real tokens a second the training worker's input chain can feed its step loop.

    .venv/bin/python bench/train_input.py                      # ../shared/data's HotpotQA sample, 1 and 2 processes
    .venv/bin/python bench/train_input.py --processes 12 --step-python-ms 15   # a 16-core GPU machine

The chain is the training loop's own (`xh.train.loop`): chunks of `--batch-graphs` graph rows as the
Ray Data shard hands them (pyarrow tables) -> `xh.graph.encode.GraphEncoder` in `--processes` processes
-> token batches (`xh.train.batching.BatchLayout`: `fill_rows` and `pack`) -> `xh.train.prefetch.Prefetcher`
-> a consumer standing in for the training step, which holds the GIL for `--step-python-ms` a batch as
a step's Python does (launching a GPU step's kernels). No model runs: the figure is the ceiling the
input puts on training throughput, whatever the GPU.

Two systems, alternated, the best of `--repeat` kept:

    project    the tables go to the encoder processes, which convert them; `fill_rows` gallops to each
               batch's run of graphs (a few packings a batch); first fit places a length's nodes in one
               pass over the rows, and `pack` places every token with a few numpy calls
    baseline   the loop before: tables converted to dicts in the training process, then one packing per
               graph (`fill_rows_one_at_a_time`: the same batches), with the first fit that scanned the
               rows for every node (`first_fit_scanning` below, swapped in). Its `pack` is today's, so
               the ratio leaves out what `pack`'s own change gained

One JSON line per (processes, system) and one ratio line per processes: project / baseline real tokens/s.
Every line is printed as soon as it is measured, after a first `plan` line (the machine and the
settings), so that a run cut short by a time limit still hands back what it measured.
`encode`: one encoder process's rate alone (the project's encoder, in this process).
`ceiling/*` lines: the training process's own share of the chain alone (the chunks encoded and pickled
beforehand, as the encoder processes would hand them back): converting (baseline only), unpickling,
grouping and packing. That is the most any number of encoder processes can feed; on a 2-core machine it
is what shows the difference a 16-core GPU machine's encoder processes would see.
Graphs: the distractor-setting graphs of `--hotpot` (built in this process), repeated to `--graphs`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DEFAULT_HOTPOT = ROOT.parent / "shared" / "data" / "hotpotqa" / "hotpot_train_sample500.json"


def graph_rows(hotpot: Path, graphs: int) -> list[dict]:
    from xh.config import GraphsConfig
    from xh.graph.hotpot import distractor_graphs, read_distractor_questions

    items, _ = read_distractor_questions(str(hotpot))
    rows = [o.graph for o in distractor_graphs(items, GraphsConfig()) if o.graph is not None]
    return [rows[i % len(rows)] | {"qid": f"{rows[i % len(rows)]['qid']}-{i}"} for i in range(graphs)]


def first_fit_scanning(lengths, capacity: int) -> list[list[int]]:
    """The library's first fit before 2026-11-27: each item, longest first, scans the rows from the first."""
    bins: list[list[int]] = []
    room: list[int] = []
    for item in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        for b, free in enumerate(room):
            if lengths[item] <= free:
                bins[b].append(item)
                room[b] -= lengths[item]
                break
        else:
            bins.append([item])
            room.append(capacity - lengths[item])
    return bins


@contextlib.contextmanager
def system_packing(system: str):
    """The baseline's first fit in `xh.model.packing` while the baseline runs (the training process's own)."""
    from xh.model import packing

    library = packing.first_fit_decreasing
    if system == "baseline":
        packing.first_fit_decreasing = first_fit_scanning
    try:
        yield
    finally:
        packing.first_fit_decreasing = library


def feed(table, args, tokenizer, processes: int, system: str) -> dict:
    """Drain the chain once; real tokens/s, batches and the consumer's wait for batches."""
    from xh.config import load_config
    from xh.graph.encode import GraphEncoder
    from xh.model import packing
    from xh.train import batching
    from xh.train.prefetch import Prefetcher

    cfg = load_config(
        None,
        [
            f"model.max_node_tokens={args.max_node_tokens}",
            f"train.batch_tokens={args.batch_tokens}",
            "train.batching=tokens",
        ],
    )
    layout = batching.BatchLayout.of(cfg)
    chunks = (table.slice(i, args.batch_graphs) for i in range(0, table.num_rows, args.batch_graphs))
    if system == "baseline":
        chunks = (chunk.to_pylist() for chunk in chunks)
    grouping = packing.fill_rows if system == "project" else packing.fill_rows_one_at_a_time
    real = batches = 0
    busy = args.step_python_ms / 1000
    with GraphEncoder(tokenizer, args.max_node_tokens, processes) as encoder, system_packing(system):
        encoder.map([table.slice(0, 1)]).__next__()  # the processes started and warm: not timed
        start = time.perf_counter()
        graphs = (g for chunk in encoder.map(chunks) for g in chunk)
        made = (layout.make(group) for group in grouping(graphs, layout.rows, layout.row_tokens))
        with Prefetcher(made, depth=2) as prefetched:
            for batch in prefetched:
                until = time.perf_counter() + busy
                while time.perf_counter() < until:  # the step's Python: holds the GIL
                    pass
                real += batch.num_real_tokens
                batches += 1
            seconds = time.perf_counter() - start
            wait = prefetched.wait_seconds
    return {
        "real_tokens_per_s": round(real / seconds),
        "batches": batches,
        "seconds": round(seconds, 2),
        "wait_fraction": round(wait / seconds, 3),
    }


def trainer_ceiling(table, args, tokenizer, system: str) -> dict:
    """Real tokens/s of the training process's share of the chain, encoding done beforehand."""
    import pickle

    from xh.config import load_config
    from xh.graph.encode import encode_graphs
    from xh.model import packing
    from xh.train import batching

    cfg = load_config(
        None,
        [
            f"model.max_node_tokens={args.max_node_tokens}",
            f"train.batch_tokens={args.batch_tokens}",
            "train.batching=tokens",
        ],
    )
    layout = batching.BatchLayout.of(cfg)
    chunks = [table.slice(i, args.batch_graphs) for i in range(0, table.num_rows, args.batch_graphs)]
    blobs = [pickle.dumps(encode_graphs(chunk, tokenizer, args.max_node_tokens)) for chunk in chunks]
    grouping = packing.fill_rows if system == "project" else packing.fill_rows_one_at_a_time

    def graphs():
        for chunk, blob in zip(chunks, blobs):
            if system == "baseline":
                chunk.to_pylist()  # the loop converted each chunk in the training process
            yield from pickle.loads(blob)

    start = time.perf_counter()
    with system_packing(system):
        made = [layout.make(group) for group in grouping(graphs(), layout.rows, layout.row_tokens)]
    seconds = time.perf_counter() - start
    real = sum(batch.num_real_tokens for batch in made)
    return {"real_tokens_per_s": round(real / seconds), "batches": len(made), "seconds": round(seconds, 2)}


def encoding_rate(table, args, tokenizer) -> dict:
    """Real tokens/s of one encoder process's work (`encode_graphs` of the chunks, here), best of `--repeat`:
    a core's share of the feed, which encoder processes multiply."""
    from xh.graph.encode import encode_graphs

    chunks = [table.slice(i, args.batch_graphs) for i in range(0, table.num_rows, args.batch_graphs)]
    best = 0.0
    for _ in range(args.repeat):
        start = time.perf_counter()
        tokens = sum(g.num_tokens for chunk in chunks for g in encode_graphs(chunk, tokenizer, args.max_node_tokens))
        best = max(best, tokens / (time.perf_counter() - start))
    return {"real_tokens_per_s": round(best), "processes": 1}


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hotpot", type=Path, default=DEFAULT_HOTPOT, help="HotpotQA distractor-format JSON")
    parser.add_argument("--graphs", type=int, default=2000, help="graphs fed (the file's, repeated)")
    parser.add_argument(
        "--processes", type=int, nargs="*", default=[1, 2], help="encoder processes (none: the ceiling alone)"
    )
    parser.add_argument("--max-node-tokens", type=int, default=256)
    parser.add_argument("--batch-tokens", type=int, default=32768)
    parser.add_argument("--batch-graphs", type=int, default=16, help="graphs a chunk of the data shard")
    parser.add_argument("--step-python-ms", type=float, default=10.0, help="GIL held by the step, a batch")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--tokenizer", default=None, help="a tokenizer folder (default: the offline MiniLM's)")
    args = parser.parse_args(argv)
    if not args.hotpot.exists():
        parser.error(f"{args.hotpot} does not exist (../shared/data's HotpotQA sample, or --hotpot FILE)")

    import pyarrow as pa

    from xh.model.backbones import resolve_backbone
    from xh.model.saved import load_tokenizer

    tokenizer = load_tokenizer(args.tokenizer or resolve_backbone(None))
    machine = {"cpus": os.cpu_count(), "load_average": os.getloadavg()[0], "python": platform.python_version()}
    records: list[dict] = []

    def emit(record: dict) -> None:
        records.append(record)
        print(json.dumps(record), flush=True)

    emit({"name": "plan", "graphs": args.graphs, "encoder_processes": args.processes, "repeat": args.repeat, **machine})
    table = pa.Table.from_pylist(graph_rows(args.hotpot, args.graphs))
    best_ceiling: dict[str, dict] = {}
    for _ in range(args.repeat):
        for system in ("baseline", "project"):
            figures = trainer_ceiling(table, args, tokenizer, system)
            if system not in best_ceiling or figures["real_tokens_per_s"] > best_ceiling[system]["real_tokens_per_s"]:
                best_ceiling[system] = figures
    for system, figures in best_ceiling.items():
        emit({"name": f"ceiling/{system}", **figures})
    ceiling = best_ceiling["project"]["real_tokens_per_s"] / best_ceiling["baseline"]["real_tokens_per_s"]
    emit({"name": "ratio", "processes": "ceiling", "project_over_baseline": round(ceiling, 3)})
    emit({"name": "encode", **encoding_rate(table, args, tokenizer)})
    for processes in args.processes:
        best: dict[str, dict] = {}
        for _ in range(args.repeat):
            for system in ("baseline", "project"):
                figures = feed(table, args, tokenizer, processes, system)
                if system not in best or figures["real_tokens_per_s"] > best[system]["real_tokens_per_s"]:
                    best[system] = figures
        for system, figures in best.items():
            emit({"name": f"input/{system}", "processes": processes, **figures})
        ratio = best["project"]["real_tokens_per_s"] / best["baseline"]["real_tokens_per_s"]
        emit({"name": "ratio", "processes": processes, "project_over_baseline": round(ratio, 3)})
    emit({"name": "machine", **machine, "load_average_after": os.getloadavg()[0]})
    return records


if __name__ == "__main__":
    main()
