"""Benchmark: the project's own stages through Ray on one GPU machine, in one prepared run.

    python bench/gpu_ray.py --device cuda --tokenizer TOKENIZER_FOLDER --out DIR   # the lent GPU (see docs)
    .venv/bin/python bench/gpu_ray.py --device cpu                                 # tiny sizes, a few minutes

It runs, in one process and one local Ray cluster: `synth` (a generated world, so no data has to travel),
`wiki`, `retrieve` (BM25 index, path scorer trained on the world's training questions, retrieval), `graphs`,
then `train` on Ray Train (V2; `train.use_gpu=true`, NCCL and bf16 autocast on CUDA) once per
configuration below, each with a randomly initialised backbone of the named size (speed depends on the
size, not the weights). The first configuration's model is registered; once every configuration has
trained, it is promoted to `@champion` and used to `score` the held-out questions (or with
--score-questions N, N new questions over the world's documents: 20,000 and more for a steady rate) with
model actors on the GPU, against the same registered model in a plain loop (`xh.pipeline.Pipeline`) on the
same device (over the first --loop-questions of them): both sides' questions/s, steady questions/s and
fixed seconds (the project's: a run of 8 questions), each side's line emitted as it is measured.

Training configurations (name: backbone, batching, hop layers):

    bert-base/tokens/k3   the main run: registered, promoted and scored
    bert-base/tokens/k0   the same batches without hop attention (K=3/K=0 step time)
    bert-base/graphs/k3   padded batches (`train.batching=graphs`) against token batches
    minilm/tokens/k3, minilm/tokens/k0, minilm/graphs/k3

Figures per training run come from its MLflow run (`xh.train.meters.epoch_figures`): real tokens/s and the
step time of the later epochs (the first one plans every new shape), the first and later epoch time,
the real-token fraction, distinct encoder shapes an epoch and the GPU memory peak. One JSON line per
measurement on stdout, then a Markdown table; with --out, `gpu_ray.json` holds all of them.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# layers, hidden, heads: the sizes on the GPU, and the tiny ones a CPU check runs in minutes
SIZES = {
    "cuda": {"bert-base": (12, 768, 12), "minilm": (6, 384, 12)},
    "cpu": {"bert-base": (3, 64, 2), "minilm": (3, 32, 2)},  # hop attention needs 3 layers
}
RUNS = [
    "bert-base/tokens/k3",
    "bert-base/tokens/k0",
    "bert-base/graphs/k3",
    "minilm/tokens/k3",
    "minilm/tokens/k0",
    "minilm/graphs/k3",
]
WORLD = {  # synth sizes and training settings per device
    # the training worker takes `worker_cpus` of the machine's CPUs, `encode` of them for encoding processes
    "cuda": dict(
        docs=6000,
        questions=3000,
        epochs=3,
        node_tokens=256,
        batch_tokens=32768,
        batch_graphs=16,
        cpus=16,
        worker_cpus=14,
        encode=12,
    ),
    "cpu": dict(
        docs=400,
        questions=100,
        epochs=2,
        node_tokens=128,
        batch_tokens=2048,
        batch_graphs=4,
        cpus=2,
        worker_cpus=1,
        encode=0,
    ),
}
REGISTERED = "xh-gpu"
FIXED_QUESTIONS = 8  # the small scoring run whose time is the project's fixed cost (as in bench/score.py)
SCORE_SEED = 7919  # new scoring questions: another question seed than the world's


class Records(list):
    """The run's measurements; with an `out` folder each is also appended to gpu_ray.jsonl at once, so a
    run cut short by its time limit still hands back what it measured."""

    def __init__(self, out: Path | None = None):
        super().__init__()
        self.out = out


def emit(record: dict, records: list[dict]) -> None:
    records.append(record)
    print(json.dumps(record), flush=True)
    if getattr(records, "out", None) is not None:
        with (records.out / "gpu_ray.jsonl").open("a") as f:
            f.write(json.dumps(record) + "\n")


def versions(device: str) -> dict:
    import mlflow
    import ray
    import torch
    import transformers

    gpu = torch.cuda.get_device_name(0) if device == "cuda" else None
    return {
        "name": "versions",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "ray": ray.__version__,
        "mlflow": mlflow.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "gpu": gpu,
        "cpus": os.cpu_count(),
    }


def base_config(work: Path, device: str, world: dict) -> list[str]:
    return [
        f"storage.root={work / 'root'}",
        f"mlflow.tracking_uri=sqlite:///{work / 'mlflow.db'}",
        f"mlflow.artifact_location={work / 'artifacts'}",
        "mlflow.experiment=xh-gpu-ray",
        f"ray.num_cpus={world['cpus']}",
        f"synth.num_docs={world['docs']}",
        f"synth.num_questions={world['questions']}",
        "synth.num_claims=0",
        "synth.fever_pages=false",
        f"synth.docs_per_shard={max(500, world['docs'] // 8)}",
        f"retrieve.workers={max(1, world['cpus'] // 4)}",
        f"graphs.workers={max(1, world['cpus'] // 4)}",
        f"model.max_node_tokens={world['node_tokens']}",
        f"train.epochs={world['epochs']}",
        f"train.use_gpu={'true' if device == 'cuda' else 'false'}",
        "train.bf16=true",
        f"train.cpus_per_worker={world['worker_cpus']}",
        f"train.encode_processes={world['encode']}",
        f"train.batch_tokens={world['batch_tokens']}",
        f"train.batch_graphs={world['batch_graphs']}",
        f"train.eval_batch_graphs={world['batch_graphs'] * 2}",
        "train.keep_checkpoints=1",
        "train.lr=5e-5",
        "train.hop_lr=5e-4",
        "train.log_every=0",
        "promote.floor=1e-6",  # random backbones, briefly trained: any answer at all promotes
        "promote.min_delta=0",
    ]


def build_world(cfg, records: list[dict]) -> None:
    """synth -> wiki -> retrieve (index, path scorer, run) -> graphs, as `make demo` runs them."""
    from workflows import graphs, retrieve, synth, wiki
    from xh.stages import demo
    from xh.storage.store import Store

    steps = [
        ("synth", lambda c: synth.run(c)),
        ("wiki", lambda c: wiki.run(demo.wiki_config(c))),
        ("retrieve_paths", lambda c: retrieve.paths(demo.path_scorer_config(c, Store.from_config(c)))),
    ]
    for name, step in steps:
        start = time.perf_counter()
        summary = step(cfg)
        emit({"name": f"stage/{name}", "seconds": round(time.perf_counter() - start, 2)}, records)
    cfg = cfg.model_copy(update={"retrieve": cfg.retrieve.model_copy(update={"path_scorer": summary["output"]})})
    for name, step in [("retrieve", lambda c: retrieve.all_steps(demo.retrieve_config(c))), ("graphs", graphs.run)]:
        start = time.perf_counter()
        summary = step(cfg)
        figures = {"graphs": summary["graphs"]} if name == "graphs" else {}
        emit({"name": f"stage/{name}", "seconds": round(time.perf_counter() - start, 2), **figures}, records)
    return cfg


FEED = ("feed_data_fraction", "feed_encode_fraction", "feed_batch_fraction")


def epoch_history(run_id: str) -> list[dict]:
    """The run's per-epoch figures (`xh.train.meters.epoch_figures`), in epoch order."""
    from mlflow import MlflowClient

    client = MlflowClient()
    keys = ("epoch_seconds", "epoch_batches", "epoch_real_tokens", "real_token_fraction", "distinct_step_shapes")
    keys += ("gpu_memory_peak_gib", "encode_wait_fraction", *FEED)
    columns = {k: [m.value for m in sorted(client.get_metric_history(run_id, k), key=lambda m: m.step)] for k in keys}
    columns = {k: v for k, v in columns.items() if v}  # no GPU: no memory peak
    return [dict(zip(columns, values)) for values in zip(*columns.values())]


def train_figures(name: str, summary: dict, seconds: float) -> dict:
    epochs = epoch_history(summary["mlflow_run_id"])
    later = epochs[1:] or epochs
    tokens, wall = sum(e["epoch_real_tokens"] for e in later), sum(e["epoch_seconds"] for e in later)
    batches = sum(e["epoch_batches"] for e in later)
    return {
        "name": f"train/{name}",
        "seconds": round(seconds, 2),
        "steps": summary["step"],
        "epochs": len(epochs),
        "real_tokens_per_s": round(tokens / wall),
        "step_s": round(wall / batches, 4),
        "real_token_fraction": round(statistics.mean(e["real_token_fraction"] for e in epochs), 3),
        "distinct_shapes_per_epoch": max(int(e["distinct_step_shapes"]) for e in epochs),
        "first_epoch_s": round(epochs[0]["epoch_seconds"], 2),
        "later_epoch_s": round(statistics.mean(e["epoch_seconds"] for e in later), 2),
        "gpu_memory_peak_gib": round(max((e.get("gpu_memory_peak_gib", 0.0) for e in epochs), default=0.0), 2),
        # the share of the later epochs the step loop waited for its next batch: near 1, input-bound
        "encode_wait_fraction": round(statistics.mean(e["encode_wait_fraction"] for e in later), 3),
        # and where the making of batches spent those epochs: Ray Data, the encoder processes, packing
        **{k: round(statistics.mean(e[k] for e in later), 3) for k in FEED},
        "dev_f1": round(summary["metrics"].get("dev_f1", 0.0), 4),
    }


def train_runs(cfg, runs: list[str], backbones: dict[str, str], records: list[dict], register: bool) -> dict:
    """Each configuration through `workflows.train.run` (Ray Train); with `register`, the first is registered."""
    from workflows import train

    outcomes = {}
    for i, name in enumerate(runs):
        size, batching, hops = name.split("/")
        update = {
            "model": cfg.model.model_copy(update={"backbone": backbones[size], "hop_layers": int(hops[1:])}),
            "train": cfg.train.model_copy(
                update={
                    "batching": batching,
                    "run_name": name.replace("/", "-"),
                    "register_as": REGISTERED if register and i == 0 else None,
                    "attention_figures": register and i == 0,
                }
            ),
        }
        start = time.perf_counter()
        summary = train.run(cfg.model_copy(update=update))
        outcomes[name] = summary
        emit(train_figures(name, summary, time.perf_counter() - start), records)
    return outcomes


def ratios(records: list[dict]) -> list[dict]:
    """K=3 over K=0 step time, and token batches over padded ones, per backbone size."""
    by_name = {r["name"]: r for r in records}
    out = []
    for size in ("bert-base", "minilm"):
        k3, k0, padded = (by_name.get(f"train/{size}/{x}") for x in ("tokens/k3", "tokens/k0", "graphs/k3"))
        row = {"name": f"ratio/{size}"}
        if k3 and k0:
            row["k3_over_k0_step_s"] = round(k3["step_s"] / k0["step_s"], 3)
        if k3 and padded:
            row["tokens_over_padded_real_tokens_per_s"] = round(
                k3["real_tokens_per_s"] / padded["real_tokens_per_s"], 3
            )
        if len(row) > 1:
            out.append(row)
    return out


def scoring_questions(cfg, store, count: int | None) -> list[dict]:
    """The questions the scoring run answers: the world's held-out ones, or with `count` that many new
    questions over the world's documents (`xh.synth.make_questions` with another seed than the world's
    training questions), so that the world and its training stay the size they are."""
    from xh import synth
    from xh.stages import demo

    if count is None:
        questions, _ = demo.held_out(cfg, store)
    else:
        spec = synth.WorldSpec(num_docs=cfg.synth.num_docs, seed=cfg.synth.seed)
        questions = synth.make_questions(spec, count, seed=SCORE_SEED, with_context=False)
    return [{"qid": q["_id"], "question": q["question"], "type": q["type"]} for q in questions]


def project_scoring(cfg, rows: list[dict], model: str, device: str, records: list[dict]) -> dict:
    """`workflows.score.run` over `FIXED_QUESTIONS` of `rows` twice (its fixed cost: actors started, index and
    model loaded; the first run also starts the cluster's first workers and reads every file cold, so the
    second is the fixed cost a run pays), then over all of them; the runs' seconds and the last summary."""
    from workflows import score
    from xh.storage.uris import join, open_output

    seconds = {}
    fixed = rows[:FIXED_QUESTIONS]
    for name, some in (("cold", fixed), ("fixed", fixed), ("all", rows)):
        incoming = join(cfg.storage.root, f"incoming-{name}")
        with open_output(join(incoming, "questions.jsonl")) as out:
            out.write("".join(json.dumps(r) + "\n" for r in some).encode())
        update = {
            "input": incoming,
            "output": join(cfg.storage.root, f"predictions-{name}"),
            "model": model,
            "use_gpu": device == "cuda",
            "batch_graphs": 32,
            # the graph half on the CPUs the model actor leaves, in parallel
            "workers": max(1, cfg.ray.num_cpus // 2),
            "cpus_per_worker": 1.0 if device == "cuda" else 0.25,
            "inference_cpus": 1.0 if device == "cuda" else 0.5,
        }
        start = time.perf_counter()
        summary = score.run(cfg.model_copy(update={"score": cfg.score.model_copy(update=update)}))
        seconds[name] = time.perf_counter() - start
        emit({"name": f"score/project/{name}", "questions": len(some), "seconds": round(seconds[name], 2)}, records)
    return {"cold_s": seconds["cold"], "fixed_s": seconds["fixed"], "all_s": seconds["all"], "summary": summary}


def loop_scoring(cfg, rows: list[dict], model: str) -> dict:
    """The questions through `xh.pipeline.Pipeline` in a loop in this process: loading, then answering (one
    process has no fixed cost beyond its loading: its steady rate needs no more questions than a few batches)."""
    from xh.pipeline import Pipeline, settings_of
    from xh.storage import locations

    start = time.perf_counter()
    retrieval, graph = settings_of(cfg)
    index, tables = locations.index(cfg), locations.tables(cfg, cfg.retrieve.tables)  # what retrieval used
    pipeline = Pipeline.load(index=index, tables=tables, retrieval=retrieval, graph=graph, model=model, batch_graphs=32)
    loaded = time.perf_counter()
    answered = 0
    for i in range(0, len(rows), 64):
        answered += len(pipeline(rows[i : i + 64])[0])
    return {"load_s": loaded - start, "loop_s": time.perf_counter() - loaded, "answered": answered}


def promote_and_score(
    cfg, device: str, records: list[dict], score_questions: int | None = None, loop_questions: int | None = None
) -> None:
    """`@challenger` promoted on the held-out graphs, then the scoring questions (`scoring_questions`)
    answered by model actors (a GPU each on CUDA) against the champion in a plain loop on the same device
    (over the first `loop_questions` of them; default all): each side's questions/s, steady questions/s (its
    fixed cost apart) and fixed seconds. The loop is measured first, then the project's fixed cost, each
    line emitted as it is measured, so that a call cut during the project's long run keeps them."""
    from xh.stages import demo
    from xh.storage.store import Store

    train_cfg = cfg.model_copy(update={"train": cfg.train.model_copy(update={"register_as": REGISTERED})})
    start = time.perf_counter()
    promoted = demo.promote_challenger(train_cfg, Store.from_config(train_cfg))
    emit(
        {"name": "promote", "seconds": round(time.perf_counter() - start, 2), "promoted": promoted["promoted"]}, records
    )
    rows = scoring_questions(cfg, Store.from_config(cfg), score_questions)
    # below the floor no champion exists: the challenger is scored instead (said in the record)
    model = f"models:/{REGISTERED}@{'champion' if promoted['promoted'] else 'challenger'}"
    loop = loop_scoring(cfg, rows[:loop_questions] if loop_questions else rows, model)
    loop_line = {"name": "score/loop", "questions": loop["answered"], "load_s": round(loop["load_s"], 2)}
    emit(loop_line | {"steady_qps": round(loop["answered"] / loop["loop_s"], 2)}, records)
    project = project_scoring(cfg, rows, model, device, records)
    predictions, summary = project["summary"]["predictions"], project["summary"]
    project_qps = predictions / project["all_s"]
    steady_s = project["all_s"] - project["fixed_s"]
    project_steady = (predictions - FIXED_QUESTIONS) / steady_s if steady_s > 0 else None  # None: noise won
    loop_qps, loop_steady = loop["answered"] / (loop["load_s"] + loop["loop_s"]), loop["answered"] / loop["loop_s"]
    emit(
        {
            "name": "score",
            "model": model,
            "questions": len(rows),
            "held_out": score_questions is None,  # else new questions over the world's documents
            "predictions": predictions,
            "use_gpu": summary.get("use_gpu"),
            "project_qps": round(project_qps, 2),
            "project_steady_qps": round(project_steady, 2) if project_steady else None,
            "project_fixed_s": round(project["fixed_s"], 2),
            "project_first_fixed_s": round(project["cold_s"], 2),  # the cluster's first run
            "plain_loop_qps": round(loop_qps, 2),
            "plain_loop_steady_qps": round(loop_steady, 2),
            "plain_loop_fixed_s": round(loop["load_s"], 2),
            "plain_loop_questions": loop["answered"],
            "ratio": round(project_qps / loop_qps, 3),
            "ratio_steady": round(project_steady / loop_steady, 3) if project_steady else None,
            "project_seconds": round(project["all_s"], 2),
            "stage_seconds": summary["seconds"],
        },
        records,
    )


def table(records: list[dict]) -> str:
    lines = [
        "| run | real tokens/s | step s | real-token fraction | shapes/epoch | first / later epoch s | GPU peak GiB "
        "| step loop waits | feed: data / encode / batch |"
    ]
    lines.append("|---|---|---|---|---|---|---|---|---|")
    for r in records:
        if r["name"].startswith("train/"):
            lines.append(
                f"| {r['name'][6:]} | {r['real_tokens_per_s']:,} | {r['step_s']} | {r['real_token_fraction']} | "
                f"{r['distinct_shapes_per_epoch']} | {r['first_epoch_s']} / {r['later_epoch_s']} | "
                f"{r['gpu_memory_peak_gib']} | {r['encode_wait_fraction']} | {' / '.join(str(r[k]) for k in FEED)} |"
            )
    others = [r for r in records if not r["name"].startswith(("train/", "stage/"))]
    lines += ["", *(f"- {json.dumps(r)}" for r in others)]
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    """The options (`bench/device_run.py` plans with them)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--tokenizer", default=None, help="a tokenizer folder (default: the offline MiniLM's)")
    parser.add_argument(
        "--runs", nargs="+", default=RUNS, choices=RUNS, help="training configurations, first registered"
    )
    parser.add_argument("--docs", type=int, default=None, help="the world's documents (default: per device)")
    parser.add_argument("--questions", type=int, default=None, help="the world's questions (default: per device)")
    parser.add_argument("--work", default=None, help="working folder (default: a temporary one, removed)")
    parser.add_argument("--out", default=None, help="folder for gpu_ray.json (and gpu_ray.jsonl as it goes)")
    parser.add_argument("--epochs", type=int, default=None, help="training epochs (default: per device)")
    parser.add_argument("--worker-cpus", type=int, default=None, help="CPUs of the training worker")
    parser.add_argument("--encode", type=int, default=None, help="encoding processes of the training worker")
    parser.add_argument(
        "--score-questions",
        type=int,
        default=None,
        help="new questions over the world's documents to score (default: the world's held-out questions)",
    )
    parser.add_argument(
        "--loop-questions", type=int, default=None, help="the plain loop's share of them, the first N (default: all)"
    )
    return parser


def main(argv: list[str] | None = None) -> list[dict]:
    args = parser().parse_args(argv)
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

    import ray

    from workflows.cli import configure_logging
    from workflows.common import init_ray
    from xh.config import load_config
    from xh.model.backbones import random_backbone, resolve_backbone

    configure_logging(-1)
    work = Path(args.work or tempfile.mkdtemp(prefix="xh-gpu-ray-"))
    given = {"docs": args.docs, "questions": args.questions, "epochs": args.epochs}
    given |= {"worker_cpus": args.worker_cpus, "encode": args.encode}
    world = WORLD[args.device] | {k: v for k, v in given.items() if v is not None}
    out = Path(args.out) if args.out else None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
    records = Records(out)
    started = time.perf_counter()
    emit(versions(args.device) | {"world": world}, records)
    tokenizer = args.tokenizer or resolve_backbone(None)
    sizes = {run.split("/")[0] for run in args.runs}
    backbones = {s: random_backbone(work / "backbones" / s, tokenizer, *SIZES[args.device][s]) for s in sizes}
    first_size = args.runs[0].split("/")[0]
    cfg = load_config(None, [*base_config(work, args.device, world), f"model.backbone={backbones[first_size]}"])
    joined = ray.is_initialized()  # a caller's cluster (a test's) is kept; one started here is stopped
    init_ray(cfg)
    try:
        cfg = build_world(cfg, records)
        # every training run first, the first registered; then promotion and scoring, whose length depends
        # on the scoring rate measured: a call cut short by its time limit keeps every training figure
        train_runs(cfg, args.runs[:1], backbones, records, register=True)
        train_runs(cfg, args.runs[1:], backbones, records, register=False)
        for row in ratios(records):
            emit(row, records)
        promote_and_score(cfg, args.device, records, args.score_questions, args.loop_questions)
    finally:
        if not joined:
            ray.shutdown()
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    emit({"name": "total", "seconds": round(time.perf_counter() - started, 1)}, records)
    print(table(records))
    if out is not None:
        (out / "gpu_ray.json").write_text(json.dumps(records, indent=1))
    return records


if __name__ == "__main__":
    main()
