"""The harness is real: an mlflow server whose artifacts land on the S3 endpoint, two Ray nodes, CLI errors."""

import subprocess
import sys
import time

import pyarrow.fs as pafs
import pytest

from tests.conftest import ROOT, TEST_BUCKET


def test_mlflow_run_through_the_server_lands_its_artifact_on_s3(mlflow_server, s3_endpoint, tmp_path):
    import mlflow
    from mlflow.tracking import MlflowClient

    mlflow.set_tracking_uri(mlflow_server)
    experiment_id = mlflow.create_experiment(f"harness-{time.time_ns()}")
    note = tmp_path / "note.txt"
    note.write_text("hop attention\n")
    with mlflow.start_run(experiment_id=experiment_id) as run:
        mlflow.log_params({"train.lr": 2e-5, "model.hop_layers": 3})
        for step, loss in enumerate([2.0, 1.5, 1.2]):
            mlflow.log_metric("loss", loss, step=step)
        mlflow.log_artifact(str(note), artifact_path="notes")

    stored = MlflowClient(mlflow_server).get_run(run.info.run_id)
    assert stored.data.params == {"train.lr": "2e-05", "model.hop_layers": "3"}
    history = MlflowClient(mlflow_server).get_metric_history(run.info.run_id, "loss")
    assert [m.value for m in history] == [2.0, 1.5, 1.2]
    # proxied artifact storage: the server wrote the file to the S3 endpoint, not to a local folder
    fs = s3_endpoint.pyarrow_fs()
    found = [
        i.path
        for i in fs.get_file_info(pafs.FileSelector(f"{TEST_BUCKET}/mlflow-artifacts", recursive=True))
        if i.path.endswith(f"{run.info.run_id}/artifacts/notes/note.txt")
    ]
    assert len(found) == 1
    with fs.open_input_stream(found[0]) as f:
        assert f.read() == b"hop attention\n"
    # and a client reads it back through the server
    local = mlflow.artifacts.download_artifacts(
        run_id=run.info.run_id, artifact_path="notes/note.txt", dst_path=str(tmp_path / "dl")
    )
    assert open(local).read() == "hop attention\n"


@pytest.mark.multinode
def test_two_ray_nodes_run_tasks_side_by_side(ray_cluster):
    import ray

    alive = [n for n in ray.nodes() if n["Alive"]]
    assert len(alive) == 2 and ray.cluster_resources()["CPU"] == 2

    @ray.remote(num_cpus=1)
    def where() -> str:
        time.sleep(1.0)  # both tasks must hold a CPU at once, so they land on different nodes
        return ray.get_runtime_context().get_node_id()

    assert len(set(ray.get([where.remote(), where.remote()]))) == 2


def _cli(*args):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=ROOT, timeout=120)


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["-m", "workflows.cli", "config", "show", "synth", "--set", "synth.num_doc=5"],
            "error: unknown config key 'synth.num_doc'",
        ),
        (["-m", "workflows.cli", "synth", "--config", "no/such.yaml"], "error: config file not found: no/such.yaml"),
        (
            ["-m", "workflows.cli", "synth", "--set", "synth.num_docs=ten"],
            "error: config key 'synth.num_docs': input should be a valid integer",
        ),
        (["-m", "workflows.cli", "config", "show", "nosuch"], "error: unknown stage 'nosuch'"),
    ],
)
def test_config_errors_are_one_clear_line(args, message):
    result = _cli(*args)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().startswith(message)
    assert len(result.stderr.strip().splitlines()) == 1


def test_config_show_prints_the_effective_config():
    result = _cli(
        "-m", "workflows.cli", "config", "show", "synth", "--config", "configs/demo.yaml", "--set", "synth.seed=99"
    )
    assert result.returncode == 0, result.stderr
    assert "seed: 99" in result.stdout and "num_docs: 2000" in result.stdout and "root: runs/demo" in result.stdout
