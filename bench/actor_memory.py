"""Benchmark: a query actor's own memory against corpus size, in one plain process (no Ray in the measured one).

    .venv/bin/python bench/actor_memory.py --docs 300000 1000000 --work /tmp/worlds        # build once, measure
    .venv/bin/python bench/actor_memory.py --docs 300000 1000000 --work /tmp/worlds --tracemalloc 15
    .venv/bin/python bench/actor_memory.py --docs 300000 1000000 --work /tmp/worlds --ray 1    # through Ray Data

A world of N documents is built once under `--work/<N>` (as `bench/scale.py` builds it: synth, wiki, index
with `--shards` shards, the node's retrieval layout, a path scorer trained on `--path-questions`
questions) and kept: a second run only measures. Then, per N, a fresh process (so that no size inherits
another's heap) constructs what `xh.stages.retrieve._QueryActor` constructs, with the same arguments as
`retrieve.run` gives it, and calls it on the world's first `--questions` questions in batches of
`retrieve.batch_size`, as Ray Data would. It reads its own anonymous memory (`/proc/self/smaps_rollup`,
`Anonymous:`: what the process holds itself, not the mapped layout) before the actor, after it is built,
and after each batch, and the peak between readings (a sampling thread, every 10 ms). With
`--tracemalloc K`, Python's allocations are traced too and the K largest allocation sites held at the end
are printed (numpy arrays included), with the peak traced. One JSON line per N, then a summary with the
growth exponent (least squares in log N) of the anonymous memory after the last batch and of its peak.
The candidates' digest says whether two versions of the code gave the same rows (run each with its
tree on `PYTHONPATH`).

With `--ray W`, instead: `retrieve.run` on the kept world, its `W` query actors in Ray Data's actor pool
on a local cluster, sampled from /proc every `--every` seconds as `bench/scale.py` samples a stage (the
largest query actor's peak RSS, PSS and anonymous memory). A sample of every process takes tens of
milliseconds on a busy machine, so a working array that lives for less is seen by chance only: the
one-process figures are the exact ones. Ray's workers put the driver's working folder first on their
import path: run from the tree whose code is measured.

With `--docstore`, instead: batch scoring's graph half's lookups (`xh.graph.docstore.DocStore`, its
node copy built under the world's folder on first use) of the candidate documents of each batch of
questions, from the candidates a `--ray` run wrote: anonymous memory and the growth of Arrow's pool peak.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

RESULT = "actor-memory-result "
BUILT = "built.json"  # written last into a world's folder: the world is complete
QUESTIONS = "questions.parquet"  # the world's questions as the query actors get them (qid, question)


def anon_bytes() -> int:
    """This process's anonymous memory (its heap, its own arrays; no mapped file)."""
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            if line.startswith("Anonymous:"):
                return int(line.split()[1]) * 1024
    return 0


def mib(n: int) -> float:
    return round(n / 2**20, 1)


class PeakAnon:
    """The largest `anon_bytes()` seen every `every` seconds, from a background thread (`reset` to start over)."""

    def __init__(self, every: float = 0.01):
        self.every, self.peak, self._stop = every, anon_bytes(), threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.peak = max(self.peak, anon_bytes())

    def reset(self) -> int:
        """The peak since the last reset (this reading included), and start over."""
        peak, self.peak = max(self.peak, anon_bytes()), anon_bytes()
        return peak

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def settings(work: Path, num_docs: int, args) -> list[str]:
    """The config overrides of the world of `num_docs` documents under `work` (those of `bench/scale.py`)."""
    from scale import world_settings

    return [*world_settings(work, num_docs, args), f"retrieve.path_scorer={work / 'models' / 'path-scorer'}", *args.set]


def build(work: Path, num_docs: int, args) -> dict:
    """The world, its index, the node's layout and a path scorer, under `work` (kept)."""
    import ray

    from workflows import retrieve, synth, wiki
    from xh.config import load_config
    from xh.stages.retrieve import prepare_layouts

    cfg = load_config(None, settings(work, num_docs, args))
    questions = work / "world" / "hotpot" / "questions.json"
    train_file = work / "paths-questions.json"
    r = cfg.retrieve
    training = r.model_copy(update={"questions": str(train_file), "path_scorer_output": r.path_scorer})
    ray.init(address="local", num_cpus=args.num_cpus, include_dashboard=False, log_to_driver=False)
    seconds = {}
    try:
        for name, step in (
            ("synth", lambda: synth.run(cfg)),
            ("wiki", lambda: wiki.run(cfg)),
            ("index", lambda: retrieve.index(cfg)),
            ("layout", lambda: prepare_layouts(str(work / "index" / "bm25"), str(work / "tables"))),
            (
                "paths",
                lambda: (
                    train_file.write_text(json.dumps(json.loads(questions.read_text())[: args.path_questions])),
                    retrieve.paths(cfg.model_copy(update={"retrieve": training})),
                ),
            ),
        ):
            start = time.perf_counter()
            step()
            seconds[name] = round(time.perf_counter() - start, 1)
            print(f"[actor_memory] N={num_docs:,} built {name} in {seconds[name]} s", flush=True)
    finally:
        ray.shutdown()
    done = {"docs": num_docs, "seconds": seconds, "settings": settings(work, num_docs, args)}
    (work / BUILT).write_text(json.dumps(done, indent=1))
    return done


def write_questions(work: Path, num_docs: int, args) -> None:
    """The world's questions as the query actors get them, in Arrow (parsed here, not in the measured process)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from xh.config import load_config
    from xh.inputs.questions import read_hotpot_questions
    from xh.storage.store import Store

    cfg = load_config(None, settings(work, num_docs, args))
    rows, _ = read_hotpot_questions(Store.from_config(cfg).at(cfg.retrieve.questions))
    pq.write_table(pa.table({k: [q[k] for q in rows] for k in ("qid", "question")}), work / QUESTIONS)


def measure(work: Path, num_docs: int, args) -> dict:
    """The query actor of the world under `work`, built and called on its questions in this process."""
    if args.tracemalloc:
        import tracemalloc

        tracemalloc.start(8)
    peak = PeakAnon()
    before = anon_bytes()
    import pyarrow.parquet as pq

    from xh.config import load_config
    from xh.stages.retrieve import _index, _QueryActor, _tables
    from xh.storage.store import Store

    cfg = load_config(None, settings(work, num_docs, args))
    store = Store.from_config(cfg)
    r = cfg.retrieve
    imported = anon_bytes()
    # the batches as Ray Data hands them over: qid and question only, in Arrow (parsing the question file
    # here would leave the heap of a JSON parse in the figures)
    questions = pq.read_table(work / QUESTIONS).slice(0, args.questions)
    read = anon_bytes()
    start = time.perf_counter()
    # what `xh.stages.retrieve.candidates` hands Ray Data's actor pool (no searcher: every shard mapped here)
    actor = _QueryActor(_index(cfg, store), _tables(cfg, store), r, max(1, round(r.cpus_per_worker)), None)
    load_seconds = time.perf_counter() - start
    loaded = anon_bytes()
    peak.reset()
    batches, candidates, digest = [], 0, hashlib.sha256()
    start = time.perf_counter()
    for i in range(0, questions.num_rows, r.batch_size):
        out = actor(questions.slice(i, r.batch_size))
        candidates += out.num_rows
        batches.append({"after": anon_bytes(), "peak": peak.reset()})
        # the candidates' digest (the same with another version of the code?), outside the figures
        digest.update(json.dumps(out.to_pylist()).encode())
        del out
        peak.reset()
    seconds = time.perf_counter() - start
    peak.stop()
    result = {
        "docs": num_docs,
        "questions": questions.num_rows,
        "batch_size": r.batch_size,
        "shards": len(actor.retriever.shards),
        "candidates": candidates,
        "candidates_sha256": digest.hexdigest()[:16],
        "anon_mib": {
            "start": mib(before),
            "imported": mib(imported),
            "questions_read": mib(read),
            "loaded": mib(loaded),
            "after_last_batch": mib(batches[-1]["after"]) if batches else None,
            "peak_during_batches": mib(max(b["peak"] for b in batches)) if batches else None,
            "after_each_batch": [mib(b["after"]) for b in batches],
            "peak_each_batch": [mib(b["peak"]) for b in batches],
        },
        "load_seconds": round(load_seconds, 2),
        "questions_per_s": round(questions.num_rows / seconds, 1) if seconds else None,
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }
    if args.tracemalloc:
        import tracemalloc

        snapshot = tracemalloc.take_snapshot()
        result["traced_mib"] = {
            "held": mib(tracemalloc.get_traced_memory()[0]),
            "peak": mib(tracemalloc.get_traced_memory()[1]),
        }
        result["largest_sites"] = [
            {
                "mib": mib(stat.size),
                "count": stat.count,
                "where": [f"{f.filename}:{f.lineno}" for f in stat.traceback][-4:],
            }
            for stat in snapshot.statistics("traceback")[: args.tracemalloc]
        ]
    return result


def measure_ray(work: Path, num_docs: int, args) -> dict:
    """`retrieve.run` on the world under `work`, its query actors in Ray Data's actor pool on a local cluster
    (`--ray W` actors), sampled as `bench/scale.py` samples a stage: the largest query actor's peak RSS, PSS
    and anonymous memory."""
    import ray
    from procs import ProcessSampler

    from workflows import retrieve
    from xh.config import load_config

    cfg = load_config(None, settings(work, num_docs, args))
    r = cfg.retrieve.model_copy(update={"workers": args.ray})
    cfg = cfg.model_copy(update={"retrieve": r})
    ray.init(address="local", num_cpus=args.num_cpus, include_dashboard=False, log_to_driver=False)
    try:
        with ProcessSampler(every=args.every) as sampled:
            start = time.perf_counter()
            retrieve.run(cfg)
            seconds = time.perf_counter() - start
    finally:
        ray.shutdown()
    actors = [v for k, v in sampled.kind_peaks().items() if "_QueryActor" in k]
    return {
        "docs": num_docs,
        "questions": args.questions,
        "query_actors": args.ray,
        "query_actor_mib": max(actors, key=lambda v: v["rss"]) if actors else None,
        "workers_total_peak_mib": sampled.workers_total,
        "seconds": round(seconds, 1),
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }


def measure_docstore(work: Path, num_docs: int, args) -> dict:
    """Batch scoring's graph half's lookups (`xh.graph.docstore.DocStore`) of the world's candidates (a
    `--ray` run writes them), the candidate documents of `retrieve.batch_size` questions at a time."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.dataset as pads

    from xh.config import load_config
    from xh.graph.docstore import DocStore

    batch_size = load_config(None, settings(work, num_docs, args)).retrieve.batch_size
    candidates = pads.dataset(str(work / "retrieval" / "candidates"), format="parquet").to_table(
        columns=["qid", "doc_id"]
    )
    qids = pc.unique(candidates["qid"])[: args.questions]
    store = DocStore.open(str(work / "tables"), str(work / "doc-cache"))  # built by the first run
    peak, loaded, digest = PeakAnon(), anon_bytes(), hashlib.sha256()
    pool_before = pa.default_memory_pool().max_memory()
    peak.reset()
    start = time.perf_counter()
    for i in range(0, len(qids), batch_size):
        wanted = candidates.filter(pc.is_in(candidates["qid"], qids[i : i + batch_size]))["doc_id"]
        docs, links = store.lookup(wanted.to_pylist())
        digest.update(json.dumps([sorted(docs.items()), sorted(links.items())]).encode())
    seconds = time.perf_counter() - start
    peak.stop()
    return {
        "docs": num_docs,
        "questions": len(qids),
        "anon_mib": {"loaded": mib(loaded), "peak_during_lookups": mib(peak.reset()), "after": mib(anon_bytes())},
        "arrow_pool_peak_growth_mib": mib(pa.default_memory_pool().max_memory() - pool_before),
        "lookups_sha256": digest.hexdigest()[:16],
        "seconds": round(seconds, 2),
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }


def main() -> None:
    from scale import slope

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, nargs="+", required=True)
    parser.add_argument("--work", required=True, help="folder of the worlds, one per N, kept between runs")
    parser.add_argument("--questions", type=int, default=10_000, help="questions generated, and retrieved here")
    parser.add_argument("--path-questions", type=int, default=1000, help="questions the path scorer is trained on")
    parser.add_argument("--shards", type=int, default=4, help="BM25 index shards")
    parser.add_argument("--docs-per-shard", type=int, default=10_000, help="pages per generated dump shard")
    parser.add_argument("--num-cpus", type=int, default=2, help="of the Ray cluster that builds a world")
    parser.add_argument("--tracemalloc", type=int, default=0, metavar="K", help="trace, print the K largest sites")
    parser.add_argument(
        "--ray", type=int, default=0, metavar="W", help="instead: retrieve.run with W query actors on Ray, sampled"
    )
    parser.add_argument(
        "--docstore",
        action="store_true",
        help="instead: the graph half's doc store lookups of a --ray run's candidates",
    )
    parser.add_argument("--every", type=float, default=0.2, help="with --ray: seconds between samples")
    parser.add_argument("--build-only", action="store_true", help="build the missing worlds, measure nothing")
    parser.add_argument("--set", action="append", default=[], help="extra config overrides, a.b=c (repeatable)")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # measure one size, in this process
    parser.add_argument("--build-one", action="store_true", help=argparse.SUPPRESS)  # build one, in this process
    args = parser.parse_args()
    root = Path(args.work)
    if args.build_one:
        build(root / str(args.docs[0]), args.docs[0], args)
        return
    if args.one:
        # the layout the build wrote is found here as the query actors find theirs
        os.environ["XH_NODE_CACHE"] = str(root / str(args.docs[0]) / "node-cache")
        how = measure_ray if args.ray else measure_docstore if args.docstore else measure
        print(RESULT + json.dumps(how(root / str(args.docs[0]), args.docs[0], args)), flush=True)
        return
    results = []
    for n in sorted(args.docs):
        work = root / str(n)
        if not (work / BUILT).exists():
            work.mkdir(parents=True, exist_ok=True)
            # in a child: the building driver's memory and Ray session end with it
            env = {**os.environ, "XH_NODE_CACHE": str(work / "node-cache")}  # Ray's workers inherit it
            done = subprocess.run([sys.executable, __file__, *sys.argv[1:], "--build-one", "--docs", str(n)], env=env)
            if done.returncode:
                sys.exit(f"building the world of {n} documents failed (exit {done.returncode})")
        if not (work / QUESTIONS).exists():
            write_questions(work, n, args)
        if args.build_only:
            continue
        child = subprocess.run(
            [sys.executable, __file__, *sys.argv[1:], "--one", "--docs", str(n)], stdout=subprocess.PIPE, text=True
        )
        lines = [line for line in child.stdout.splitlines() if line.startswith(RESULT)]
        if child.returncode or not lines:
            sys.exit(f"measuring {n} documents failed (exit {child.returncode})")
        results.append(json.loads(lines[-1][len(RESULT) :]))
        print(json.dumps({"name": "actor_memory", **results[-1]}), flush=True)
    if args.docstore:
        pass
    elif len(results) > 1 and args.ray:
        sizes = [r["docs"] for r in results]
        print(
            json.dumps(
                {
                    "name": "actor_memory_ray_summary",
                    "docs": sizes,
                    "query_actors": args.ray,
                    "query_actor_anon_mib": [r["query_actor_mib"]["anon"] for r in results],
                    "exponent_anon": slope(sizes, [r["query_actor_mib"]["anon"] for r in results]),
                    "finished_at": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                }
            ),
            flush=True,
        )
    elif len(results) > 1:
        sizes = [r["docs"] for r in results]
        print(
            json.dumps(
                {
                    "name": "actor_memory_summary",
                    "docs": sizes,
                    "anon_after_last_batch_mib": [r["anon_mib"]["after_last_batch"] for r in results],
                    "anon_peak_mib": [r["anon_mib"]["peak_during_batches"] for r in results],
                    "exponent_after_last_batch": slope(sizes, [r["anon_mib"]["after_last_batch"] for r in results]),
                    "exponent_peak": slope(sizes, [r["anon_mib"]["peak_during_batches"] for r in results]),
                    "exponent_loaded": slope(sizes, [r["anon_mib"]["loaded"] for r in results]),
                    "finished_at": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
