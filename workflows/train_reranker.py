"""Train the cross-encoder re-ranker on Ray Train: relevance labels from HotpotQA supporting facts.

    xh retrieve train-reranker --set rerank.questions=hotpot_train_v1.1.json --set rerank.workers=2
    python -m workflows.train_reranker --config my.yaml --set rerank.max_questions=400
    xh retrieve run --questions dev.json --set retrieve.reranker=runs/demo/models/reranker

Training pairs (`xh.retrieval.rerank`): from `rerank.questions`, a HotpotQA file in the distractor
format (each question's context paragraphs: the supporting ones are positives, the others negatives;
no index needed), or from `rerank.retrieval`, the output folder of `xh retrieve run` (positives: the
gold paragraphs from the docs table; negatives: the question's BM25 candidates, hardest first).
Loss: binary cross-entropy per pair.

The job: a Ray Train `TorchTrainer` with `rerank.workers` DDP workers (`prepare_model`). Each worker
trains on an equal share of the pairs and runs the same number of steps (DDP's all-reduces pair up).
At the end of every epoch all workers call `ray.train.report`; rank 0 attaches a checkpoint holding
the saved re-ranker. Rank 0 also owns the MLflow run (params, step losses, epoch metrics, the final
re-ranker's files as artifacts). The driver copies the last checkpoint to `rerank.output`
(local or s3://), where `retrieve.reranker` can name it.
"""

from __future__ import annotations

import dataclasses
import math
import tempfile
import time
from pathlib import Path

from workflows.common import init_ray, log, main, s3_settings
from xh.backbones import resolve_backbone
from xh.config import ConfigError, XHConfig
from xh.storage import is_s3, join, resolve
from xh.tracking import absolute_tracking

RUN_NAME = "train-reranker"


def _paths(cfg: XHConfig) -> dict[str, str]:
    r, root = cfg.rerank, cfg.storage.root
    output = r.output or join(root, "models", "reranker")
    if not is_s3(output):
        output = str(Path(output).resolve())  # workers may run in another working directory
    storage = r.storage_path or output.rstrip("/") + "-checkpoints"
    return {"output": output, "storage": storage if is_s3(storage) else str(Path(storage).resolve()),
            "tables": r.tables or join(root, "tables")}  # fmt: skip


def training_examples(cfg: XHConfig) -> list:
    """The training pairs of `rerank.questions` (distractor format) or `rerank.retrieval` (retrieval outputs)."""
    import pyarrow as pa
    import pyarrow.dataset as pads

    from xh.questions import load_json
    from xh.retrieval.rerank import examples_from_candidates, examples_from_hotpot

    r, s3 = cfg.rerank, s3_settings(cfg)
    if r.questions:
        records = load_json(r.questions, s3)
        if not isinstance(records, list):
            raise ConfigError(f"{r.questions} is not a HotpotQA question file (a JSON array of questions)")
        records = [rec for rec in records[: r.max_questions] if isinstance(rec, dict) and rec.get("question")]
        examples, source = examples_from_hotpot(records, r.negatives_per_positive, r.seed), r.questions
    elif r.retrieval:
        fs, out = resolve(r.retrieval, s3)
        questions = pads.dataset(f"{out}/questions", filesystem=fs, format="parquet").to_table().to_pylist()
        questions = questions[: r.max_questions]
        qids = pa.array([q["qid"] for q in questions], pa.string())
        candidates = pads.dataset(f"{out}/candidates", filesystem=fs, format="parquet").to_table(
            filter=pads.field("qid").isin(qids)).to_pylist()  # fmt: skip
        gold = pa.array(sorted({f["title"] for q in questions for f in q.get("supporting_facts") or []}), pa.string())
        wanted = pa.array(sorted({c["doc_id"] for c in candidates if c["source"] == "ir"}), pa.string())
        tables_fs, tables = resolve(_paths(cfg)["tables"], s3)
        docs = pads.dataset(f"{tables}/docs", filesystem=tables_fs, format="parquet").to_table(
            columns=["doc_id", "title", "text"], filter=pads.field("doc_id").isin(wanted) | pads.field("title").isin(gold))
        by_id = {d: (t, x) for d, t, x in zip(*(docs[c].to_pylist() for c in ("doc_id", "title", "text")))}
        examples = examples_from_candidates(questions, candidates, by_id, r.negatives_per_positive, r.seed)
        source = r.retrieval
    else:
        raise ConfigError("no training data: set rerank.questions (a HotpotQA file) or rerank.retrieval")
    if not examples:
        raise ConfigError(f"{source} gives no training pairs: no question has a supporting paragraph to learn from")
    return examples


# --- the worker loop -----------------------------------------------------------------------------


def train_loop_per_worker(config: dict) -> None:
    """One DDP worker: its share of the pairs, `plan_steps` steps, a report (and rank 0's checkpoint) per epoch."""
    import ray.train
    import ray.train.torch
    import torch

    from xh.retrieval.rerank import CrossEncoder, Example, epoch_batches, pair_loss

    cfg = XHConfig.model_validate(config["cfg"])
    r = cfg.rerank
    context = ray.train.get_context()
    rank, world = context.get_world_rank(), context.get_world_size()
    if r.threads_per_worker:
        torch.set_num_threads(r.threads_per_worker)
    examples = [Example(**e) for e in config["examples"]]
    per_worker = len(examples) // world
    mine = examples[rank::world][:per_worker]  # equal shares: every worker runs the same steps
    batches_per_epoch = per_worker // r.batch_size
    total_steps = batches_per_epoch * r.epochs if r.max_steps is None else min(batches_per_epoch * r.epochs, r.max_steps)

    encoder = CrossEncoder.from_backbone(config["backbone"], r.max_length, seed=r.seed)
    model = ray.train.torch.prepare_model(encoder)  # DDP with more than one worker; moved to the device
    optimizer = torch.optim.AdamW(model.parameters(), lr=r.lr, weight_decay=0.01)
    warmup = max(1, int(r.warmup_fraction * total_steps))
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min((step + 1) / warmup, max(0.0, (total_steps - step) / max(1, total_steps - warmup)))
    )
    tracker = _RankZeroRun(cfg, config, len(examples), total_steps) if rank == 0 else None
    step, start = 0, time.perf_counter()
    for epoch in range(math.ceil(total_steps / batches_per_epoch)):
        model.train()
        losses = []
        for batch in epoch_batches(mine, r.batch_size, r.seed, epoch)[: total_steps - step]:
            loss = pair_loss(model, encoder, batch)
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            step += 1
            losses.append(loss.item())
            if tracker:
                tracker.step(step, loss.item(), scheduler.get_last_lr()[0])
        metrics = {"epoch": epoch + 1, "step": step, "loss": sum(losses) / len(losses),
                   "seconds": round(time.perf_counter() - start, 3), "pairs": len(examples)}  # fmt: skip
        if tracker is None:
            ray.train.report(metrics)
            continue
        with tempfile.TemporaryDirectory() as directory:
            encoder.save_local(directory)
            last = step == total_steps
            tracker.epoch(metrics, directory if last else None)
            ray.train.report({**metrics, "mlflow_run_id": tracker.run_id},
                             checkpoint=ray.train.Checkpoint.from_directory(directory))  # fmt: skip
    if tracker:
        tracker.end()


def plan_summary(num_examples: int, cfg: XHConfig) -> dict:
    """Pairs per worker, batches per epoch and total steps (what every worker will run)."""
    r = cfg.rerank
    per_worker = num_examples // r.workers
    batches = per_worker // r.batch_size
    if batches == 0:
        raise ConfigError(f"{num_examples} training pairs are too few for {r.workers} worker(s) x batch {r.batch_size}")
    total = batches * r.epochs if r.max_steps is None else min(batches * r.epochs, r.max_steps)
    return {"pairs": num_examples, "pairs_per_worker": per_worker, "batches_per_epoch": batches, "steps": total}


class _RankZeroRun:
    """Rank 0's MLflow run: params at the start, the loss every few steps, epoch metrics, final artifacts."""

    def __init__(self, cfg: XHConfig, config: dict, num_examples: int, total_steps: int):
        import mlflow

        from xh.config import flatten
        from xh.storage import S3Settings
        from xh.tracking import configure, environment_tags

        self.mlflow = mlflow
        experiment_id = configure(cfg.mlflow, S3Settings.from_env())
        self.run = mlflow.start_run(experiment_id=experiment_id, run_name=RUN_NAME)
        self.run_id = self.run.info.run_id
        mlflow.set_tags({"stage": "rerank", **environment_tags()})
        mlflow.log_params({**flatten(cfg, "rerank"), "backbone_path": config["backbone"], "pairs": num_examples,
                           "total_steps": total_steps})  # fmt: skip
        self.every = max(1, total_steps // 50)

    def step(self, step: int, loss: float, lr: float) -> None:
        if step % self.every == 0:
            self.mlflow.log_metrics({"step_loss": loss, "lr": lr}, step=step)

    def epoch(self, metrics: dict, final_dir: str | None) -> None:
        self.mlflow.log_metrics({f"epoch_{k}": float(v) for k, v in metrics.items()}, step=metrics["step"])
        if final_dir:
            self.mlflow.log_artifacts(final_dir, artifact_path="reranker")

    def end(self) -> None:
        self.mlflow.end_run()


# --- the driver ----------------------------------------------------------------------------------


def run(cfg: XHConfig) -> dict:
    """Pairs -> Ray Train -> the last epoch's re-ranker at `rerank.output`; returns a summary."""
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from xh.retrieval.rerank import upload_folder

    s3, r = s3_settings(cfg), cfg.rerank
    cfg = absolute_tracking(cfg)
    paths = _paths(cfg)
    backbone = resolve_backbone(cfg.rerank.backbone)
    examples = training_examples(cfg)
    plan = plan_summary(len(examples), cfg)
    log("rerank", f"{len(examples)} pairs ({sum(e.label for e in examples):.0f} positive); {plan}; backbone {backbone}")
    init_ray(cfg)
    start = time.perf_counter()
    storage_fs = s3.pyarrow_fs() if is_s3(paths["storage"]) else None
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config={"cfg": cfg.model_dump(mode="json"), "backbone": backbone,
                           "examples": [dataclasses.asdict(e) for e in examples]},  # fmt: skip
        scaling_config=ScalingConfig(
            num_workers=r.workers,
            use_gpu=r.use_gpu,
            resources_per_worker={"CPU": r.cpus_per_worker} | ({"GPU": 1} if r.use_gpu else {}),
        ),
        run_config=RunConfig(
            name=f"{RUN_NAME}-{time.strftime('%Y%m%d-%H%M%S')}",
            storage_path=resolve(paths["storage"], s3)[1] if storage_fs else paths["storage"],
            storage_filesystem=storage_fs,
        ),
    )
    result = trainer.fit()
    if result.checkpoint is None:
        raise RuntimeError(f"the re-ranker training reported no checkpoint ({result.error})")
    with result.checkpoint.as_directory() as directory:
        files = upload_folder(directory, paths["output"], s3)
    log("rerank", f"re-ranker ({len(files)} files) -> {paths['output']}")
    return {
        "output": paths["output"],
        "backbone": backbone,
        **plan,
        "metrics": {k: result.metrics[k] for k in ("epoch", "step", "loss") if k in result.metrics},
        "mlflow_run_id": result.metrics.get("mlflow_run_id"),
        "seconds": round(time.perf_counter() - start, 3),
    }


if __name__ == "__main__":
    main("train_reranker", run)
