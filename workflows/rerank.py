"""Train the cross-encoder re-ranker on Ray Train: relevance labels from HotpotQA supporting facts.

    xh rerank --set rerank.questions=hotpot_train_v1.1.json --set rerank.workers=2
    python -m workflows.rerank --config my.yaml --set rerank.max_questions=400
    xh retrieve run --questions dev.json --set retrieve.reranker=runs/demo/models/reranker

Pairs from `rerank.questions` or `rerank.retrieval` (`xh.retrieval.rerank.training_examples`) go to a
Ray Train `TorchTrainer` with `rerank.workers` DDP workers (`xh.train.rerank`); rank 0 reports the saved
re-ranker as a checkpoint every epoch and owns the MLflow run. The driver copies the last checkpoint
to `rerank.output` (local or s3://), where `retrieve.reranker` can name it.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from workflows.common import init_ray, log, main, s3_settings
from xh.backbones import resolve_backbone
from xh.config import XHConfig
from xh.retrieval.rerank import training_examples
from xh.storage import is_s3, join, resolve, upload_folder
from xh.tracking import absolute_tracking
from xh.train.rerank import RUN_NAME, train_loop_per_worker, training_units
from xh.train.worker import checkpoint_folder, plan_steps


def _paths(cfg: XHConfig) -> dict[str, str]:
    r, root = cfg.rerank, cfg.storage.root
    output = r.output or join(root, "models", "path-reranker" if r.paths else "reranker")
    if not is_s3(output):
        output = str(Path(output).resolve())  # workers may run in another working directory
    storage = r.storage_path or output.rstrip("/") + "-checkpoints"
    return {
        "output": output,
        "storage": storage if is_s3(storage) else str(Path(storage).resolve()),
        "tables": r.tables or join(root, "tables"),
    }


def run(cfg: XHConfig) -> dict:
    """Pairs -> Ray Train -> the last epoch's re-ranker at `rerank.output`; returns a summary."""
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    s3, r = s3_settings(cfg), cfg.rerank
    cfg = absolute_tracking(cfg)
    paths = _paths(cfg)
    backbone = resolve_backbone(r.backbone)
    if r.claims:  # FEVER: claim-sentence pairs for the sentence re-ranker (xh.retrieval.sentences)
        from xh.graph.fever import sentence_training_examples

        args = (r.negatives_per_positive, r.seed, r.max_questions, s3)
        examples = sentence_training_examples(r.claims, paths["tables"], *args)
    else:
        examples = training_examples(r, paths["tables"], s3)
    units, per_step, unit = training_units(r, examples)
    plan = plan_steps(
        len(units), workers=r.workers, batch_size=per_step, epochs=r.epochs, max_steps=r.max_steps, unit=unit
    )
    summary = {
        "pairs": len(examples),
        unit: len(units),
        "objective": r.loss,
        "pairs_per_worker": len(examples) // r.workers,
        "batches_per_epoch": plan.batches_per_epoch,
        "steps": plan.total_steps,
    }
    log(
        "rerank",
        f"{len(examples)} pairs ({sum(e.label for e in examples):.0f} positive); {summary}; backbone {backbone}",
    )
    init_ray(cfg)
    start = time.perf_counter()
    storage_fs = s3.pyarrow_fs() if is_s3(paths["storage"]) else None
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config={
            "cfg": cfg.model_dump(mode="json"),
            "backbone": backbone,
            "plan": dataclasses.asdict(plan),
            "examples": [dataclasses.asdict(e) for e in examples],
        },
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
    with checkpoint_folder(result.checkpoint) as directory:
        files = upload_folder(directory, paths["output"], s3)
    log("rerank", f"re-ranker ({len(files)} files) -> {paths['output']}")
    return {
        "output": paths["output"],
        "backbone": backbone,
        **summary,
        "metrics": {k: result.metrics[k] for k in ("epoch", "step", "loss") if k in result.metrics},
        "mlflow_run_id": result.metrics.get("mlflow_run_id"),
        "seconds": round(time.perf_counter() - start, 3),
    }


if __name__ == "__main__":
    main("rerank", run)
