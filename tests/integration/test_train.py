"""Training on Ray Train against the real services: two workers on the two nodes of the session
cluster, MLflow server, checkpoints on the S3 endpoint, a registered model that loads by alias and
answers; then a worker killed mid-run and the run finishing with exactly the planned steps."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import mlflow
import pyarrow.dataset as pads
import pytest

from xh.config import load_config


@pytest.fixture(scope="module")
def world_graphs(synth_tables, tmp_path_factory) -> str:
    """Distractor-setting graphs of the generated world's 60 questions (no retrieval needed)."""
    from workflows.graphs import build

    tables, _ = synth_tables
    questions = tables.parent / "world" / "hotpot" / "questions.json"
    out = tmp_path_factory.mktemp("train-graphs")
    cfg = load_config(
        None, [f"storage.root={out}", "graphs.setting=distractor", f"graphs.questions={questions}", "graphs.workers=1"]
    )
    summary = build(cfg)
    assert summary["graphs"] > 40, summary
    return str(out / "graphs" / "hotpot")


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


def test_two_workers_on_two_nodes_register_a_model_that_loads_by_alias(
    world_graphs, tiny_backbone, ray_cluster, mlflow_server, s3_endpoint, tmp_path
):
    from workflows.train import run

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
            "train.max_steps=4",
            "train.eval_every=2",
            f"train.storage_path=s3://xh-test/train-{uuid.uuid4().hex[:6]}",
            f"train.register_as={name}",
        ],
    )
    summary = run(cfg)

    assert summary["step"] == summary["planned_steps"] == 4
    assert summary["registered"]["version"] == 1
    mlflow.set_tracking_uri(mlflow_server)
    run_data = mlflow.get_run(summary["mlflow_run_id"]).data
    assert run_data.tags["worker_nodes"] == "2"  # one worker on each node of the session cluster
    assert run_data.params["train.workers"] == "2"
    assert "dev_f1" in run_data.metrics and "graphs_per_s" in run_data.metrics
    # the graphs table's own settings are logged with the run
    assert run_data.params["graphs.edge_mode"] == "hyperlink" and run_data.params["graphs.setting"] == "distractor"
    assert run_data.params["graphs.expansion_keep"] == "15"
    # dev questions quarantined at graph building count as misses
    from xh.train.loop import in_dev_split

    quarantine = pads.dataset(str(Path(world_graphs).parent / "quarantine" / "hotpot"), format="parquet")
    lost = [json.loads(r["raw"])["qid"] for r in quarantine.to_table().to_pylist()]
    assert run_data.metrics["dev_missed"] == sum(in_dev_split(q, 0.25) for q in lost)
    # checkpoints went to the S3 endpoint
    fs = s3_endpoint.pyarrow_fs()
    bucket_path = cfg.train.storage_path[len("s3://") :]
    from xh.storage import list_paths

    assert any(p.endswith("model.safetensors") for p in list_paths(fs, bucket_path))

    model = mlflow.pyfunc.load_model(f"models:/{name}@challenger")
    from xh.registry import graph_input

    rows = pads.dataset(world_graphs, format="parquet").head(3).to_pylist()
    predictions = model.predict(graph_input(rows))
    assert list(predictions["qid"]) == [r["qid"] for r in rows]
    assert all(isinstance(a, str) for a in predictions["answer"])
    assert all(isinstance(json.loads(sf), list) for sf in predictions["supporting_facts"])
    version = mlflow.MlflowClient().get_model_version(name, "1")
    assert version.tags["git_sha"] and "data_snapshot" in version.tags and "dev_f1" in version.tags


def test_a_worker_killed_mid_run_resumes_from_the_checkpoint_without_duplicate_steps(
    world_graphs, tiny_backbone, ray_cluster, mlflow_server, tmp_path
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
            "train.max_steps=6",
            "train.eval_every=2",
            "train.fail_at_step=3",
            "train.max_failures=1",
            "train.register_as=null",
            "train.attention_figures=false",
        ],
    )
    outcome = fit(cfg)

    assert outcome["step"] == outcome["planned_steps"] == 6
    storage = Path(tmp_path / "train" / cfg.train.run_name)
    assert (storage / "xh-injected-failure").read_text().startswith("failed at step 3")
    client = mlflow.MlflowClient(mlflow_server)
    steps = [m.step for m in client.get_metric_history(outcome["mlflow_run_id"], "loss")]
    assert steps == [1, 2, 3, 4, 5, 6]  # step 3 ran twice (before and after the failure), logged once

    # Re-running with the same run name resumes the finished run instead of training again.
    again = fit(cfg)
    assert again["step"] == 6 and again["mlflow_run_id"] == outcome["mlflow_run_id"]
    assert [m.step for m in client.get_metric_history(outcome["mlflow_run_id"], "loss")] == steps
