"""Benchmark: batch scoring throughput (questions/s per CPU core) and where the time goes.

    .venv/bin/python bench/score.py                       # 2,000-doc world, 200 questions, MiniLM, 2 CPUs
    .venv/bin/python bench/score.py --questions 400 --num-cpus 2 --workers 1

Sets up a generated world (tables + BM25 index) and registers an XH model with the MiniLM backbone
(untrained: throughput does not depend on the weights) in a local SQLite MLflow, then measures in
the same run:

    project        `workflows.score.run`: the Ray Data pipeline (parse, retrieval + graphs on an
                   actor pool, inference on an actor pool), from question files to the predictions partition
    single_process the same steps in one process without Ray: `xh.pipeline.Pipeline` (Retriever ->
                   HotpotGraphBuilder -> XH model), no files written (what a user would write as a script)

and prints one JSON line: qps (questions/s), qps_per_core (the project's qps / CPUs given to Ray),
stage_share (share of the project's time per stage), qps_single_process, ratio (project / single
process). On a GPU machine pass --gpu to put the model actors on the GPU (`score.use_gpu`).
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path


def setup(work: Path, num_docs: int, num_questions: int, backbone: str):
    from workflows import retrieve
    from xh import synth
    from xh.config import load_config
    from xh.model import XHModel
    from xh.wiki import process

    spec = synth.WorldSpec(num_docs=num_docs, seed=5)
    synth.write_world(
        spec, synth.output_under(str(work / "world")), docs_per_shard=1000, num_questions=num_questions, num_claims=0
    )
    process.process_in_process(
        "hotpot", process.input_files([str(work / "world" / "wiki")], "hotpot"), str(work / "tables"), partitions=4
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
    retrieve.build_index(cfg)
    questions = json.loads((work / "world" / "hotpot" / "questions.json").read_text())
    (work / "incoming").mkdir()
    (work / "incoming" / "questions.jsonl").write_text(
        "".join(json.dumps({"qid": q["_id"], "question": q["question"], "type": q["type"]}) + "\n" for q in questions)
    )
    model_dir = work / "model"
    XHModel.from_backbone(cfg.model).save_pretrained(model_dir)
    return base, questions, model_dir


def register(base: list[str], work: Path, model_dir: Path) -> None:
    import mlflow

    from workflows import graphs
    from xh.config import load_config
    from xh.registry import log_and_register
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


def single_process(base: list[str], questions: list[dict], model_dir: Path) -> float:
    """Seconds for retrieval -> graphs -> inference in one process, batch by batch (`xh.pipeline`)."""
    from xh.config import load_config
    from xh.pipeline import Pipeline, settings_of

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
    for i in range(0, len(questions), 64):
        pipeline([{"qid": q["_id"], "question": q["question"], "type": q["type"]} for q in questions[i : i + 64]])
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=2000)
    parser.add_argument("--questions", type=int, default=200)
    parser.add_argument("--num-cpus", type=int, default=2)
    parser.add_argument("--workers", type=int, default=1, help="graph actors and model actors, each")
    parser.add_argument(
        "--inference-cpus",
        type=float,
        default=0.75,
        help="CPUs of each model actor (leave some of the cluster to the read and write tasks)",
    )
    parser.add_argument("--inference-threads", type=int, default=2, help="torch threads of each model actor")
    parser.add_argument("--backbone", default=None, help="default: the MiniLM of the offline extra")
    parser.add_argument("--gpu", action="store_true")
    args = parser.parse_args()
    from xh.backbones import resolve_backbone

    backbone = resolve_backbone(args.backbone)

    import ray

    from workflows import score
    from xh.config import load_config

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        ray.init(address="local", num_cpus=args.num_cpus, include_dashboard=False, log_to_driver=False)
        base, questions, model_dir = setup(work, args.docs, args.questions, backbone)
        register(base, work, model_dir)
        cfg = load_config(
            None,
            [
                *base,
                f"score.input={work / 'incoming'}",
                "score.model=models:/xh-bench@champion",
                f"score.workers={args.workers}",
                f"score.inference_workers={args.workers}",
                f"score.inference_cpus={args.inference_cpus}",
                f"score.inference_threads={args.inference_threads}",
                f"score.use_gpu={'true' if args.gpu else 'false'}",
            ],
        )
        start = time.perf_counter()
        summary = score.run(cfg)
        project_s = time.perf_counter() - start
        ray.shutdown()
        baseline_s = single_process(base, questions, model_dir)

    seconds = summary["seconds"]
    qps = summary["predictions"] / project_s
    print(
        json.dumps(
            {
                "name": "score",
                "questions": len(questions),
                "predictions": summary["predictions"],
                "num_cpus": args.num_cpus,
                "qps": round(qps, 3),
                "qps_per_core": round(qps / args.num_cpus, 3),
                "stage_share": {k: round(v / sum(seconds.values()), 3) for k, v in seconds.items()},
                "stage_seconds": seconds,
                "wall_seconds": round(project_s, 2),
                "qps_single_process": round(len(questions) / baseline_s, 3),
                "ratio": round(qps / (len(questions) / baseline_s), 3),
                "backbone": Path(backbone).name,
                "machine": platform.machine(),
            }
        )
    )


if __name__ == "__main__":
    main()
