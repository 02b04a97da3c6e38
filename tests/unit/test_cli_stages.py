"""The training, scoring and promotion commands refuse bad input in one line, before any work starts."""

import subprocess
import sys

import pytest


def _xh(*args: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "xh.cli", *args], capture_output=True, text=True, cwd=cwd, timeout=120)


@pytest.mark.parametrize(
    "args, message",
    [
        (["train", "--set", "train.graphs=no/such/graphs"], "error: no graphs at no/such/graphs"),
        (["train", "--set", "train.epochs=zero"], "error: config key 'train.epochs'"),
        (["score", "--model", "xh-hotpot@champion", "--input", "."], "error: score.model must be models:/"),
        (["score", "--input", "no/such/folder"], "error: "),
        (["promote", "--model", "xh-hotpot"], "error: --eval-set is required"),
        (["promote", "--eval-set", "no/such/graphs"], "error: no evaluation set at no/such/graphs"),
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(args, message, tmp_path):
    result = _xh(*args, "--set", f"mlflow.tracking_uri=sqlite:///{tmp_path}/mlflow.db", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(message), result.stderr
