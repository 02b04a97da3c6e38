"""Training: Transformer-XH on Ray Train (DDP), tracked in MLflow, registered as `@challenger`.

    job = Job.of(cfg, store)     # before Ray starts: graphs complete, a batch holds a row (one-line errors)
    summary = run(job)           # fit (one model, or one per question type), then register the best one
    outcome = fit(job)           # Ray Train alone: the best checkpoint's folder, metrics and MLflow run

The `graphs` table is read with Ray Data (`xh.train.data`); the training split streams to the workers
(equal shards), the dev split goes whole to rank 0, which evaluates it with the official HotpotQA rules at
every checkpoint (`xh.train.loop`). Checkpoints go to `train.storage_path` (local or s3://); the best
`keep_checkpoints` by the dev metric are kept. At the end the best checkpoint's model is logged to the run
as an MLflow pyfunc, registered as `train.register_as` and given the alias `train.alias`.
"""

from __future__ import annotations

import logging
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from xh.config import ConfigError, XHConfig
from xh.storage import locations
from xh.storage.store import Location, Store
from xh.train.data import dev_source, question_kinds

log = logging.getLogger("xh.train")


@dataclass(frozen=True)
class Job:
    """One training run's settings and places, resolved once from config."""

    cfg: XHConfig  # tracking paths made absolute: Ray workers run in another working directory
    store: Store
    graphs: Location
    dev: Location | None  # the dev set's own graphs; None: a split held out of `graphs`
    storage: Location  # where checkpoints go; a local one absolute (Ray Train wants it so)

    @classmethod
    def of(cls, cfg: XHConfig, store: Store) -> Job:
        """The job of `cfg`, refusing in one line what would otherwise fail inside a Train worker: graphs
        incomplete or missing a column, a token batch smaller than one row."""
        from xh.graph.store import require_graphs
        from xh.tracking import absolute_tracking
        from xh.train.batching import BatchLayout

        cfg = absolute_tracking(cfg)
        graphs = store.at(locations.graphs(cfg, cfg.model.task, cfg.train.graphs))
        for folder in filter(None, (graphs.uri, cfg.train.dev_graphs)):
            require_graphs(store.at(folder))
        BatchLayout.of(cfg)
        if cfg.train.dev_fraction + cfg.train.gate_fraction >= 1.0:
            raise ConfigError("train.dev_fraction + train.gate_fraction must stay below 1: nothing would be trained on")
        storage = store.at(locations.train_storage(cfg))
        if not storage.is_s3:
            storage = store.at(str(Path(storage.uri).resolve()))
        return cls(cfg, store, graphs, dev_source(cfg, graphs), storage)

    def part(self, kind: str) -> Job:
        """The job of one question type's model (`<run_name>-<kind>`)."""
        cfg = self.cfg.model_copy(deep=True)
        cfg.train.question_types = kind
        cfg.train.run_name = f"{self.cfg.train.run_name}-{kind}"
        return Job(cfg, self.store, self.graphs, self.dev, self.storage)

    def split(self) -> dict:
        """The split this run trains on (train, dev, gate), as recorded with its MLflow run (`xh.train.split`):
        promotion reads it, and gates on its gate share."""
        from xh.train.split import split_record

        dev, train = (self.dev.uri if self.dev else None), self.cfg.train
        return split_record(self.graphs.uri, dev, train.dev_fraction, train.gate_fraction, question_kinds(self.cfg))

    @property
    def metric(self) -> str:
        """The dev metric that ranks checkpoints: `f1`, the default, is HotpotQA's; a FEVER run ranks by its
        headline metric unless told otherwise."""
        train = self.cfg.train
        return "fever_score" if self.cfg.model.task == "fever" and train.metric == "f1" else train.metric


def fit(job: Job) -> dict:
    """Run the trainer; return the best checkpoint's folder (a local copy), metrics and MLflow run id."""
    import ray.train
    from ray.data import DataContext, ExecutionOptions
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from xh.train.batching import step_plan
    from xh.train.data import datasets, graph_settings, lineage
    from xh.train.loop import train_loop_per_worker
    from xh.train.split import dev_missed
    from xh.train.state import MODEL_DIR, read_progress
    from xh.train.worker import checkpoint_folder

    cfg, train = job.cfg, job.cfg.train
    train_ds, dev_ds = datasets(job.graphs, job.dev, train.dev_fraction, question_kinds(cfg), train.gate_fraction)
    num_train, num_dev = train_ds.count(), dev_ds.count()
    plan = step_plan(cfg, train_ds, num_train)
    split = job.split()
    log.info(f"{num_train} training graphs, {num_dev} dev graphs; plan {asdict(plan)}")
    storage_fs, storage_path = job.storage.fs_path() if job.storage.is_s3 else (None, job.storage.uri)
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config={
            "cfg": cfg.model_dump(),
            "plan": asdict(plan),
            "storage_dir": job.storage.join(train.run_name).uri,
            "graph_settings": graph_settings(job.graphs),
            "dev_missed": dev_missed(split, job.store),
            "split": split,
            "inputs": lineage(split, num_train, num_dev, job.store),
        },
        scaling_config=ScalingConfig(
            num_workers=train.workers,
            use_gpu=train.use_gpu,
            resources_per_worker={"CPU": train.cpus_per_worker} | ({"GPU": 1} if train.use_gpu else {}),
            placement_strategy=train.placement_strategy,
        ),
        run_config=RunConfig(
            name=train.run_name,
            storage_path=storage_path,
            storage_filesystem=storage_fs,
            checkpoint_config=CheckpointConfig(
                num_to_keep=train.keep_checkpoints,
                checkpoint_score_attribute=f"dev_{job.metric}",
                checkpoint_score_order="max",
            ),
            failure_config=FailureConfig(max_failures=train.max_failures),
        ),
        datasets={"train": train_ds, "dev": dev_ds},
        # options of our own: Train's default copies the context's deprecated `exclude_resources`
        dataset_config=ray.train.DataConfig(
            datasets_to_split=["train"],
            execution_options=ExecutionOptions(
                preserve_order=DataContext.get_current().execution_options.preserve_order
            ),
        ),
    )
    result = trainer.fit()
    key = f"dev_{job.metric}"
    with checkpoint_folder(result.checkpoint) as latest:
        final = read_progress(latest)
    best, _ = max(result.best_checkpoints, key=lambda cm: cm[1].get(key, float("-inf")))
    # kept: registration reads the model from it
    with checkpoint_folder(best, keep=True) as local:
        best_progress = read_progress(local)
    return {
        "checkpoint": local,
        "model_dir": str(Path(local) / MODEL_DIR),
        "metrics": best_progress.metrics,
        "best_step": best_progress.step,
        "step": final.step,
        "planned_steps": plan.total_steps,
        "mlflow_run_id": final.mlflow_run_id,
        "train_graphs": num_train,
        "dev_graphs": num_dev,
    }


def fit_separate(job: Job) -> dict:
    """`train.question_types=separate`: a bridge model and a comparison model (two runs, `<run_name>-bridge`
    and `-comparison`), joined into one routed model folder (`xh.model.routed.save_routed`). Its dev metrics
    are the per-type ones weighted by their questions: the official metrics are means over questions,
    and the two dev sets split the mixed one by type."""
    from xh.model.routed import ROUTED_TYPES, save_routed

    parts = {}
    for kind in ROUTED_TYPES:
        parts[kind] = fit(job.part(kind))
        log.info(f"{kind} model: {parts[kind]['metrics']}")
    folder = save_routed(tempfile.mkdtemp(prefix="xh-routed-"), {k: p["model_dir"] for k, p in parts.items()})
    weights = {k: p["metrics"].get("dev_graphs", 0) + p["metrics"].get("dev_missed", 0) for k, p in parts.items()}
    total = sum(weights.values()) or 1
    metrics = {
        key: sum(weights[k] * parts[k]["metrics"].get(key, 0.0) for k in parts) / total
        for key in parts["bridge"]["metrics"]
        if key not in ("dev_graphs", "dev_missed")
    } | {key: sum(p["metrics"].get(key, 0) for p in parts.values()) for key in ("dev_graphs", "dev_missed")}
    first = parts[ROUTED_TYPES[0]]
    return {
        "model_dir": str(folder),
        "metrics": metrics,
        "mlflow_run_id": first["mlflow_run_id"],
        "runs": {k: p["mlflow_run_id"] for k, p in parts.items()},
        "per_type": {k: p["metrics"] for k, p in parts.items()},
        "train_graphs": sum(p["train_graphs"] for p in parts.values()),
        "dev_graphs": sum(p["dev_graphs"] for p in parts.values()),
    }


def record_split(job: Job, run_id: str) -> None:
    """Write the job's split (all question types of its graphs) as `split.json` of the MLflow run `run_id`."""
    import mlflow

    from xh.tracking import configure
    from xh.train.split import SPLIT_ARTIFACT

    configure(job.cfg.mlflow, job.store)
    mlflow.MlflowClient().log_dict(run_id, job.split(), SPLIT_ARTIFACT)


def run(job: Job) -> dict:
    """Train (`fit`, or `fit_separate` for `train.question_types=separate`) and register the model."""
    from xh.registry.register import log_and_register

    separate = job.cfg.train.question_types == "separate"
    outcome = fit_separate(job) if separate else fit(job)
    summary = {k: v for k, v in outcome.items() if k != "checkpoint"}
    if separate:
        # the routed model answers every type: the run it is registered with (the first part's) records
        # the split of both parts, not its own part's
        record_split(job, outcome["mlflow_run_id"])
    if job.cfg.train.register_as:
        os.environ.update(job.store.s3.env())  # MLflow's S3 artifact client reads its endpoint from there
        summary["registered"] = log_and_register(
            outcome["model_dir"],
            run_id=outcome["mlflow_run_id"],
            cfg=job.cfg,
            metrics=outcome["metrics"],
            graphs_uri=job.graphs.uri,
        )
        log.info(f"registered {summary['registered']}")
    return summary
