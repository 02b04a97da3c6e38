"""One CLI: `xh <stage>` and `python -m workflows.<stage>` are the same typer command; bad input (a bad value, an
unknown key, a choice not among a flag's values) is one line on stderr and exit code 2, before any work starts."""

import json
import logging
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

ROOT = Path(__file__).resolve().parents[3]


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


STAGES = sorted(p.stem for p in (ROOT / "workflows").glob("*.py") if p.stem not in ("__init__", "common", "cli"))


def _module(stage: str, *args: str, monkeypatch, capsys) -> tuple[int, str, str]:
    """`python -m workflows.<stage> ARGS`, in this process: (exit code, stdout, stderr)."""
    monkeypatch.setattr(sys, "argv", [f"workflows/{stage}.py", *args])
    monkeypatch.delitem(sys.modules, f"workflows.{stage}", raising=False)  # as a fresh `python -m` finds it
    code = 0
    try:
        runpy.run_module(f"workflows.{stage}", run_name="__main__")
    except SystemExit as e:
        code = e.code
    out = capsys.readouterr()
    return code, out.out, out.err


def test_python_m_workflows_stage_is_the_xh_command_of_that_stage(tmp_path, monkeypatch, capsys):
    """For each driver module in workflows/: `python -m workflows.<stage>` prints the help of `xh <stage>` (its
    default sub-command where it has several), refuses a bad key of its config section in one line with exit
    code 2 as `xh <stage>` does, and `xh config show <stage>` shows that section."""
    from workflows.cli import DEFAULT_COMMAND, app

    assert {"wiki", "retrieve", "rerank", "graphs", "train", "qtype", "promote", "score", "demo"} <= set(STAGES)
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    for stage in STAGES:
        command = [stage, *([DEFAULT_COMMAND[stage]] if stage in DEFAULT_COMMAND else [])]
        code, out, _ = _module(stage, "--help", monkeypatch=monkeypatch, capsys=capsys)
        helped = runner.invoke(app, [*command, "--help"], prog_name="xh")
        assert code == 0 and helped.exit_code == 0, (stage, helped.output)
        assert out == helped.stdout and f"Usage: xh {' '.join(command)} [OPTIONS]" in out, (stage, out)

        code, out, err = _module(stage, "--set", f"{stage}.bogus=1", monkeypatch=monkeypatch, capsys=capsys)
        assert (code, out, err) == (2, "", f"error: unknown config key '{stage}.bogus'\n"), stage
        refused = runner.invoke(app, [*command, "--set", f"{stage}.bogus=1"])
        assert (refused.exit_code, refused.stderr) == (2, err), stage

        shown = runner.invoke(app, ["config", "show", stage])
        assert shown.exit_code == 0 and yaml.safe_load(shown.stdout)[stage], (stage, shown.output)


def test_python_m_runs_the_given_runner_and_prints_its_summary(tmp_path, monkeypatch, capsys):
    """`main(stage, run)` (what `python -m workflows.<stage>` calls) runs `run` on the config the arguments make,
    after leading -v/-q, prints its summary as one JSON line, and returns."""
    from workflows.common import main

    seen = []

    def run(cfg):
        seen.append((cfg.synth.num_docs, logging.getLogger("xh").getEffectiveLevel()))
        return {"docs": cfg.synth.num_docs}

    main("synth", run, ["-vv", "--set", "synth.num_docs=500"])
    assert seen == [(500, logging.DEBUG)] and json.loads(capsys.readouterr().out) == {"docs": 500}
    main("synth", run, ["-q", "--config", str(ROOT / "configs" / "demo.yaml")])
    assert seen[-1] == (2000, logging.WARNING)


def test_xh_lists_the_stages_in_pipeline_order_and_takes_v_as_a_flag():
    from workflows.cli import app

    helped = CliRunner().invoke(app, ["--help"], prog_name="xh", terminal_width=200)
    listed = [line.split()[1] for line in helped.stdout.splitlines() if line.startswith("│ ") and line[2] != " "]
    commands = [name for name in listed if not name.startswith("-")]  # the Commands panel
    assert commands == [
        "synth",
        "wiki",
        "retrieve",
        "rerank",
        "graphs",
        "train",
        "qtype",
        "promote",
        "score",
        "serve",
        "demo",
        "eval",
        "config",
    ], helped.stdout
    (verbose,) = [line for line in helped.stdout.splitlines() if "--verbose" in line]
    assert "<int>" not in verbose and "INTEGER" not in verbose, verbose


@pytest.mark.parametrize(
    "args, message",
    [
        (["graphs", "build", "--task", "hotpt"], "error: Invalid value for '--task' / '-t': "),
        (["graphs", "build", "--setting", "open"], "error: Invalid value for '--setting': "),
        (["wiki", "process", "--format", "xml"], "error: Invalid value for '--format' / '-f': "),
        (["demo", "--train-everything"], "error: No such option: --train-everything"),
    ],
)
def test_a_choice_not_among_a_flags_values_is_one_line_and_exit_code_2(args, message, capsys):
    from workflows.cli import app

    with pytest.raises(SystemExit) as exited:
        app(args=args, prog_name="xh")
    err = capsys.readouterr().err
    assert exited.value.code == 2 and err.startswith(message) and err.count("\n") == 1, err


def test_a_usage_error_is_one_line_on_stderr(tmp_path):
    result = _xh("graphs", "build", "--task", "hotpt", cwd=tmp_path)
    assert result.returncode == 2 and result.stderr.startswith("error: Invalid value for '--task'"), result.stderr
    assert result.stderr.count("\n") == 1 and "hotpot" in result.stderr, result.stderr
