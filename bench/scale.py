"""Benchmark: every stage at growing corpus sizes: time, throughput per core, memory, bytes written, growth.

    .venv/bin/python bench/scale.py --docs 100000 300000 1000000 --questions 10000
    .venv/bin/python bench/scale.py --docs 10000 30000 --questions 1000 --score-questions 200   # quick

For each N, a generated world of N documents (`xh.synth`, written shard by shard by Ray tasks, never
whole in memory) goes through the stages' own drivers on one local Ray cluster of `--num-cpus` CPUs:

    synth     workflows.synth.run      the world: wiki dump shards + Q questions
    wiki      workflows.wiki.run       dump -> docs / links / redirects / anchors / quarantine
    index     retrieve.index           docs -> the sharded BM25 index (`--shards`)
    layout    prepare_layouts          the node's one copy of the retrieval state (xh.retrieval.shared)
    fanout    (with --shard-budget-gib) BM25 top-k of the Q questions through shard actors grouped under
              the budget, merged, against one process over every shard: `identical`
    retrieve_1actor                    the retrieval below with one query actor (N <= --one-actor-max)
    retrieve  retrieve.run             Q questions -> candidates (BM25, entity links, expansion, the
                                       path scorer when `--set retrieve.path_scorer=...`), 2 query actors
    graphs    graphs.build             candidates -> one evidence graph per question
    score     score.run                `--score-questions` new questions -> retrieval, graphs, the XH model
                                       (an untrained MiniLM XH, registered first: speed does not depend
                                       on the weights) -> predictions

Per stage and N: seconds; items (docs or questions) per second per core; peak RSS of the driver and of
the largest Ray worker, sampled with /proc every 0.2 s while the stage runs; bytes the stage wrote; the
load average when it ended. Memory shared between processes (the retrieval layout every query actor
maps, Ray's object store) is resident in each that maps it, so per process kind it also reports the
largest process's PSS and anonymous memory (`/proc/PID/smaps_rollup`: PSS divides a shared page among
its processes, anonymous memory is the process's own heap), and for the node the peak of the sum of
every Ray worker's PSS (each shared page counted once) beside the sum of their RSS. The query actor's
own memory is its anonymous memory.
Across N: each stage's growth exponent (slope of log seconds against log N, least squares; 1.0 is
linear) and of its largest worker's peak RSS. The index: bytes per shard on disk and in memory, per
document, and the shards 5.23M documents (HotpotQA's Wikipedia) need for a shard to stay under
`--shard-budget-gib` in memory. Prints one JSON line per N as it finishes, then one summary line.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from procs import ProcessSampler

HOTPOT_WIKI_DOCS = 5_233_329  # abstracts in HotpotQA's processed Wikipedia
RESULT = "scale-result "  # the line a one-size child process hands its figures back on


def folder_bytes(*folders: Path) -> int:
    return sum(f.stat().st_size for folder in folders if folder.exists() for f in folder.rglob("*") if f.is_file())


def mib(n: int) -> float:
    return round(n / 2**20, 1)


def register_model(base: list[str], work: Path, backbone: str) -> None:
    """An untrained XH model on `backbone`, registered as `xh-scale@champion` (signature from the built graphs)."""
    import mlflow

    from xh.config import load_config
    from xh.model.xh import XHModel
    from xh.registry.register import log_and_register
    from xh.tracking import configure

    cfg = load_config(None, base)
    XHModel.from_backbone(cfg.model).save_pretrained(work / "model")
    configure(cfg.mlflow)
    with mlflow.start_run() as run:
        pass
    log_and_register(
        str(work / "model"), run_id=run.info.run_id, cfg=cfg, metrics={}, graphs_uri=str(work / "graphs" / "hotpot")
    )
    mlflow.MlflowClient().set_registered_model_alias("xh-scale", "champion", "1")


def index_figures(work: Path, num_docs: int, shard_budget: float) -> dict:
    """The index's bytes per shard on disk and in memory, and the shards HotpotQA's Wikipedia needs."""
    from xh.retrieval.index import read_manifest
    from xh.retrieval.shared import node_state

    index = str(work / "index" / "bm25")
    manifest = read_manifest(index)
    state = node_state(index, str(work / "tables"))  # mapped: sizes without a copy in this process
    shards = state.shards
    disk = [folder_bytes(work / "index" / "bm25" / s["path"]) for s in manifest["shards"]]
    memory = [s.memory_bytes() for s in shards]
    per_doc = sum(memory) / num_docs
    layout = state.folder
    return {
        "layout_mib": mib(folder_bytes(layout)),
        "layout_parts_mib": {p.name: mib(folder_bytes(p)) for p in sorted(layout.iterdir()) if p.is_dir()},
        "shards": len(shards),
        "disk_mib_per_shard": [mib(b) for b in disk],
        "memory_mib_per_shard": [mib(b) for b in memory],
        "disk_bytes_per_doc": round(sum(disk) / num_docs, 1),
        "memory_bytes_per_doc": round(per_doc, 1),
        "shards_for_hotpot_wikipedia": math.ceil(HOTPOT_WIKI_DOCS * per_doc / shard_budget),
    }


def world_settings(work: Path, num_docs: int, args) -> list[str]:
    """The config overrides of a generated world of `num_docs` documents under `work`: its synth, wiki and
    retrieval settings and local MLflow (`bench/actor_memory.py` builds its worlds with them too)."""
    return [
        f"storage.root={work}",
        f"ray.num_cpus={args.num_cpus}",
        f"mlflow.tracking_uri=sqlite:///{work / 'mlflow.db'}",
        f"mlflow.artifact_location={work / 'artifacts'}",
        f"synth.num_docs={num_docs}",
        f"synth.num_questions={args.questions}",
        "synth.num_claims=0",
        "synth.fever_pages=false",
        f"synth.docs_per_shard={args.docs_per_shard}",
        f"wiki.inputs=[{work / 'world' / 'wiki'}]",
        f"retrieve.shards={args.shards}",
        f"retrieve.questions={work / 'world' / 'hotpot' / 'questions.json'}",
    ]


def one_size(args, num_docs: int, backbone: str) -> dict:
    import ray

    from workflows import graphs, retrieve, score, synth, wiki
    from xh.config import load_config
    from xh.stages.retrieve import prepare_layouts

    with tempfile.TemporaryDirectory(dir=args.work) as tmp:
        work = Path(tmp)
        questions_file = work / "world" / "hotpot" / "questions.json"
        base = [
            *world_settings(work, num_docs, args),
            f"model.backbone={backbone}",
            "model.max_node_tokens=128",
            "train.register_as=xh-scale",
            f"score.input={work / 'incoming'}",
            "score.model=models:/xh-scale@champion",
            *args.set,
        ]
        cfg = load_config(None, base)
        # the node's retrieval layout (xh.retrieval.shared) goes with the world; workers inherit the variable
        os.environ["XH_NODE_CACHE"] = str(work / "node-cache")
        ray.init(address="local", num_cpus=args.num_cpus, include_dashboard=False, log_to_driver=False)

        def score_input():
            questions = json.loads(questions_file.read_text())[: args.score_questions]
            (work / "incoming").mkdir()
            (work / "incoming" / "questions.jsonl").write_text(
                "".join(json.dumps({"qid": q["_id"], "question": q["question"]}) + "\n" for q in questions)
            )
            register_model(base, work, backbone)

        scorer = str(work / "models" / "path-scorer")
        train_file = work / "paths-questions.json"
        training = cfg.retrieve.model_copy(update={"questions": str(train_file), "path_scorer_output": scorer})

        def fit_paths():
            """A path scorer trained on the first `--path-questions` questions, as `xh retrieve paths` trains it."""
            train_file.write_text(json.dumps(json.loads(questions_file.read_text())[: args.path_questions]))
            return retrieve.paths(cfg.model_copy(update={"retrieve": training}))

        def retrieval(workers: int):
            update = {"workers": workers, "path_scorer": scorer if args.path_questions else None}
            return cfg.model_copy(update={"retrieve": cfg.retrieve.model_copy(update=update)})

        one_actor, two_actors = retrieval(1), retrieval(2)
        index_uri, tables_uri = str(work / "index" / "bm25"), str(work / "tables")
        stages = [
            ("synth", lambda: synth.run(cfg), num_docs, ["world"]),
            ("wiki", lambda: wiki.run(cfg), num_docs, ["tables"]),
            ("index", lambda: retrieve.index(cfg), num_docs, ["index"]),
            # the node's one copy of the retrieval state, laid out once (the query actors map it)
            ("layout", lambda: prepare_layouts(index_uri, tables_uri), num_docs, ["node-cache"]),
        ]
        if args.path_questions:
            stages.append(("paths", fit_paths, args.path_questions, ["models"]))
        if num_docs <= args.one_actor_max:  # the same retrieval with one query actor, to compare memory
            stages.append(("retrieve_1actor", lambda: retrieve.run(one_actor), args.questions, []))
        stages += [
            ("retrieve", lambda: retrieve.run(two_actors), args.questions, ["retrieval"]),
            ("graphs", lambda: graphs.build(cfg), args.questions, ["graphs"]),
            ("score", lambda: score.run(cfg), args.score_questions, ["predictions"]),
        ]
        if args.shard_budget_gib_set:
            stages.insert(4, ("fanout", lambda: fanout_check(args, cfg, work), args.questions, []))
        if args.stages:
            stages = [st for st in stages if st[0] in args.stages or st[0] in ("synth", "wiki", "index", "layout")]
        out: dict = {"docs": num_docs, "questions": args.questions, "stages": {}}
        for name, fn, items, folders in stages:
            if name == "score":
                score_input()
            print(f"[scale] N={num_docs:,} {name}: started {time.strftime('%H:%M:%S UTC', time.gmtime())}", flush=True)
            before = folder_bytes(*(work / f for f in folders))
            with ProcessSampler() as rss:
                start = time.perf_counter()
                result = fn()
                seconds = time.perf_counter() - start
            kinds = rss.kind_peaks()
            out["stages"][name] = {
                "seconds": round(seconds, 2),
                "items": items,
                "per_s_per_core": round(items / seconds / args.num_cpus, 1),
                "driver_peak_mib": mib(rss.driver),
                "worker_peak_mib": mib(rss.worker),
                "largest_worker": rss.worker_name,
                "workers_total_peak_mib": rss.workers_total,
                "written_mib": mib(folder_bytes(*(work / f for f in folders)) - before),
                "cpu_seconds": rss.cpu_seconds(),
                "load_average": [round(x, 2) for x in os.getloadavg()],
                "memory_by_kind": kinds,
            }
            actors = [v for k, v in kinds.items() if "_QueryActor" in k]
            if actors:
                out["stages"][name]["query_actor"] = max(actors, key=lambda v: v["rss"])
            if name == "fanout":
                out["fanout"] = result
            print(f"[scale] N={num_docs:,} {name}: {out['stages'][name]}", flush=True)
        out["index"] = index_figures(work, num_docs, args.shard_budget_gib * 2**30)
        ray.shutdown()
    return out


def fanout_check(args, cfg, work: Path) -> dict:
    """BM25's top-k of the questions through per-shard actors (shards grouped under `--shard-budget-gib`) and
    a merge, against one retriever that maps every shard: the same documents, scores and order."""
    from xh.retrieval.fanout import compare_fanout

    questions = json.loads((work / "world" / "hotpot" / "questions.json").read_text())
    return compare_fanout(
        str(work / "index" / "bm25"),
        str(work / "tables"),
        [q["question"] for q in questions],
        budget_bytes=args.shard_budget_gib * 2**30,
        k=cfg.retrieve.ir_candidates,
    )


def slope(xs: list[float], ys: list[float]) -> float | None:
    """Least-squares slope of log y on log x (None with fewer than two sizes)."""
    if len(xs) < 2:
        return None
    lx, ly = [math.log(x) for x in xs], [math.log(max(y, 1e-9)) for y in ys]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    return round(sum((a - mx) * (b - my) for a, b in zip(lx, ly)) / sum((a - mx) ** 2 for a in lx), 3)


def markdown(results: list[dict]) -> str:
    """The per-stage figures of every size as one Markdown table (docs/results/scale.md, "Scale")."""
    lines = [
        "| N docs | stage | seconds | items/s/core | driver peak MiB | largest worker peak MiB (RSS) "
        "| all workers' peak MiB (sum of PSS) | query actor peak MiB (RSS / anon) | load avg (1 min) |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        for name, f in r["stages"].items():
            actor = f.get("query_actor")
            memory = f"{actor['rss']} / {actor['anon']}" if actor else "-"
            lines.append(
                f"| {r['docs']:,} | {name} | {f['seconds']} | {f['per_s_per_core']} | {f['driver_peak_mib']} "
                f"| {f['worker_peak_mib']} | {f['workers_total_peak_mib']['pss']} | {memory} "
                f"| {f['load_average'][0]} |"
            )
    return "\n".join(lines)


def without_docs(argv: list[str]) -> list[str]:
    """The command line less `--docs N [N ...]`."""
    out, skipping = [], False
    for a in argv:
        skipping = a == "--docs" or (skipping and not a.startswith("-"))
        if not skipping:
            out.append(a)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, nargs="+", default=[100_000, 300_000, 1_000_000])
    parser.add_argument("--questions", type=int, default=10_000, help="questions retrieved and made into graphs")
    parser.add_argument("--score-questions", type=int, default=1000, help="of those, questions batch-scored")
    parser.add_argument("--num-cpus", type=int, default=2)
    parser.add_argument("--shards", type=int, default=4, help="BM25 index shards")
    parser.add_argument("--docs-per-shard", type=int, default=10_000, help="pages per generated dump shard")
    parser.add_argument(
        "--shard-budget-gib",
        type=float,
        default=None,
        help="memory one shard actor may map: runs the fan-out check (shards grouped under it, one actor each, "
        "top-k merged and compared with one retriever over all shards); default 2 for the shard estimate only",
    )
    parser.add_argument(
        "--path-questions",
        type=int,
        default=1000,
        help="questions a path scorer is trained on before retrieval, which then uses it (0: none)",
    )
    parser.add_argument(
        "--one-actor-max", type=int, default=1_000_000, help="up to this N, retrieval also runs with one query actor"
    )
    parser.add_argument("--backbone", default=None, help="default: the MiniLM of the offline extra")
    parser.add_argument("--work", default=None, help="folder for the worlds (default: the system's temporary one)")
    parser.add_argument("--set", action="append", default=[], help="extra config overrides, a.b=c (repeatable)")
    parser.add_argument("--stages", nargs="+", default=None, help="only these stages after synth, wiki, index, layout")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # one size, in this process
    args = parser.parse_args()
    args.shard_budget_gib_set = args.shard_budget_gib is not None
    if args.shard_budget_gib is None:
        args.shard_budget_gib = 2.0
    if args.one:
        from xh.model.backbones import resolve_backbone

        print(RESULT + json.dumps(one_size(args, args.docs[0], resolve_backbone(args.backbone))), flush=True)
        return
    results, failed = [], None
    for n in sorted(args.docs):
        # one process per size: a driver's peak RSS is its own, not left over from a smaller size
        argv = without_docs(sys.argv[1:])
        # its lines are passed on as they come: a size stopped part-way still shows the stages it finished
        child = subprocess.Popen(
            [sys.executable, __file__, "--one", "--docs", str(n), *argv], stdout=subprocess.PIPE, text=True
        )
        lines = []
        for line in child.stdout:
            if line.startswith(RESULT):
                lines.append(line)
            else:
                print(line, end="", flush=True)
        done = subprocess.CompletedProcess(child.args, child.wait())
        if done.returncode or not lines:
            failed = {"docs": n, "exit": done.returncode}  # the sizes before it are summarised below
            print(f"size {n}: the run failed (exit {done.returncode})", file=sys.stderr, flush=True)
            break
        results.append(json.loads(lines[-1][len(RESULT) :]))
        print(json.dumps({"name": "scale", **results[-1]}), flush=True)
    sizes = [r["docs"] for r in results]
    common = [st for st in results[0]["stages"] if all(st in r["stages"] for r in results)] if results else []
    growth = {
        stage: {
            "seconds": slope(sizes, [r["stages"][stage]["seconds"] for r in results]),
            "worker_peak": slope(sizes, [r["stages"][stage]["worker_peak_mib"] for r in results]),
            "driver_peak": slope(sizes, [r["stages"][stage]["driver_peak_mib"] for r in results]),
            "workers_total_pss": slope(sizes, [r["stages"][stage]["workers_total_peak_mib"]["pss"] for r in results]),
        }
        for stage in common
    }
    actor = {
        measure: slope(sizes, [r["stages"]["retrieve"]["query_actor"][measure] for r in results])
        for measure in ("rss", "pss", "anon")
        if results and all("query_actor" in r["stages"].get("retrieve", {}) for r in results)
    }
    one_vs_two = {
        r["docs"]: {
            "query_actor_rss_mib": [r["stages"][s]["query_actor"]["rss"] for s in ("retrieve_1actor", "retrieve")],
            "query_actor_anon_mib": [r["stages"][s]["query_actor"]["anon"] for s in ("retrieve_1actor", "retrieve")],
            "workers_total_pss_mib": [
                r["stages"][s]["workers_total_peak_mib"]["pss"] for s in ("retrieve_1actor", "retrieve")
            ],
            "workers_total_rss_mib": [
                r["stages"][s]["workers_total_peak_mib"]["rss"] for s in ("retrieve_1actor", "retrieve")
            ],
            "query_actors_sum_pss_mib": [
                r["stages"][s]["query_actor"]["sum_pss"] for s in ("retrieve_1actor", "retrieve")
            ],
            "query_actors_sum_rss_mib": [
                r["stages"][s]["query_actor"]["sum_rss"] for s in ("retrieve_1actor", "retrieve")
            ],
        }
        for r in results
        if "retrieve_1actor" in r["stages"] and "retrieve" in r["stages"]
    }
    for figures in one_vs_two.values():
        one, two = figures["workers_total_pss_mib"]
        figures["two_over_one_pss"] = round(two / one, 3)
        one, two = figures["query_actors_sum_pss_mib"]
        figures["query_actors_two_over_one_pss"] = round(two / one, 3)
    print(markdown(results), flush=True)
    print(
        json.dumps(
            {
                "name": "scale_summary",
                "docs": sizes,
                "failed": failed,
                "questions": args.questions,
                "score_questions": args.score_questions,
                "num_cpus": args.num_cpus,
                "growth_exponent": growth,
                "query_actor_growth_exponent": actor,
                "one_vs_two_query_actors": one_vs_two,
                "machine": f"{platform.machine()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}",
                "finished_at": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
