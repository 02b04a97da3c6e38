"""One CLI: `xh <stage>` calls its driver; bad input (a bad value, an
unknown key, a choice not among a flag's values) is one line on stderr and exit code 2, before any work starts."""

import json
import logging
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from xh.config import STAGES, load_config

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


DRIVERS = sorted(p.stem for p in (ROOT / "workflows").glob("*.py") if p.stem not in ("__init__", "common", "cli"))
# The sub-command a driver's stage runs by default, where the stage has several.
COMMANDS = {"wiki": ["wiki", "process"], "retrieve": ["retrieve", "all"], "graphs": ["graphs", "build"]}


def test_the_cli_is_the_one_front_door_of_every_driver():
    """#41: no `__main__` in workflows/ but the CLI's own; each driver module is a command of `xh` that refuses
    a bad key of its config section in one line with exit code 2, and `xh config show <stage>` shows it."""
    from workflows.cli import app

    assert {"wiki", "retrieve", "rerank", "graphs", "train", "qtype", "promote", "score", "demo"} <= set(DRIVERS)
    mains = [p.name for p in (ROOT / "workflows").glob("*.py") if "__main__" in p.read_text()]
    assert mains == ["cli.py"] and not (ROOT / "workflows" / "__main__.py").exists()
    runner = CliRunner()
    for stage in DRIVERS:
        command = COMMANDS.get(stage, [stage])
        helped = runner.invoke(app, [*command, "--help"], prog_name="xh")
        assert helped.exit_code == 0 and f"Usage: xh {' '.join(command)} [OPTIONS]" in helped.stdout, stage
        refused = runner.invoke(app, [*command, "--set", f"{stage}.bogus=1"])
        assert (refused.exit_code, refused.stderr) == (2, f"error: unknown config key '{stage}.bogus'\n"), stage
        shown = runner.invoke(app, ["config", "show", stage])
        assert shown.exit_code == 0 and stage in yaml.safe_load(shown.stdout), stage


def test_each_command_calls_its_drivers_function_with_the_config_and_prints_its_summary(monkeypatch, capsys):
    """`xh -vv synth --set ...` calls `workflows.synth.run` (looked up when the command runs, so a test can
    replace it) with the config the arguments make, after -v/-q, and prints its summary as one JSON line."""
    import workflows.synth
    from tests.cli import xh

    seen = []

    def run(cfg):
        seen.append((cfg.synth.num_docs, logging.getLogger("xh").getEffectiveLevel()))
        return {"docs": cfg.synth.num_docs}

    monkeypatch.setattr(workflows.synth, "run", run)
    xh("-vv", "synth", "--set", "synth.num_docs=500")
    assert seen == [(500, logging.DEBUG)] and json.loads(capsys.readouterr().out) == {"docs": 500}
    xh("-q", "synth", "--config", str(ROOT / "configs" / "demo.yaml"))
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


def _helps() -> dict[str, str]:
    """`xh ... --help` of every command and group, by its command line."""
    import typer

    from workflows.cli import app

    found, runner = {}, CliRunner()

    def walk(command, path):
        found[" ".join(path)] = runner.invoke(app, [*path, "--help"], prog_name="xh", terminal_width=200).stdout
        for name, sub in getattr(command, "commands", {}).items():
            walk(sub, [*path, name])

    walk(typer.main.get_command(app), [])
    return found


def test_help_shows_what_a_value_looks_like_not_a_python_type():
    """#43: metavars such as KEY=VALUE, PATH|s3://... and models:/NAME@ALIAS; flags show none."""
    helps = _helps()
    for command, text in helps.items():
        for python_type in ("<str>", "<bool>", "<int>", "<float>", "<list["):
            assert python_type not in text, (command, python_type, text)
    assert "KEY=VALUE" in helps["synth"] and "PATH" in helps["synth"]  # --set, --config
    assert "PATH|s3://..." in helps["score"] and "models:/NAME@ALIAS" in helps["score"]
    assert "PATH|s3://..." in helps["wiki process"] and "PATH|s3://..." in helps["promote"]
    assert "<hotpot|fever>" in helps["graphs build"]  # a choice shows its values


def test_each_command_has_a_set_example_of_its_own_that_is_a_valid_setting_of_its_stage():
    import typer

    from workflows.cli import app

    examples = {}

    def walk(command, path):
        for param in command.params:
            if "--set" in param.opts and path[0] in STAGES:
                examples[" ".join(path)] = re.search(r"e\.g\. --set (\S+)", param.help).group(1)
        for name, sub in getattr(command, "commands", {}).items():
            walk(sub, [*path, name])

    for name, command in typer.main.get_command(app).commands.items():
        walk(command, [name])
    assert {"synth", "score", "train", "promote", "serve", "graphs build", "retrieve index"} <= set(examples)
    for command, example in examples.items():
        load_config(None, [example])  # a real key with a valid value
        assert example.split(".")[0] in STAGES[command.split(" ")[0]], (command, example)
    assert len(set(examples.values())) > len(examples) // 2, examples


def test_xh_version_prints_the_projects_version():
    from workflows.cli import app

    result = CliRunner().invoke(app, ["--version"], prog_name="xh")
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert result.exit_code == 0 and result.stdout == f"xh {version}\n"


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["synth", "--set", "synth.num_doc=5"],
            "error: unknown config key 'synth.num_doc' (did you mean 'synth.num_docs'?)",
        ),
        (["score", "--set", "scroe.model=x"], "error: unknown config key 'scroe' (did you mean 'score'?)"),
        (["config", "show", "synht"], "error: unknown stage 'synht' (did you mean 'synth'?)"),
        (["train", "--set", "train.bogus=1"], "error: unknown config key 'train.bogus'\n"),  # nothing near: no guess
    ],
)
def test_an_unknown_key_gets_the_nearest_known_one(args, message):
    from workflows.cli import app

    result = CliRunner().invoke(app, args, prog_name="xh")
    assert result.exit_code == 2 and result.stderr.startswith(message) and result.stderr.count("\n") == 1


def test_score_help_says_what_incremental_and_run_date_do_and_where_output_lands():
    text = " ".join(_helps()["score"].split())
    assert "score.incremental=true" in text and "not scored yet" in text
    assert "{run_date}" in text and "score.run_date" in text
    assert "<storage.root>/predictions" in text and "run_date=DATE/model=NAME/version=V/" in text


def test_config_show_describe_gives_every_setting_its_description(monkeypatch):
    from workflows.cli import app
    from xh.config import XHConfig

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    result = CliRunner().invoke(app, ["config", "show", "score", "--describe"], prog_name="xh")
    assert result.exit_code == 0, result.output
    described = yaml.safe_load(result.stdout)  # still YAML: the descriptions are comments
    assert described == yaml.safe_load(CliRunner().invoke(app, ["config", "show", "score"]).stdout)
    keys = [line for line in result.stdout.splitlines() if line.startswith("  ")]
    assert keys and all("  # " in line for line in keys), [line for line in keys if "  # " not in line]
    assert "becomes the run date" in result.stdout  # score.input's own description
    undescribed = [
        f"{section}.{key}"
        for section, field in XHConfig.model_fields.items()
        for key, setting in field.annotation.model_fields.items()
        if not setting.description
    ]
    assert undescribed == []


def test_docs_configuration_md_is_the_generated_reference(monkeypatch):
    """docs/configuration.md ends with `xh config show --describe --markdown` of the defaults: regenerate it
    with that command when a setting changes."""
    from xh.config import XHConfig, describe

    page = (ROOT / "docs" / "configuration.md").read_text()
    marker = "<!-- generated: xh config show --describe --markdown -->\n"
    assert marker in page
    assert page.split(marker, 1)[1].strip() == describe(XHConfig().model_dump(mode="json"), markdown=True).strip()


def test_config_show_never_prints_a_credential(monkeypatch):
    """#44 (9): a tracking password from MLFLOW_TRACKING_URI or --set, a token in a query, a secret-named value."""
    from workflows.cli import app

    secret = "hunter2-for-the-test"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://alice:{secret}@mlflow:5000")
    runner = CliRunner()
    for args in (
        ["config", "show", "score"],
        ["config", "show", "--describe"],
        ["config", "show", "synth", "--set", f"storage.s3_endpoint_url=https://s3.example/?X-Amz-Signature={secret}"],
        ["config", "show", "train", "--set", f"mlflow.tracking_uri=postgresql://bob:{secret}@db/mlflow"],
    ):
        result = runner.invoke(app, args, prog_name="xh")
        assert result.exit_code == 0 and secret not in result.output, (args, result.output)
        assert "***" in result.output
    shown = yaml.safe_load(runner.invoke(app, ["config", "show", "score"]).stdout)
    assert shown["mlflow"]["tracking_uri"] == "http://***@mlflow:5000"


def test_a_score_of_a_missing_tracking_store_names_it_and_creates_nothing(tmp_path):
    """#43: a mistyped model name (or a run from another folder) against the default SQLite store says which
    store it looked in, in one line, and leaves no new store behind."""
    (tmp_path / "q.jsonl").write_text(json.dumps({"qid": "a", "question": "Who?"}) + "\n")
    for args in (
        ["score", "--model", "models:/xh-hotpt@champion", "--input", "q.jsonl"],
        ["promote", "rollback", "--model", "xh-hotpt"],
    ):
        result = subprocess.run(
            [sys.executable, "-m", "workflows.cli", *args],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            timeout=120,
            env={k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")},
        )
        assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
        assert "no MLflow tracking store at sqlite:///" in result.stderr and "mlflow.db" in result.stderr
        assert not (tmp_path / "runs").exists() and not list(tmp_path.rglob("*.db")), list(tmp_path.rglob("*"))
