"""Training the cross-encoder re-ranker on Ray Train, as library calls: relevance labels from HotpotQA
supporting facts (or FEVER claims' evidence sentences).

    store = Store.from_config(cfg)
    plan = prepare(cfg, store)        # the pairs and the step plan, read on the driver (no Ray)
    train(cfg, store, plan)           # Ray Train -> the last epoch's re-ranker at `rerank.output`

Pairs from `rerank.questions` or `rerank.retrieval` (`xh.retrieval.rerank.training_examples`) go to a
Ray Train `TorchTrainer` with `rerank.workers` DDP workers (`xh.train.rerank`); rank 0 reports the saved
re-ranker as a checkpoint every epoch and owns the MLflow run. The driver copies the last checkpoint
to `rerank.output` (local or s3://), where `retrieve.reranker` can name it.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path

from xh.config import XHConfig
from xh.model.backbones import resolve_backbone
from xh.retrieval.rerank import Example, training_examples
from xh.storage import locations
from xh.storage.store import Location, Store
from xh.tracking import absolute_tracking
from xh.train.rerank import RUN_NAME, train_loop_per_worker, training_units
from xh.train.worker import StepPlan, checkpoint_folder, plan_steps

log = logging.getLogger("xh.rerank")


def _absolute(store: Store, uri: str) -> Location:
    """Workers may run in another working directory: a local folder is made absolute."""
    where = store.at(uri)
    return where if where.is_s3 else store.at(str(Path(uri).resolve()))


@dataclasses.dataclass
class Plan:
    """What the driver reads before Ray starts: where the re-ranker goes, its pairs and its steps."""

    output: Location
    storage: Location
    backbone: str
    examples: list[Example]
    plan: StepPlan
    summary: dict


def prepare(cfg: XHConfig, store: Store) -> Plan:
    """The training pairs and the step plan; a missing or unusable input is a one-line error here."""
    r = cfg.rerank
    output = _absolute(store, r.output or locations.models(cfg, "path-reranker" if r.paths else "reranker"))
    storage = _absolute(store, r.storage_path or output.uri.rstrip("/") + "-checkpoints")
    tables = store.at(locations.tables(cfg, r.tables))
    backbone = resolve_backbone(r.backbone)
    if r.claims:  # FEVER: claim-sentence pairs for the sentence re-ranker (xh.retrieval.sentences)
        from xh.graph.fever import sentence_training_examples

        args = (r.negatives_per_positive, r.seed, r.max_questions)
        examples = sentence_training_examples(store.at(r.claims), tables, *args)
    else:
        examples = training_examples(r, tables)
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
    log.info(f"{len(examples)} pairs ({sum(e.label for e in examples):.0f} positive); {summary}; backbone {backbone}")
    return Plan(output, storage, backbone, examples, plan, summary)


def train(cfg: XHConfig, store: Store, prepared: Plan) -> dict:
    """Pairs -> Ray Train -> the last epoch's re-ranker at `rerank.output`; returns a summary."""
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    r, cfg = cfg.rerank, absolute_tracking(cfg)
    start = time.perf_counter()
    storage_fs, storage_path = prepared.storage.fs_path() if prepared.storage.is_s3 else (None, prepared.storage.uri)
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config={
            "cfg": cfg.model_dump(mode="json"),
            "backbone": prepared.backbone,
            "plan": dataclasses.asdict(prepared.plan),
            "examples": [dataclasses.asdict(e) for e in prepared.examples],
        },
        scaling_config=ScalingConfig(
            num_workers=r.workers,
            use_gpu=r.use_gpu,
            resources_per_worker={"CPU": r.cpus_per_worker} | ({"GPU": 1} if r.use_gpu else {}),
        ),
        run_config=RunConfig(
            name=f"{RUN_NAME}-{time.strftime('%Y%m%d-%H%M%S')}",
            storage_path=storage_path,
            storage_filesystem=storage_fs,
        ),
    )
    result = trainer.fit()
    if result.checkpoint is None:
        raise RuntimeError(f"the re-ranker training reported no checkpoint ({result.error})")
    with checkpoint_folder(result.checkpoint) as directory:
        files = prepared.output.upload(directory)
    log.info(f"re-ranker ({len(files)} files) -> {prepared.output}")
    return {
        "output": prepared.output.uri,
        "backbone": prepared.backbone,
        **prepared.summary,
        "metrics": {k: result.metrics[k] for k in ("epoch", "step", "loss") if k in result.metrics},
        "mlflow_run_id": result.metrics.get("mlflow_run_id"),
        "seconds": round(time.perf_counter() - start, 3),
    }
