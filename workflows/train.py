"""Train Transformer-XH on Ray Train (DDP), track it in MLflow, register the model as `@challenger`.

    xh train --set train.workers=2 --set train.epochs=2
    python -m workflows.train --config configs/demo.yaml
    ray job submit --working-dir . -- python -m workflows.train --config configs/cluster.yaml

The `graphs` table is read with Ray Data; the training split streams to the workers (equal shards),
the dev split goes whole to rank 0, which evaluates it with the official HotpotQA rules at every
checkpoint. Checkpoints go to `train.storage_path` (local or s3://); the best `keep_checkpoints` by
the dev metric are kept. At the end the best checkpoint's model is logged to the run as an MLflow
pyfunc, registered as `train.register_as` and given the alias `train.alias`.
"""

from __future__ import annotations

import os
from dataclasses import asdict
from pathlib import Path

from workflows.common import init_ray, log, main, s3_settings
from xh.config import XHConfig
from xh.graph.store import require_graphs
from xh.storage import is_s3, join, resolve
from xh.tracking import absolute_tracking
from xh.train.batching import BatchLayout, plan_token_batches
from xh.train.loop import injected_failure_env, train_loop_per_worker
from xh.train.split import dev_missed, in_dev_split, split_record
from xh.train.state import MODEL_DIR, read_progress
from xh.train.worker import checkpoint_folder, plan_steps


def _paths(cfg: XHConfig) -> dict[str, str]:
    root = cfg.storage.root
    storage = cfg.train.storage_path or join(root, "train")
    if not is_s3(storage):
        storage = str(Path(storage).resolve())  # Ray Train wants an absolute local path
    return {"graphs": cfg.train.graphs or join(root, "graphs", cfg.model.task), "storage": storage}


def datasets(cfg: XHConfig, graphs_uri: str, dev_graphs: str | None, s3):
    """(train, dev) Ray datasets, materialized: their sizes fix the step plan, and nothing is left for
    read tasks to compete with the training workers for CPUs."""
    import pyarrow as pa
    import ray.data

    fs, path = resolve(graphs_uri, s3)
    graphs = ray.data.read_parquet(path, filesystem=fs)
    fraction = cfg.train.dev_fraction
    kinds = _kinds(cfg)

    def split(batch, dev: bool):
        mask = [in_dev_split(q, fraction) == dev for q in batch.column("qid").to_pylist()]
        return batch.filter(pa.array(mask, type=pa.bool_()))

    def of_kind(batch):
        mask = [t in kinds for t in batch.column("question_type").to_pylist()]
        return batch.filter(pa.array(mask, type=pa.bool_()))

    common = dict(batch_format="pyarrow", zero_copy_batch=True)
    if kinds is not None:
        graphs = graphs.map_batches(of_kind, **common)
    if dev_graphs:
        dev_fs, dev_path = resolve(dev_graphs, s3)
        dev = ray.data.read_parquet(dev_path, filesystem=dev_fs)
        dev = dev.map_batches(of_kind, **common) if kinds is not None else dev
        return graphs.materialize(), dev.materialize()
    train = graphs.map_batches(split, fn_kwargs={"dev": False}, **common).materialize()
    dev = graphs.map_batches(split, fn_kwargs={"dev": True}, **common).materialize()
    return train, dev


def dev_source(cfg: XHConfig, graphs_uri: str, s3) -> str | None:
    """The graphs folder of the dev set, or None for a split cut from the training graphs: `train.dev_graphs`
    when given; for FEVER, the dev claims' own retrieval-only build (`<graphs>-dev`,
    `graphs.claims_split=dev`) when it exists, instead of a split cut from gold-first training graphs."""
    if cfg.train.dev_graphs:
        return cfg.train.dev_graphs
    if cfg.model.task != "fever":
        return None
    fs, path = resolve(graphs_uri.rstrip("/") + "-dev", s3)
    if fs.get_file_info(path).type.name == "NotFound":
        log("train", "warning: no fever-dev graphs; the dev split is cut from gold-first training graphs")
        return None
    return graphs_uri.rstrip("/") + "-dev"


def token_plan(cfg: XHConfig, train_ds, num_train: int, sample_size: int = 256):
    """`batching=tokens`: batches hold as many graphs as fit, so the steps are planned from how the first
    `sample_size` training graphs pack (`xh.train.batching.plan_token_batches`)."""
    from xh.graph.encode import encode_graphs
    from xh.model import load_tokenizer

    tokenizer = load_tokenizer(cfg.model.backbone)
    rows = train_ds.take_batch(min(sample_size, num_train), batch_format="pyarrow").to_pylist()
    sample = encode_graphs(rows, tokenizer, cfg.model.max_node_tokens)
    return plan_token_batches(sample, num_train, cfg)


def step_plan(cfg: XHConfig, train_ds, num_train: int):
    """The run's step plan: `batch_graphs` graphs a batch, or with `batching=tokens` the token plan alone
    (`batch_graphs` does not apply there, so it must not refuse a run)."""
    if cfg.train.batching == "tokens":
        return token_plan(cfg, train_ds, num_train)
    return plan_steps(
        num_train,
        workers=cfg.train.workers,
        batch_size=cfg.train.batch_graphs,
        grad_accum=cfg.train.grad_accum,
        epochs=cfg.train.epochs,
        max_steps=cfg.train.max_steps,
        unit="graphs",
    )


def _kinds(cfg: XHConfig) -> tuple[str, ...] | None:
    """The question types one model trains and is evaluated on (None: all of them)."""
    kind = cfg.train.question_types
    return (kind,) if kind in ("bridge", "comparison") else None


def run_split(cfg: XHConfig, graphs_uri: str, dev_graphs: str | None) -> dict:
    """The split this run trains on, as recorded with its MLflow run (`xh.train.split`): promotion reads it."""
    return split_record(graphs_uri, dev_graphs, cfg.train.dev_fraction, _kinds(cfg))


def dev_misses(cfg: XHConfig, graphs_uri: str, dev_graphs: str | None, s3) -> list[str]:
    """Ids of dev questions quarantined at graph building: training's dev metrics count them as misses
    (`xh.train.split.dev_missed` of this run's split)."""
    return dev_missed(run_split(cfg, graphs_uri, dev_graphs), s3)


def lineage(split: dict, num_train: int, num_dev: int, s3) -> list[tuple[dict, str]]:
    """The run's inputs for `mlflow.log_input`: its train and dev graphs (source, digest, rows), each digest
    covering the folder's files and the split that cut it."""
    from xh.tracking import dataset_ref

    how = {k: split[k] for k in ("dev_fraction", "question_types")}
    train = dataset_ref(split["graphs"], "graphs-train", {"num_rows": num_train, "split": "train", **how}, s3=s3)
    dev_folder = split["dev_graphs"] or split["graphs"]
    dev = dataset_ref(dev_folder, "graphs-dev", {"num_rows": num_dev, "split": "dev", **how}, s3=s3)
    return [(train, "training"), (dev, "validation")]


def fit(cfg: XHConfig) -> dict:
    """Run the trainer; return the best checkpoint's folder (a local copy), metrics and MLflow run id."""
    s3 = s3_settings(cfg)
    cfg = absolute_tracking(cfg)
    paths = _paths(cfg)
    for uri in filter(None, (paths["graphs"], cfg.train.dev_graphs)):  # before Ray starts: a one-line error
        require_graphs(uri, s3)  # complete, with every column: not found inside a Train worker
    BatchLayout.of(cfg)  # a batch too small for one row: a one-line error before Ray starts

    import ray.train
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    init_ray(cfg)
    dev_graphs = dev_source(cfg, paths["graphs"], s3)
    train_ds, dev_ds = datasets(cfg, paths["graphs"], dev_graphs, s3)
    num_train, num_dev = train_ds.count(), dev_ds.count()
    plan = step_plan(cfg, train_ds, num_train)
    split = run_split(cfg, paths["graphs"], dev_graphs)
    log("train", f"{num_train} training graphs, {num_dev} dev graphs; plan {asdict(plan)}")
    storage_fs = s3.pyarrow_fs() if is_s3(paths["storage"]) else None
    storage_path = resolve(paths["storage"], s3)[1] if storage_fs else paths["storage"]
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config={
            "cfg": cfg.model_dump(),
            "plan": asdict(plan),
            "storage_dir": join(paths["storage"], cfg.train.run_name),
            "graph_settings": graph_settings(paths["graphs"], s3),
            "dev_missed": dev_missed(split, s3),
            "split": split,
            "inputs": lineage(split, num_train, num_dev, s3),
        },
        scaling_config=ScalingConfig(
            num_workers=cfg.train.workers,
            use_gpu=cfg.train.use_gpu,
            resources_per_worker={"CPU": cfg.train.cpus_per_worker} | ({"GPU": 1} if cfg.train.use_gpu else {}),
            placement_strategy=cfg.train.placement_strategy,
        ),
        run_config=RunConfig(
            name=cfg.train.run_name,
            storage_path=storage_path,
            storage_filesystem=storage_fs,
            checkpoint_config=CheckpointConfig(
                num_to_keep=cfg.train.keep_checkpoints,
                checkpoint_score_attribute=f"dev_{_metric(cfg)}",
                checkpoint_score_order="max",
            ),
            failure_config=FailureConfig(max_failures=cfg.train.max_failures),
            worker_runtime_env=injected_failure_env(),
        ),
        datasets={"train": train_ds, "dev": dev_ds},
        dataset_config=ray.train.DataConfig(datasets_to_split=["train"]),
    )
    result = trainer.fit()
    key = f"dev_{_metric(cfg)}"
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


def graph_settings(graphs_uri: str, s3) -> dict:
    """The settings the graphs table was built with (its `_summary.json`), logged with the training run."""
    from xh.graph.store import read_summary

    summary = read_summary(graphs_uri, s3)
    settings = {k: summary[k] for k in ("task", "setting", "edge_mode") if k in summary}
    return settings | summary.get("settings", {}) | {"table": graphs_uri}


def _metric(cfg: XHConfig) -> str:
    # `f1`, the default, is HotpotQA's; a FEVER run ranks by its headline metric unless told otherwise
    return "fever_score" if cfg.model.task == "fever" and cfg.train.metric == "f1" else cfg.train.metric


def fit_separate(cfg: XHConfig) -> dict:
    """`train.question_types=separate`: a bridge model and a comparison model (two runs, `<run_name>-bridge`
    and `-comparison`), joined into one routed model folder (`xh.inference.save_routed`). Its dev metrics
    are the per-type ones weighted by their questions: the official metrics are means over questions,
    and the two dev sets split the mixed one by type."""
    import tempfile

    from xh.inference import ROUTED_TYPES, save_routed

    parts = {}
    for kind in ROUTED_TYPES:
        part = cfg.model_copy(deep=True)
        part.train.question_types = kind
        part.train.run_name = f"{cfg.train.run_name}-{kind}"
        parts[kind] = fit(part)
        log("train", f"{kind} model: {parts[kind]['metrics']}")
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


def record_split(cfg: XHConfig, run_id: str) -> None:
    """Write `cfg`'s split (all question types of its graphs) as `split.json` of the MLflow run `run_id`."""
    import mlflow

    from xh.tracking import configure
    from xh.train.split import SPLIT_ARTIFACT

    s3, graphs = s3_settings(cfg), _paths(cfg)["graphs"]
    configure(absolute_tracking(cfg).mlflow, s3)
    mlflow.MlflowClient().log_dict(run_id, run_split(cfg, graphs, dev_source(cfg, graphs, s3)), SPLIT_ARTIFACT)


def run(cfg: XHConfig) -> dict:
    from xh.registry import log_and_register

    outcome = fit_separate(cfg) if cfg.train.question_types == "separate" else fit(cfg)
    summary = {k: v for k, v in outcome.items() if k != "checkpoint"}
    if cfg.train.question_types == "separate":
        # the routed model answers every type: the run it is registered with (the first part's) records
        # the split of both parts, not its own part's
        record_split(cfg, outcome["mlflow_run_id"])
    if cfg.train.register_as:
        os.environ.update(s3_settings(cfg).env())
        summary["registered"] = log_and_register(
            outcome["model_dir"],
            run_id=outcome["mlflow_run_id"],
            cfg=absolute_tracking(cfg),
            metrics=outcome["metrics"],
            graphs_uri=_paths(cfg)["graphs"],
        )
        log("train", f"registered {summary['registered']}")
    return summary


if __name__ == "__main__":
    main("train", run)
