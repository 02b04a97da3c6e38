"""The `xh` command: one sub-command per stage, each the same driver `python -m workflows.<stage>` runs.

    xh config show synth --set synth.num_docs=500
    xh synth --config configs/demo.yaml
    xh -v graphs build --setting distractor --questions hotpot_train_sample500.json
    xh demo

A stage has one name everywhere: the module `workflows/<stage>.py`, the config section `<stage>`, the
sub-command `xh <stage>` and `infra/submit.sh <stage>`; `python -m workflows.<stage> ARGS` is this app's
`xh <stage> ARGS` (`invoke`). Flags of a sub-command are shorthands for `--set <stage>.<key>=...`; every
setting is also reachable with `--set`. User errors (a wrong path, an unknown key, a bad value) are one
line on stderr and exit code 2, before Ray starts (`run_stage`); the summary is one JSON line on stdout.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from enum import Enum
from importlib import import_module
from typing import Annotated, get_args

import typer
import yaml
from typer.core import TyperGroup

from xh.config import (
    STAGES,
    ConfigError,
    GraphsConfig,
    Section,
    WikiConfig,
    XHConfig,
    load_config,
    stage_dict,
    storage_uris,
)
from xh.jsonfiles import InputFileError
from xh.storage import StorageSettingsError
from xh.store import Store

# Errors a user can fix by changing a flag, a path or an input file: one line, exit code 2, no traceback.
USER_ERRORS = (ConfigError, FileNotFoundError, InputFileError, StorageSettingsError)


def configure_logging(verbosity: int = 0) -> None:
    """-q: warnings only; default: one line per stage step; -v: debug, and Ray's own logs on the console.

    Ray's INFO chatter (and the workers' output) goes to its session log files unless -v: a user reads
    the stage lines, Ray Data's progress bars and the summary.
    """
    level = logging.WARNING if verbosity < 0 else logging.DEBUG if verbosity > 0 else logging.INFO
    logging.basicConfig(format="%(asctime)s [%(name)s] %(message)s", datefmt="%H:%M:%S", stream=sys.stderr, force=True)
    logging.getLogger("xh").setLevel(level)
    # Ray's warnings repeat by the hundred on a small machine (Train's controller polling): errors only.
    logging.getLogger("ray").setLevel(logging.INFO if verbosity > 0 else logging.ERROR)
    for library in ("mlflow", "alembic"):
        logging.getLogger(library).setLevel(logging.INFO if verbosity > 0 else logging.WARNING)


def check_before_ray(cfg: XHConfig, stage: str) -> None:
    """What a stage can refuse before any work (one line, exit 2): each s3:// location it reads without an
    S3 endpoint configured (the demo's: every section's). URI schemes and dates are checked when the config
    is read (`xh.config.load_config`)."""
    store = Store.from_config(cfg)
    for _, uri in storage_uris(cfg, None if stage == "demo" else STAGES.get(stage)):
        store.require_endpoint(uri)


# `xh --help` lists the stages in the order the pipeline runs them, then the tools.
ORDER = ("synth", "wiki", "retrieve", "rerank", "graphs", "train", "qtype", "promote", "score", "serve")
ORDER += ("demo", "eval", "config")
# What `python -m workflows.<stage>` runs when its arguments name no sub-command of a stage that has several.
DEFAULT_COMMAND = {"wiki": "process", "retrieve": "all", "graphs": "build"}


class PipelineOrder(TyperGroup):
    def list_commands(self, ctx: typer.Context) -> list[str]:
        return sorted(super().list_commands(ctx), key=lambda name: ORDER.index(name) if name in ORDER else len(ORDER))

    def main(self, *args, standalone_mode: bool = True, **kwargs):
        """A usage error (an unknown option, a value not among a flag's choices) is one line and exit code 2,
        as every other user error; the rest as click's standalone mode has it."""
        if not standalone_mode:
            return super().main(*args, standalone_mode=False, **kwargs)
        try:
            code = super().main(*args, standalone_mode=False, **kwargs)
        except typer.exceptions.TyperException as e:  # click's usage errors
            typer.echo(f"error: {e.format_message() if hasattr(e, 'format_message') else e}", err=True)
            sys.exit(getattr(e, "exit_code", 2))
        except typer.Abort:
            typer.echo("Aborted!", err=True)
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)


app = typer.Typer(
    cls=PipelineOrder,
    help="Transformer-XH on Ray: multi-hop QA and fact verification over Wikipedia.",
    no_args_is_help=True,
)


def choices(section: type[Section], key: str) -> type[Enum]:
    """A `Literal` setting's values as the enum of its flag: `--task hotpot|fever`, named once, in the config."""
    values = get_args(section.model_fields[key].annotation)
    return Enum(key.title().replace("_", ""), {v: v for v in values}, type=str)


Task, Setting, Format = choices(GraphsConfig, "task"), choices(GraphsConfig, "setting"), choices(WikiConfig, "format")

Config = Annotated[str | None, typer.Option("--config", "-c", help="YAML file of config sections")]
Sets = Annotated[
    list[str] | None, typer.Option("--set", "-s", help="override, e.g. --set synth.num_docs=500 (repeatable)")
]


@app.callback()
def main(
    verbose: Annotated[
        int,
        typer.Option("--verbose", "-v", count=True, metavar="", show_default=False, help="debug lines, Ray's own logs"),
    ] = 0,
    quiet: Annotated[
        int, typer.Option("--quiet", "-q", count=True, metavar="", show_default=False, help="warnings and errors only")
    ] = 0,
) -> None:
    configure_logging(verbose - quiet)


# The runner `invoke` was given, by stage: what `run_stage` calls for that stage instead of the driver's verb.
_given: ContextVar[dict[str, Callable[[XHConfig], dict]] | None] = ContextVar("given", default=None)


def invoke(stage: str, args: Sequence[str], run: Callable[[XHConfig], dict] | None = None) -> None:
    """`xh <stage> ARGS` for `python -m workflows.<stage> ARGS`: leading `-v`/`-q` go to `xh`; a stage with
    sub-commands runs its default one when ARGS name none, with `run` (the driver's) as the runner."""
    args = list(args)
    verbosity = []
    while args and re.fullmatch(r"-(v+|q+)|--verbose|--quiet", args[0]):
        verbosity.append(args.pop(0))
    command = typer.main.get_command(app).commands[stage]
    named = bool(args) and args[0] in getattr(command, "commands", {})
    if not named and stage in DEFAULT_COMMAND:
        args.insert(0, DEFAULT_COMMAND[stage])
    token = _given.set({stage: run} if run and not named else {})
    try:
        app(args=[*verbosity, stage, *args], prog_name="xh")
    except SystemExit as e:
        if e.code:  # success returns, as a function does
            raise
    finally:
        _given.reset(token)


def fail(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


def flags(section: str, **values) -> list[str]:
    """`--set` overrides for the flags that were given (lists as JSON)."""
    return [
        f"{section}.{key}={json.dumps(value) if isinstance(value, list) else _flag_value(value)}"
        for key, value in values.items()
        if value is not None and value is not False and value != []
    ]


def _flag_value(value) -> str:
    return value.value if isinstance(value, Enum) else str(value)


def run_stage(
    stage: str, config: str | None, overrides: list[str] | None, extra: Sequence[str] = (), verb: str = "run"
) -> dict:
    """Load the config, run `workflows.<stage>.<verb>(cfg)`, print its summary as one JSON line; user errors
    exit 2 in one line. The one error wrapper of `xh` and `python -m workflows.<stage>` alike."""
    try:
        cfg = load_config(config, [*(overrides or []), *extra])  # a config error before the stage's imports (torch)
        check_before_ray(cfg, stage)
        run = (_given.get() or {}).get(stage) or getattr(import_module(f"workflows.{stage}"), verb)
        summary = run(cfg)
    except USER_ERRORS as e:
        fail(str(e))
    typer.echo(json.dumps(summary, sort_keys=True, default=str))
    return summary


config_app = typer.Typer(help="Inspect configuration.", no_args_is_help=True)
app.add_typer(config_app, name="config")


@config_app.command("show")
def config_show(stage: str, config: Config = None, overrides: Sets = None) -> None:
    """Print the effective config of STAGE (defaults, then the file, then --set) as YAML."""
    try:
        sections = stage_dict(load_config(config, overrides or []), stage)
    except ConfigError as e:
        fail(str(e))
    typer.echo(yaml.safe_dump(sections, sort_keys=False).rstrip())


@app.command()
def synth(config: Config = None, overrides: Sets = None) -> None:
    """Generate the mini-Wikipedia world (HotpotQA dump, questions, FEVER claims) on Ray."""
    run_stage("synth", config, overrides)


TrainFirst = Annotated[bool | None, typer.Option(show_default=False)]


@app.command()
def demo(
    train_reranker: TrainFirst = None,
    train_path_scorer: TrainFirst = None,
    train_sentence_reranker: TrainFirst = None,
    config: Config = None,
    overrides: Sets = None,
) -> None:
    """Run the whole pipeline end to end on the embedded default (local Ray, SQLite MLflow, local files).

    --train-*: train that model first and use it (demo.train_*); the summary table comes last, on stderr."""
    from xh.stages.demo import summary_table

    given = {"train_reranker": train_reranker, "train_path_scorer": train_path_scorer}
    given["train_sentence_reranker"] = train_sentence_reranker
    summary = run_stage("demo", config, overrides, [f"demo.{k}={v}" for k, v in given.items() if v is not None])
    typer.echo("\n" + summary_table(summary), err=True)


wiki_app = typer.Typer(
    help="Wikipedia dumps -> docs / links / redirects / anchors / quarantine tables.", no_args_is_help=True
)
app.add_typer(wiki_app, name="wiki")


@wiki_app.command("process")
def wiki_process(
    format: Annotated[Format | None, typer.Option("--format", "-f", help="the dump's format")] = None,
    inputs: Annotated[
        list[str] | None, typer.Option("--input", "-i", help="dump file or folder, local or s3:// (repeatable)")
    ] = None,
    output: Annotated[str | None, typer.Option("--output", "-o", help="default <storage.root>/tables")] = None,
    config: Config = None,
    overrides: Sets = None,
) -> None:
    """Read a dump on Ray Data workers; print a JSON summary (records, docs, redirects, links, quarantined)."""
    run_stage("wiki", config, overrides, flags("wiki", format=format, inputs=inputs, output=output))


retrieve_app = typer.Typer(help="BM25 + entity linking + hyperlink expansion -> candidates.", no_args_is_help=True)
app.add_typer(retrieve_app, name="retrieve")
Questions = Annotated[
    str | None, typer.Option("--questions", help="HotpotQA question file (JSON array), local or s3://")
]


@retrieve_app.command("index")
def retrieve_index(config: Config = None, overrides: Sets = None) -> None:
    """Build the sharded BM25 index of the docs table (corpus-wide statistics, exact rank-bm25 scores)."""
    run_stage("retrieve", config, overrides, verb="index")


@retrieve_app.command("run")
def retrieve_run(questions: Questions = None, config: Config = None, overrides: Sets = None) -> None:
    """Questions -> candidates: BM25 top 100, entity links, hyperlink expansion (needs the index)."""
    run_stage("retrieve", config, overrides, flags("retrieve", questions=questions), verb="run")


@retrieve_app.command("eval")
def retrieve_eval(config: Config = None, overrides: Sets = None) -> None:
    """Supp / Ans recall at 2, 5, 10, 100 and after expansion, overall and per question type."""
    run_stage("retrieve", config, overrides, verb="evaluate")


@retrieve_app.command("all")
def retrieve_all(questions: Questions = None, config: Config = None, overrides: Sets = None) -> None:
    """Index (if missing), candidates and evaluation in one go."""
    run_stage("retrieve", config, overrides, flags("retrieve", questions=questions), verb="all_steps")


@retrieve_app.command("paths")
def retrieve_paths(questions: Questions = None, config: Config = None, overrides: Sets = None) -> None:
    """Train the path scorer on the questions' supporting facts (needs the index); use it with
    --set retrieve.path_scorer=PATH."""
    run_stage("retrieve", config, overrides, flags("retrieve", questions=questions), verb="paths")


@app.command()
def rerank(
    questions: Annotated[str | None, typer.Option("--questions", help="HotpotQA file, distractor format")] = None,
    output: Annotated[str | None, typer.Option("--output", "-o", help="default <storage.root>/models/reranker")] = None,
    config: Config = None,
    overrides: Sets = None,
) -> None:
    """Train the cross-encoder re-ranker on Ray Train; retrieval uses it with --set retrieve.reranker=PATH."""
    run_stage("rerank", config, overrides, flags("rerank", questions=questions, output=output))


graphs_app = typer.Typer(help="Evidence graphs (HotpotQA, FEVER) -> the sharded graphs table.", no_args_is_help=True)
app.add_typer(graphs_app, name="graphs")


@graphs_app.command("build")
def graphs_build(
    task: Annotated[Task | None, typer.Option("--task", "-t", help="the task's graphs")] = None,
    setting: Annotated[Setting | None, typer.Option("--setting", help="nodes from retrieval or the contexts")] = None,
    questions: Annotated[str | None, typer.Option("--questions", help="distractor setting: file with contexts")] = None,
    config: Config = None,
    overrides: Sets = None,
) -> None:
    """Build one graph per question on Ray Data; print a JSON summary (graphs, quarantined, answer recall, sizes)."""
    run_stage("graphs", config, overrides, flags("graphs", task=task, setting=setting, questions=questions))


@app.command()
def train(config: Config = None, overrides: Sets = None) -> None:
    """Train Transformer-XH on Ray Train (DDP), track it in MLflow, register it as @challenger."""
    run_stage("train", config, overrides)


@app.command()
def qtype(
    questions: Annotated[
        str | None, typer.Option("--questions", help="HotpotQA file with types; default the world's")
    ] = None,
    output: Annotated[
        str | None, typer.Option("--output", "-o", help="default <storage.root>/models/question_type")
    ] = None,
    config: Config = None,
    overrides: Sets = None,
) -> None:
    """Train the question-type classifier (bridge or comparison) for questions without a type.

    Scoring and serving use it with --set score.question_classifier=PATH; it is measured on the questions
    it holds out."""
    run_stage("qtype", config, overrides, flags("qtype", questions=questions, output=output))


promote_app = typer.Typer(help="Move the champion alias in the MLflow registry.", invoke_without_command=True)
app.add_typer(promote_app, name="promote")
Model = Annotated[str | None, typer.Option("--model", help="registered model name (promote.model)")]


@promote_app.callback()
def promote(
    ctx: typer.Context,
    model: Model = None,
    eval_set: Annotated[str | None, typer.Option("--eval-set", help="graphs folder with gold labels")] = None,
    metric: Annotated[str | None, typer.Option("--metric", help="f1, em, joint_f1, label_accuracy, ...")] = None,
    min_delta: Annotated[float | None, typer.Option("--min-delta", help="points the challenger must win by")] = None,
    floor: Annotated[float | None, typer.Option("--floor", help="score (x100) the first model must reach")] = None,
    challenger: Annotated[
        str | None, typer.Option("--challenger", help="version to judge (default @challenger)")
    ] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="evaluate and report; move nothing")] = False,
    config: Config = None,
    overrides: Sets = None,
) -> None:
    """Evaluate @challenger and @champion on the challenger's gate set (or --eval-set); move @champion only if
    the challenger wins. Exit 0: promoted; 3: champion kept; 2: refused (a dry run exits as it would decide)."""
    if ctx.invoked_subcommand is not None:
        return
    given = flags("promote", model=model, eval_set=eval_set, metric=metric, min_delta=min_delta, floor=floor)
    given += flags("promote", challenger=challenger, dry_run=dry_run)
    decision = run_stage("promote", config, overrides, given)
    from xh.stages.promote import exit_code  # after the run: a refusal comes before any import of MLflow

    code = exit_code(decision)
    if code:
        raise typer.Exit(code)


@promote_app.command("rollback")
def promote_rollback(model: Model = None, config: Config = None, overrides: Sets = None) -> None:
    """Give @champion back to the version the last promotion replaced."""
    run_stage("promote", config, overrides, flags("promote", model=model), verb="rollback")


@app.command()
def score(
    input: Annotated[
        str | None, typer.Option("--input", help="question files or folder (JSON lines / Parquet)")
    ] = None,
    model: Annotated[str | None, typer.Option("--model", help="e.g. models:/xh-hotpot@champion")] = None,
    config: Config = None,
    overrides: Sets = None,
) -> None:
    """Batch-score new questions with one registered model version: retrieval, graphs, inference."""
    run_stage("score", config, overrides, flags("score", input=input, model=model))


serve_app = typer.Typer(
    help="The champion as a Ray Serve application (POST /answer), following its alias.", invoke_without_command=True
)
app.add_typer(serve_app, name="serve")


@serve_app.callback()
def serve(
    ctx: typer.Context,
    model: Annotated[str | None, typer.Option("--model", help="e.g. models:/xh-hotpot@champion")] = None,
    host: Annotated[str | None, typer.Option("--host", help="HTTP address (serve.host)")] = None,
    port: Annotated[int | None, typer.Option("--port", help="HTTP port (serve.port)")] = None,
    config: Config = None,
    overrides: Sets = None,
) -> None:
    """Serve the model version the alias names until interrupted: retrieval + graphs, then the model, batched."""
    if ctx.invoked_subcommand is not None:
        return
    run_stage("serve", config, overrides, flags("serve", model=model, host=host, port=port))


@serve_app.command("reload")
def serve_reload(
    url: Annotated[str | None, typer.Option("--url", help="the app's base URL; default from serve.host/port")] = None,
    config: Config = None,
    overrides: Sets = None,
) -> None:
    """Make a running app look its alias up now and serve the version it names (POST /-/reload)."""
    from xh.serve import base_url, call

    try:
        target = url or base_url(load_config(config, overrides or []))
        status, body = call(f"{target.rstrip('/')}/-/reload", {})  # a POST
    except ConfigError as e:
        fail(str(e))
    if status != 200:
        fail(f"reload at {target} failed ({status}): {body.get('reload_error') or body.get('error')}")
    typer.echo(json.dumps(body, sort_keys=True))


eval_app = typer.Typer(help="Official HotpotQA / FEVER metrics of a prediction file.", no_args_is_help=True)
app.add_typer(eval_app, name="eval")
Gold = Annotated[str, typer.Option("--gold", "-g", help="gold file, local or s3://")]
Pred = Annotated[str, typer.Option("--pred", "-p", help="prediction file, local or s3://")]
Slices = Annotated[bool, typer.Option("--slices", help="also the metrics per slice (question type / evidence count)")]


@eval_app.command("hotpot")
def eval_hotpot(gold: Gold, pred: Pred, slices: Slices = False) -> None:
    """hotpot_evaluate_v1.py's metrics: answer, supporting-fact and joint EM / F1 / precision / recall."""
    from xh.eval import EvalInputError
    from xh.eval.hotpot import evaluate_hotpot_files

    try:
        result = evaluate_hotpot_files(gold, pred, slices=True)  # the slices count the missing predictions
    except EvalInputError as e:
        fail(str(e))
    per_type = result.pop("slices") if not slices else result["slices"]
    missing_answer = sum(s["missing_answer"] for s in per_type.values())
    missing_sp = sum(s["missing_sp"] for s in per_type.values())
    if missing_answer or missing_sp:  # the official script reports them too; they score 0
        typer.echo(
            f"warning: {missing_answer} questions have no predicted answer and {missing_sp} no "
            "predicted supporting facts; they score 0",
            err=True,
        )
    typer.echo(json.dumps(result, sort_keys=True))


@eval_app.command("fever")
def eval_fever(gold: Gold, pred: Pred, slices: Slices = False) -> None:
    """The FEVER scorer's metrics (at most 5 evidence): FEVER score, label accuracy, evidence P / R / F1."""
    from xh.eval import EvalInputError
    from xh.eval.fever import evaluate_fever_files

    try:
        result = evaluate_fever_files(gold, pred, slices=slices)
    except EvalInputError as e:
        fail(str(e))
    typer.echo(json.dumps(result, sort_keys=True))


if __name__ == "__main__":  # pragma: no cover
    app(prog_name="xh")
