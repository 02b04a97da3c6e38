"""Benchmark: batch scoring throughput (questions/s per CPU core) and where the time goes.

    .venv/bin/python bench/score.py                       # 5,000-doc world, 5,000 questions, MiniLM, 2 CPUs
    .venv/bin/python bench/score.py --questions 400 --num-cpus 2 --workers 1
    .venv/bin/python bench/score.py --scored-index 1 10 100   # reading the scored-inputs record, no Ray

Sets up a generated world (tables + BM25 index) and registers an XH model with the MiniLM backbone
(untrained: throughput does not depend on the weights) in a local SQLite MLflow, then measures in
the same run:

    project        `workflows.score.run`: the Ray Data pipeline (parse, retrieval + graphs on an
                   actor pool, inference on an actor pool), from question files to the predictions
                   partition; `--workers` actors in each pool (default: one per CPU; model actors with
                   `--inference-threads` torch threads each)
    single_process the same steps in one process without Ray, with as many torch threads as Ray has
                   CPUs: `xh.pipeline.Pipeline` (Retriever -> HotpotGraphBuilder -> XH model), no files
                   written (what a user would write as a script)

and prints one JSON line: qps (questions/s, everything included), qps_per_core (the project's qps /
CPUs given to Ray; both sides have the same CPUs), qps_single_process, ratio (project / single
process); the fixed costs apart: fixed_seconds (the project's run of 8 questions: Ray actors started,
index and model loaded, stages staged; the single process's loading), steady_qps and ratio_steady
(throughput once those are paid); stage_share (share of the project's time per stage); cpu_seconds
(CPU the project's run used, by process: each stage's actors, the driver, Ray's own processes, the
sampling itself) and cpu_seconds_single_process (the same for the loop). On a GPU
machine pass --gpu: the model actors take one GPU each (`score.use_gpu`) and qps_per_gpu replaces
qps_per_core.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path

from procs import ProcessSampler

FIXED_QUESTIONS = 8  # the small run whose time is the project's fixed costs (actor start, model load, staging)


def setup(work: Path, num_docs: int, num_questions: int, backbone: str):
    from workflows import retrieve
    from xh import synth
    from xh.config import load_config
    from xh.model.xh import XHModel
    from xh.stages import wiki
    from xh.storage.store import Store

    spec = synth.WorldSpec(num_docs=num_docs, seed=5)
    synth.write_world(
        spec, synth.output_under(str(work / "world")), docs_per_shard=1000, num_questions=num_questions, num_claims=0
    )
    wiki.write_tables(
        Store().at(str(work / "tables")), [Store().at(str(work / "world" / "wiki"))], "hotpot", partitions=4, local=True
    )
    base = [
        f"storage.root={work}",
        f"retrieve.tables={work / 'tables'}",
        "retrieve.shards=2",
        f"mlflow.tracking_uri=sqlite:///{work / 'mlflow.db'}",
        f"mlflow.artifact_location={work / 'artifacts'}",
        f"model.backbone={backbone}",
        "model.max_node_tokens=128",
        "train.register_as=xh-bench",
    ]
    cfg = load_config(None, base)
    retrieve.index(cfg)
    questions = json.loads((work / "world" / "hotpot" / "questions.json").read_text())
    for folder, some in (("incoming", questions), ("incoming-fixed", questions[:FIXED_QUESTIONS])):
        (work / folder).mkdir()
        (work / folder / "questions.jsonl").write_text(
            "".join(json.dumps({"qid": q["_id"], "question": q["question"], "type": q["type"]}) + "\n" for q in some)
        )
    model_dir = work / "model"
    XHModel.from_backbone(cfg.model).save_pretrained(model_dir)
    return base, questions, model_dir


def register(base: list[str], work: Path, model_dir: Path) -> None:
    import mlflow

    from workflows import graphs
    from xh.config import load_config
    from xh.registry.register import log_and_register
    from xh.tracking import configure

    # an input example for the signature: a few distractor-setting graphs of the world
    graphs_cfg = load_config(
        None,
        [
            *base,
            "graphs.setting=distractor",
            "graphs.workers=1",
            f"graphs.questions={work / 'world' / 'hotpot' / 'questions.json'}",
        ],
    )
    graphs.build(graphs_cfg)
    cfg = load_config(None, base)
    configure(cfg.mlflow)
    with mlflow.start_run() as run:
        pass
    log_and_register(
        str(model_dir), run_id=run.info.run_id, cfg=cfg, metrics={}, graphs_uri=str(work / "graphs" / "hotpot")
    )
    mlflow.MlflowClient().set_registered_model_alias("xh-bench", "champion", "1")


def single_process(base: list[str], questions: list[dict], model_dir: Path, threads: int) -> tuple[float, float]:
    """(seconds loading, seconds scoring) of retrieval -> graphs -> inference in one process with `threads`
    torch threads, batch by batch (`xh.pipeline`)."""
    import torch

    from xh.config import load_config
    from xh.pipeline import Pipeline, settings_of

    torch.set_num_threads(threads)
    cfg = load_config(None, base)
    start = time.perf_counter()
    retrieval, graph = settings_of(cfg)
    pipeline = Pipeline.load(
        index=str(Path(cfg.storage.root) / "index" / "bm25"),
        tables=cfg.retrieve.tables,
        retrieval=retrieval,
        graph=graph,
        model=str(model_dir),
    )
    loaded = time.perf_counter()
    for i in range(0, len(questions), 64):
        pipeline([{"qid": q["_id"], "question": q["question"], "type": q["type"]} for q in questions[i : i + 64]])
    return loaded - start, time.perf_counter() - loaded


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=5000)
    parser.add_argument("--questions", type=int, default=5000)
    parser.add_argument("--num-cpus", type=int, default=2)
    parser.add_argument("--workers", type=int, default=None, help="graph actors and model actors, each (default: CPUs)")
    parser.add_argument(
        "--inference-cpus",
        type=float,
        default=0.5,
        help="CPUs of each model actor (leave some of the cluster to the read and write tasks)",
    )
    parser.add_argument(
        "--graph-cpus",
        type=float,
        default=0.25,
        help="CPUs each graph actor reserves (the graph half is a few percent of the work: a small share lets "
        "the model actors start loading beside the graph actors, `xh.stages.score_actors.Pools`)",
    )
    parser.add_argument("--inference-threads", type=int, default=1, help="torch threads of each model actor")
    # 256: fewer, larger blocks, so fewer Ray tasks and output files per question
    parser.add_argument("--batch-size", type=int, default=256, help="questions per actor call")
    parser.add_argument("--backbone", default=None, help="default: the MiniLM of the offline extra")
    parser.add_argument("--gpu", action="store_true")
    args = parser.parse_args()
    from xh.model.backbones import resolve_backbone

    backbone = resolve_backbone(args.backbone)
    workers = args.workers or (1 if args.gpu else args.num_cpus)

    import ray

    from workflows import score
    from xh.config import load_config

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        ray.init(address="local", num_cpus=args.num_cpus, include_dashboard=False, log_to_driver=False)
        base, questions, model_dir = setup(work, args.docs, args.questions, backbone)
        register(base, work, model_dir)

        def scoring(folder: str) -> tuple[float, dict]:
            cfg = load_config(
                None,
                [
                    *base,
                    f"score.input={work / folder}",
                    f"score.output={work / 'predictions' / folder}",
                    "score.model=models:/xh-bench@champion",
                    f"score.workers={workers}",
                    f"score.cpus_per_worker={args.graph_cpus}",
                    f"score.inference_workers={workers}",
                    f"score.inference_cpus={args.inference_cpus}",
                    f"score.inference_threads={args.inference_threads}",
                    f"score.batch_size={args.batch_size}",
                    f"score.use_gpu={'true' if args.gpu else 'false'}",
                ],
            )
            with ProcessSampler(every=1.0, memory=False) as sampled:
                start = time.perf_counter()
                summary = score.run(cfg)
                seconds = time.perf_counter() - start
            return seconds, summary | {"cpu_seconds": sampled.cpu_seconds()}

        fixed_s, _ = scoring("incoming-fixed")
        load_before = os.getloadavg()[0]
        project_s, summary = scoring("incoming")
        load_between = os.getloadavg()[0]
        ray.shutdown()
        with ProcessSampler(every=1.0, memory=False) as sampled_loop:  # the same sampling on both sides
            load_s, loop_s = single_process(base, questions, model_dir, threads=args.num_cpus)
        load_after = os.getloadavg()[0]

    seconds, n = summary["seconds"], len(questions)
    qps, qps_single = summary["predictions"] / project_s, n / (load_s + loop_s)
    # fixed costs apart: the small run's time stands for them on the project's side, loading on the other
    steady = (summary["predictions"] - FIXED_QUESTIONS) / max(project_s - fixed_s, 1e-9)
    steady_single = n / loop_s
    per = args.num_cpus if not args.gpu else 1  # questions/s per core, or per GPU with --gpu
    print(
        json.dumps(
            {
                "name": "score",
                "questions": n,
                "predictions": summary["predictions"],
                "num_cpus": args.num_cpus,
                "gpu": args.gpu,
                "workers": workers,
                "qps": round(qps, 3),
                "qps_per_gpu" if args.gpu else "qps_per_core": round(qps / per, 3),
                "qps_single_process": round(qps_single, 3),
                "qps_single_process_per_core": round(qps_single / args.num_cpus, 3),
                "ratio": round(qps / qps_single, 3),
                "fixed_seconds": {"project": round(fixed_s, 2), "single_process_load": round(load_s, 2)},
                "steady_qps": {"project": round(steady, 3), "single_process": round(steady_single, 3)},
                "ratio_steady": round(steady / steady_single, 3),
                "stage_share": {k: round(v / sum(seconds.values()), 3) for k, v in seconds.items()},
                "stage_seconds": seconds,
                "wall_seconds": round(project_s, 2),
                # where the project's CPU went: the stages' actors and tasks, the driver, Ray's own processes
                "cpu_seconds": summary["cpu_seconds"],
                "cpu_seconds_single_process": sampled_loop.cpu_seconds(),
                "backbone": Path(backbone).name,
                "machine": f"{platform.machine()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}",
                # the 1-minute load average before the project's run, between the two sides and after the
                # loop: other work on the machine slows both, not necessarily alike
                "load_average": [round(x, 1) for x in (load_before, load_between, load_after)],
            }
        )
    )


def scored_index(dates: list[int], files_per_date: int = 3, repeat: int = 20) -> dict:
    """The cost of reading the scored-inputs record as past dates accumulate (local files, no Ray): the
    project's one index per model version (`xh.storage.partitions.scored_inputs`) against the landed scan of
    every run_date partition's `_inputs-*.json` (the baseline, re-implemented here), at each count of
    `dates`; milliseconds per read (best of `repeat`)."""
    import posixpath

    from xh.storage.partitions import INPUTS, VersionLock, partition_of, publish, scored_inputs, write_inputs_record
    from xh.storage.store import Store

    def scan(output) -> int:  # what every run read before: each date's partition, each record in it
        fs, path = output.fs_path()
        found = 0
        for date in sorted(os.listdir(path)):
            if not date.startswith("run_date="):
                continue
            partition = partition_of(output, date[len("run_date=") :], "m", 1)
            for name in sorted(os.listdir(partition.uri)) if os.path.isdir(partition.uri) else []:
                if name.startswith(INPUTS):
                    found += len(json.loads(partition.join(name).read_bytes())["files"])
        return found

    def best(read) -> float:
        times = []
        for _ in range(repeat):
            start = time.perf_counter()
            read()
            times.append(time.perf_counter() - start)
        return round(min(times) * 1000, 3)

    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        output, published = Store().at(posixpath.join(tmp, "predictions")), 0
        for n in range(1, max(dates) + 1):
            lock = VersionLock.acquire(output, "m", 1, f"run-{n}")
            date = f"2026-{1 + (n - 1) // 28 % 12:02d}-{1 + (n - 1) % 28:02d}" if n <= 336 else f"2027-01-{n}"
            record = Store().at(posixpath.join(tmp, f"inputs-{n}.json"))
            files = {f"in/{n}-{i}.jsonl": f"sha256:{n}{i}" for i in range(files_per_date)}
            write_inputs_record(record, files)
            plan = {"add": [[record.uri, f"{INPUTS}run-{n}.json"]], "remove": [], "token": f"run-{n}"}
            publish(plan, partition_of(output, date, "m", 1), lock, inputs=files)
            lock.release()
            published += files_per_date
            if n in dates:
                assert len(scored_inputs(output, "m", 1)) == scan(output) == published
                rows[n] = {
                    "index_ms": best(lambda: scored_inputs(output, "m", 1)),
                    "scan_ms": best(lambda: scan(output)),
                    # listings and file reads: the index is one file (its size grows with the files scored,
                    # not the dates); the scan lists the root, then lists and reads each date's partition
                    "reads": {"index": 1, "scan": 1 + 2 * n},
                    "entries": published,
                }
    first, last = rows[min(dates)], rows[max(dates)]
    return {
        "benchmark": "scored-inputs record",
        "past_dates": rows,
        # how reading the record grows from the fewest to the most past dates (1.0: flat)
        "growth_index": round(last["index_ms"] / first["index_ms"], 2),
        "growth_scan": round(last["scan_ms"] / first["scan_ms"], 2),
        "ratio_at_most_dates": round(last["scan_ms"] / last["index_ms"], 2),  # scan / index
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}",
    }


if __name__ == "__main__":
    import sys

    if sys.argv[1:2] == ["--scored-index"]:  # python bench/score.py --scored-index [DATES ...]
        print(json.dumps(scored_index([int(d) for d in sys.argv[2:]] or [1, 10, 100])))
    else:
        main()
