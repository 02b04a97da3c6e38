"""The `xh` command: one sub-command per stage, each a thin call into `workflows/`.

    xh config show synth --set synth.num_docs=500
    xh synth --config configs/demo.yaml
    xh demo
"""

from __future__ import annotations

import json
import sys
from typing import List, Optional

import typer
import yaml

from xh.config import ConfigError, load_config, stage_dict

app = typer.Typer(help="Transformer-XH on Ray: multi-hop QA and fact verification over Wikipedia.", no_args_is_help=True)
config_app = typer.Typer(help="Inspect configuration.", no_args_is_help=True)
app.add_typer(config_app, name="config")

ConfigOpt = typer.Option(None, "--config", "-c", help="YAML file of config sections")
SetOpt = typer.Option(None, "--set", "-s", help="override, e.g. --set synth.num_docs=500 (repeatable)")


def _fail(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


def _run_stage(stage: str, config: Optional[str], overrides: Optional[List[str]], module: str | None = None) -> None:
    from importlib import import_module

    from workflows.common import USER_ERRORS

    try:
        cfg = load_config(config, overrides or [])
        summary = import_module(f"workflows.{module or stage}").run(cfg)
    except USER_ERRORS as e:
        _fail(str(e))
    typer.echo(json.dumps(summary, sort_keys=True))


@config_app.command("show")
def config_show(stage: str, config: Optional[str] = ConfigOpt, overrides: Optional[List[str]] = SetOpt) -> None:
    """Print the effective config of STAGE (defaults, then the file, then --set) as YAML."""
    try:
        sections = stage_dict(load_config(config, overrides or []), stage)
    except ConfigError as e:
        _fail(str(e))
    typer.echo(yaml.safe_dump(sections, sort_keys=False).rstrip())


@app.command()
def synth(config: Optional[str] = ConfigOpt, overrides: Optional[List[str]] = SetOpt) -> None:
    """Generate the mini-Wikipedia world (HotpotQA dump, questions, FEVER claims) on Ray."""
    _run_stage("synth", config, overrides)


@app.command()
def demo(config: Optional[str] = ConfigOpt, overrides: Optional[List[str]] = SetOpt) -> None:
    """Run the whole pipeline end to end on the embedded default (local Ray, SQLite MLflow, local files)."""
    _run_stage("demo", config, overrides)


wiki_app = typer.Typer(help="Wikipedia dumps -> docs / links / redirects / anchors / quarantine tables.", no_args_is_help=True)
app.add_typer(wiki_app, name="wiki")


@wiki_app.command("process")
def wiki_process(
    format: Optional[str] = typer.Option(None, "--format", "-f", help="hotpot, mediawiki or fever"),
    inputs: Optional[List[str]] = typer.Option(None, "--input", "-i", help="dump file or folder, local or s3:// (repeatable)"),
    output: Optional[str] = typer.Option(None, "--output", "-o", help="where the tables go (default <storage.root>/tables)"),
    config: Optional[str] = ConfigOpt,
    overrides: Optional[List[str]] = SetOpt,
) -> None:
    """Read a dump on Ray Data workers; print a JSON summary (records, docs, redirects, links, quarantined)."""
    flags = [f"wiki.format={format}"] if format else []
    flags += [f"wiki.inputs={json.dumps(list(inputs))}"] if inputs else []
    flags += [f"wiki.output={output}"] if output else []
    _run_stage("wiki", config, [*(overrides or []), *flags], module="process_wiki")


retrieve_app = typer.Typer(help="BM25 + entity linking + hyperlink expansion -> candidates.", no_args_is_help=True)
app.add_typer(retrieve_app, name="retrieve")
QuestionsOpt = typer.Option(None, "--questions", "-q", help="HotpotQA question file (JSON array), local or s3://")


def _retrieve_step(step: str, config: Optional[str], overrides: Optional[List[str]], questions: Optional[str]) -> None:
    from workflows import retrieve
    from workflows.common import USER_ERRORS

    flags = [*(overrides or []), *([f"retrieve.questions={questions}"] if questions else [])]
    try:
        cfg = load_config(config, flags)
        summary = {
            "index": lambda: retrieve.build_index(cfg),
            "run": lambda: {"questions": retrieve.write_questions(cfg), **retrieve.retrieve(cfg)},
            "eval": lambda: retrieve.evaluate(cfg),
            "all": lambda: retrieve.run(cfg),
        }[step]()
    except USER_ERRORS as e:
        _fail(str(e))
    typer.echo(json.dumps(summary, sort_keys=True))


@retrieve_app.command("index")
def retrieve_index(config: Optional[str] = ConfigOpt, overrides: Optional[List[str]] = SetOpt) -> None:
    """Build the sharded BM25 index of the docs table (corpus-wide statistics, exact rank-bm25 scores)."""
    _retrieve_step("index", config, overrides, None)


@retrieve_app.command("run")
def retrieve_run(questions: Optional[str] = QuestionsOpt, config: Optional[str] = ConfigOpt,
                 overrides: Optional[List[str]] = SetOpt) -> None:  # fmt: skip
    """Questions -> candidates: BM25 top 100, entity links, hyperlink expansion (needs the index)."""
    _retrieve_step("run", config, overrides, questions)


@retrieve_app.command("eval")
def retrieve_eval(config: Optional[str] = ConfigOpt, overrides: Optional[List[str]] = SetOpt) -> None:
    """Supp / Ans recall at 2, 5, 10, 100 and after expansion, overall and per question type."""
    _retrieve_step("eval", config, overrides, None)


@retrieve_app.command("all")
def retrieve_all(questions: Optional[str] = QuestionsOpt, config: Optional[str] = ConfigOpt,
                 overrides: Optional[List[str]] = SetOpt) -> None:  # fmt: skip
    """Index (if missing), candidates and evaluation in one go."""
    _retrieve_step("all", config, overrides, questions)


# Stages of later issues: listed so that `xh --help` shows the whole pipeline.
_NOT_BUILT = {
    "graphs": "Build evidence graphs for HotpotQA and FEVER",
    "train": "Train Transformer-XH on Ray Train with MLflow tracking",
    "eval": "Official HotpotQA / FEVER metrics",
    "promote": "Move the champion alias in the MLflow registry",
    "score": "Scheduled batch scoring of new questions",
}


def _not_built(name: str, summary: str) -> None:
    def command(args: Optional[List[str]] = typer.Argument(None)) -> None:
        typer.echo(f"error: stage '{name}' is not built yet", err=True)
        raise typer.Exit(2)

    app.command(name, help=f"{summary} (not built yet).", context_settings={"ignore_unknown_options": True})(command)


for _name, _summary in _NOT_BUILT.items():
    _not_built(_name, _summary)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(app())
