"""MLflow tracking against the real `mlflow server`: MLFLOW_TRACKING_URI in a stage's environment is where its
run goes (over the config file's store), and a password inside the tracking URI reaches neither the run's
parameters nor the driver's output. Each check runs a fresh Python process, as a stage's driver is one."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import mlflow
import pytest

ROOT = Path(__file__).resolve().parents[2]
SECRET = "not-a-real-password-" + secrets.token_hex(6)

pytestmark = pytest.mark.integration

# What every stage does: its config from the command line and the environment, then `stage_run`.
DRIVER = """
import json, sys
from xh.config import load_config
from xh.tracking import stage_run

pairs = list(zip(sys.argv[1:], sys.argv[2:]))
config = next((value for flag, value in pairs if flag == "--config"), None)
with stage_run(load_config(config, [value for flag, value in pairs if flag == "--set"]), "synth") as run:
    pass
print(json.dumps({"run_id": run.info.run_id}))
"""


def _driver(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "RAY_"))}
    return subprocess.run(
        [sys.executable, "-c", DRIVER, *args],
        env={**clean, "PYTHONPATH": str(ROOT), **env},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=180,
    )


def _run_id(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])["run_id"]


def test_a_stage_run_goes_to_mlflow_tracking_uri_from_the_environment(mlflow_server, s3_endpoint, tmp_path):
    """The demo config names a SQLite store; the environment's server wins, and nothing is written locally."""
    done = _driver(
        ["--config", str(ROOT / "configs" / "demo.yaml"), "--set", "mlflow.experiment=env-tracking"],
        {"MLFLOW_TRACKING_URI": mlflow_server},
        tmp_path,
    )
    run = mlflow.MlflowClient(mlflow_server).get_run(_run_id(done))
    assert run.data.params["mlflow.tracking_uri"] == mlflow_server
    assert not (tmp_path / "runs").exists(), "the config file's SQLite store was used"


def test_a_password_in_the_tracking_uri_reaches_neither_params_nor_output(mlflow_server, s3_endpoint, tmp_path):
    with_password = mlflow_server.replace("http://", f"http://xh-user:{SECRET}@")
    done = _driver(["--set", f"mlflow.tracking_uri={with_password}", "--set", "mlflow.experiment=creds"], {}, tmp_path)
    run_id = _run_id(done)
    output = done.stdout + done.stderr
    assert "View run" in output  # MLflow's own line naming the tracking server is there, without the password
    assert SECRET not in output
    run = mlflow.MlflowClient(mlflow_server).get_run(run_id)
    assert run.data.params["mlflow.tracking_uri"] == mlflow_server.replace("http://", "http://***@")
    assert SECRET not in json.dumps(run.data.params) + json.dumps(run.data.tags)
