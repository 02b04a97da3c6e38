"""Training on Ray Train against the real services: two workers on the two nodes of the session
cluster (token-budget batches), MLflow server, checkpoints on the S3 endpoint, a worker killed mid-run and the run
finishing with exactly the planned steps, a registered model that loads by alias and answers."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import mlflow
import pyarrow.dataset as pads
import pytest

from xh.config import load_config

FAILURE_MARKER = "xh-injected-failure"  # written next to the checkpoints so that the failure happens once


@pytest.fixture
def worker_dies_at_step_3(monkeypatch):
    """Fault injection from the test side: the rank-0 Train worker kills its process once at step 3, as a
    crashed node would. The driver (this process) hands `TorchTrainer` a wrapper of the worker loop; the
    wrapper, a closure and so pickled by value into each worker process, patches the loop's per-step hook
    (`xh.train.loop.step_done`) there before running the real loop. A marker next to the checkpoints makes
    the restarted worker carry on."""
    import xh.train.loop

    loop = xh.train.loop.train_loop_per_worker

    def dying_loop(config: dict) -> None:
        import os

        import xh.train.loop as worker_loop
        from xh.storage.store import Store

        step_done = worker_loop.step_done

        def die_once_at_step_3(worker) -> None:
            step_done(worker)
            if worker.rank != 0 or worker.progress.step != 3:
                return
            marker = Store().at(config["storage_dir"], FAILURE_MARKER)  # S3 settings from the worker's environment
            if not marker.exists():
                marker.write_bytes(b"failed at step 3\n")
                os._exit(1)

        worker_loop.step_done = die_once_at_step_3
        loop(config)

    monkeypatch.setattr(xh.train.loop, "train_loop_per_worker", dying_loop)


def _config(root: Path, graphs: str, backbone: str, cluster, tracking: str, overrides: list[str]):
    return load_config(
        None,
        [
            f"storage.root={root}",
            f"ray.address={cluster.address}",
            f"mlflow.tracking_uri={tracking}",
            f"mlflow.experiment=train-{uuid.uuid4().hex[:6]}",
            f"model.backbone={backbone}",
            "model.max_node_tokens=96",
            f"train.graphs={graphs}",
            "train.batch_graphs=2",
            "train.cpus_per_worker=0.5",
            "train.lr=1e-3",
            "train.eval_batch_graphs=16",
            "train.dev_fraction=0.25",
            *overrides,
        ],
    )


@pytest.mark.timeout(900)  # two Train runs (the second resumes the finished run); the session fixtures may start here
def test_two_workers_on_two_nodes_survive_a_killed_worker_and_register_a_model_that_loads_by_alias(
    world_graphs, tiny_backbone, ray_cluster, mlflow_server, s3_endpoint, tmp_path, worker_dies_at_step_3
):
    """One Ray Train run checks both: two workers on two nodes with checkpoints on S3, registered by
    alias; and a worker killed mid-run, resumed from the checkpoint with exactly the planned steps."""
    from workflows.train import fit, run
    from xh.storage.uris import list_paths, open_input

    name = f"xh-test-{uuid.uuid4().hex[:6]}"
    cfg = _config(
        tmp_path,
        world_graphs,
        tiny_backbone,
        ray_cluster,
        mlflow_server,
        [
            "train.workers=2",
            "train.placement_strategy=SPREAD",
            "train.max_steps=6",
            "train.eval_every=2",
            "train.max_failures=1",
            f"train.run_name=xh-test-{uuid.uuid4().hex[:6]}",
            "train.batching=tokens",  # graphs packed into 16 rows of 128 tokens: workers' batch counts differ
            "train.batch_tokens=2048",
            "train.epochs=2",
            f"train.storage_path=s3://xh-test/train-{uuid.uuid4().hex[:6]}",
            f"train.register_as={name}",
        ],
    )
    summary = run(cfg)

    assert summary["step"] == summary["planned_steps"] == 6
    assert summary["registered"]["version"] == 1
    mlflow.set_tracking_uri(mlflow_server)
    run_data = mlflow.get_run(summary["mlflow_run_id"]).data
    assert run_data.tags["worker_nodes"] == "2"  # one worker on each node of the session cluster
    assert run_data.params["train.workers"] == "2"
    assert "dev_f1" in run_data.metrics and "graphs_per_s" in run_data.metrics
    assert run_data.metrics["distinct_step_shapes"] == 1  # every batch [16, 128]
    assert run_data.metrics["real_token_fraction"] > 0.5 and 0 <= run_data.metrics["encode_wait_fraction"] < 1
    feed = [run_data.metrics[f"feed_{part}_fraction"] for part in ("data", "encode", "batch")]
    assert all(0 <= share < 1 for share in feed) and 0 < sum(feed) < 1  # the batch maker's time, by part
    # the graphs table's own settings are logged with the run
    assert run_data.params["graphs.edge_mode"] == "hyperlink" and run_data.params["graphs.setting"] == "distractor"
    assert run_data.params["graphs.seed"] == "13" and run_data.params["graphs.comparison_full"] == "True"
    # dev questions quarantined at graph building count as misses
    from xh.train.split import in_dev_split

    quarantine = pads.dataset(str(Path(world_graphs).parent / "quarantine" / "hotpot"), format="parquet")
    lost = [json.loads(r["raw"])["qid"] for r in quarantine.to_table().to_pylist()]
    assert run_data.metrics["dev_missed"] == sum(in_dev_split(q, 0.25) for q in lost)
    # checkpoints went to the S3 endpoint, and so did the marker of the injected failure
    fs = s3_endpoint.pyarrow_fs()
    bucket_path = cfg.train.storage_path[len("s3://") :]
    assert any(p.endswith("model.safetensors") for p in list_paths(fs, bucket_path))
    with open_input(f"{cfg.train.storage_path}/{cfg.train.run_name}/{FAILURE_MARKER}") as marker:
        assert marker.read().decode().startswith("failed at step 3")
    client = mlflow.MlflowClient(mlflow_server)
    steps = [m.step for m in client.get_metric_history(summary["mlflow_run_id"], "loss")]
    assert steps == [1, 2, 3, 4, 5, 6]  # step 3 ran twice (before and after the failure), logged once

    model = mlflow.pyfunc.load_model(f"models:/{name}@challenger")
    from xh.registry.pyfunc import graph_input

    rows = pads.dataset(world_graphs, format="parquet").head(3).to_pylist()
    predictions = model.predict(graph_input(rows))
    assert list(predictions["qid"]) == [r["qid"] for r in rows]
    assert all(isinstance(a, str) for a in predictions["answer"])
    assert all(isinstance(json.loads(sf), list) for sf in predictions["supporting_facts"])
    version = mlflow.MlflowClient().get_model_version(name, "1")
    assert version.tags["git_sha"] and "data_snapshot" in version.tags and "dev_f1" in version.tags

    # Re-running with the same run name resumes the finished run instead of training again.
    again = fit(cfg)
    assert again["step"] == 6 and again["mlflow_run_id"] == summary["mlflow_run_id"]
    assert [m.step for m in client.get_metric_history(summary["mlflow_run_id"], "loss")] == steps


@pytest.mark.gpu
def test_on_a_gpu_token_batches_train_in_bf16_checkpoint_and_resume_after_a_failure(
    world_graphs, tiny_backbone, ray_cluster, mlflow_server, tmp_path, worker_dies_at_step_3
):
    from workflows.train import fit

    cfg = _config(
        tmp_path,
        world_graphs,
        tiny_backbone,
        ray_cluster,
        mlflow_server,
        [
            "train.workers=1",
            "train.use_gpu=true",
            "train.bf16=true",
            "train.batching=tokens",
            "train.batch_tokens=4096",
            "train.encode_processes=1",
            "train.max_steps=6",
            "train.eval_every=2",
            "train.max_failures=1",
            "train.register_as=null",
        ],
    )
    outcome = fit(cfg)

    assert outcome["step"] == outcome["planned_steps"] == 6
    assert (tmp_path / "train" / cfg.train.run_name / "xh-injected-failure").exists()
    client = mlflow.MlflowClient(mlflow_server)
    assert [m.step for m in client.get_metric_history(outcome["mlflow_run_id"], "loss")] == [1, 2, 3, 4, 5, 6]
    run_data = client.get_run(outcome["mlflow_run_id"]).data
    assert run_data.metrics["distinct_step_shapes"] == 1 and "dev_f1" in run_data.metrics
    assert run_data.tags["device"] == "cuda"
