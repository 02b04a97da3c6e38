"""Registry errors of `xh` name the tracking store they searched (#43): a mistyped model name against a real
SQLite store is one line naming the store and the model, exit 2, and the store is left as it was."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def store(tmp_path) -> str:
    """A real SQLite tracking store (MLflow's schema) holding one registered model, `xh-hotpot`."""
    import mlflow

    uri = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"
    (tmp_path / "store").mkdir()
    mlflow.MlflowClient(uri).create_registered_model("xh-hotpot")
    return uri


def _xh(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    command = [sys.executable, "-m", "workflows.cli", *args]
    return subprocess.run(command, capture_output=True, text=True, cwd=cwd, env=env, timeout=180)


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["score", "--model", "models:/xh-hotpt@champion", "--input", "q.jsonl"],
            "error: score.model: cannot resolve models:/xh-hotpt@champion in the tracking store sqlite:///",
        ),
        (
            ["promote", "rollback", "--model", "xh-hotpt"],
            "error: promote.model: no registered model 'xh-hotpt' in the tracking store sqlite:///",
        ),
    ],
)
def test_a_mistyped_model_name_names_the_tracking_store_it_searched(args, message, store, tmp_path):
    (tmp_path / "q.jsonl").write_text(json.dumps({"qid": "a", "question": "Who?"}) + "\n")
    before = sorted(p.name for p in tmp_path.rglob("*"))
    result = _xh(*args, "--set", f"mlflow.tracking_uri={store}", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(message) and "mlflow.db" in lines[0], result.stderr
    assert sorted(p.name for p in tmp_path.rglob("*")) == before  # no store, no folder created
