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
from xh.train.loop import in_dev_split, train_loop_per_worker
from xh.train.state import MODEL_DIR, read_progress
from xh.train.worker import plan_steps


def _paths(cfg: XHConfig) -> dict[str, str]:
    root = cfg.storage.root
    storage = cfg.train.storage_path or join(root, "train")
    if not is_s3(storage):
        storage = str(Path(storage).resolve())  # Ray Train wants an absolute local path
    return {"graphs": cfg.train.graphs or join(root, "graphs", cfg.model.task), "storage": storage}


def datasets(cfg: XHConfig, graphs_uri: str, s3):
    """(train, dev) Ray datasets, materialized: their sizes fix the step plan, and nothing is left for
    read tasks to compete with the training workers for CPUs."""
    import pyarrow as pa
    import ray.data

    fs, path = resolve(graphs_uri, s3)
    graphs = ray.data.read_parquet(path, filesystem=fs)
    dev_graphs = cfg.train.dev_graphs or _held_out_dev(cfg, graphs_uri, s3)
    if dev_graphs:
        dev_fs, dev_path = resolve(dev_graphs, s3)
        return graphs.materialize(), ray.data.read_parquet(dev_path, filesystem=dev_fs).materialize()
    fraction = cfg.train.dev_fraction

    def split(batch, dev: bool):
        mask = [in_dev_split(q, fraction) == dev for q in batch.column("qid").to_pylist()]
        return batch.filter(pa.array(mask, type=pa.bool_()))

    common = dict(batch_format="pyarrow", zero_copy_batch=True)
    train = graphs.map_batches(split, fn_kwargs={"dev": False}, **common).materialize()
    dev = graphs.map_batches(split, fn_kwargs={"dev": True}, **common).materialize()
    return train, dev


def _held_out_dev(cfg: XHConfig, graphs_uri: str, s3) -> str | None:
    """FEVER: the dev claims' own retrieval-only build (`<graphs>-dev`, `graphs.claims_split=dev`) when
    it exists, instead of a split cut from gold-first training graphs."""
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
    train_ds, dev_ds = datasets(cfg, paths["graphs"], s3)
    num_train, num_dev = train_ds.count(), dev_ds.count()
    plan = plan_steps(
        num_train,
        workers=cfg.train.workers,
        batch_size=cfg.train.batch_graphs,
        grad_accum=cfg.train.grad_accum,
        epochs=cfg.train.epochs,
        max_steps=cfg.train.max_steps,
        unit="graphs",
    )
    if cfg.train.batching == "tokens":
        plan = token_plan(cfg, train_ds, num_train)
    log("train", f"{num_train} training graphs, {num_dev} dev graphs; plan {asdict(plan)}")
    storage_fs = s3.pyarrow_fs() if is_s3(paths["storage"]) else None
    storage_path = resolve(paths["storage"], s3)[1] if storage_fs else paths["storage"]
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config={
            "cfg": cfg.model_dump(),
            "plan": asdict(plan),
            "storage_dir": join(paths["storage"], cfg.train.run_name),
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
        ),
        datasets={"train": train_ds, "dev": dev_ds},
        dataset_config=ray.train.DataConfig(datasets_to_split=["train"]),
    )
    result = trainer.fit()
    key = f"dev_{_metric(cfg)}"
    # The latest first: for a remote checkpoint, as_directory() removes on exit the temporary folder that
    # to_directory() of the same checkpoint (the best one is often the latest) would return.
    with result.checkpoint.as_directory() as latest:
        final = read_progress(latest)
    best, _ = max(result.best_checkpoints, key=lambda cm: cm[1].get(key, float("-inf")))
    local = best.to_directory()
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


def _metric(cfg: XHConfig) -> str:
    # `f1`, the default, is HotpotQA's; a FEVER run ranks by its headline metric unless told otherwise
    return "fever_score" if cfg.model.task == "fever" and cfg.train.metric == "f1" else cfg.train.metric


def run(cfg: XHConfig) -> dict:
    from xh.registry import log_and_register

    outcome = fit(cfg)
    summary = {k: v for k, v in outcome.items() if k != "checkpoint"}
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
