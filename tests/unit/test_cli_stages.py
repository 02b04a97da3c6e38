"""The training, scoring and promotion commands refuse bad input in one line, before any work starts."""

import subprocess
import sys

import pytest


def _xh(*args: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "workflows.cli", *args], capture_output=True, text=True, cwd=cwd, timeout=120
    )


@pytest.mark.parametrize(
    "args, message",
    [
        (["train", "--set", "train.graphs=no/such/graphs"], "error: no graphs at no/such/graphs"),
        (["train", "--set", "train.epochs=zero"], "error: config key 'train.epochs'"),
        (["score", "--model", "xh-hotpot@champion", "--input", "."], "error: score.model must be models:/"),
        (["score", "--input", "no/such/folder"], "error: "),
        (["promote", "--eval-set", "no/such/graphs"], "error: no evaluation set at no/such/graphs"),
        (["promote", "--min-delta", "-1"], "error: config key 'promote.min_delta'"),
        (["promote", "--floor", "0"], "error: config key 'promote.floor'"),
        (["promote", "rollback", "--set", "promote.actoin=rollback"], "error: unknown config key 'promote.actoin'"),
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(args, message, tmp_path):
    result = _xh(*args, "--set", f"mlflow.tracking_uri=sqlite:///{tmp_path}/mlflow.db", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(message), result.stderr


def test_every_stage_has_one_name_for_module_command_and_config_section(tmp_path):
    """For each driver module in workflows/: `xh config show <stage>` shows its section, and
    `python -m workflows.<stage>` is a command of its own (its parser, named after the module)."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    stages = sorted(p.stem for p in (root / "workflows").glob("*.py") if p.stem not in ("__init__", "common", "cli"))
    assert {"wiki", "retrieve", "rerank", "graphs", "train", "promote", "score"} <= set(stages)
    for stage in stages:
        shown = _xh("config", "show", stage, cwd=tmp_path)
        assert shown.returncode == 0, (stage, shown.stderr)
        helped = subprocess.run(
            [sys.executable, "-m", f"workflows.{stage}", "--help"],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            timeout=120,
        )
        assert helped.returncode == 0, (stage, helped.stderr)
        assert helped.stdout.startswith(f"usage: python -m workflows.{stage} "), (stage, helped.stdout)
        assert "--config" in helped.stdout and "--set" in helped.stdout, (stage, helped.stdout)
