"""The `xh` command, the project's one front door: one sub-command per stage, each calling its driver.

    xh config show synth --set synth.num_docs=500
    xh config show --describe                       # every setting, its default and what it does
    xh synth --config configs/demo.yaml
    xh -v graphs build --setting distractor --questions hotpot_train_sample500.json
    xh demo

A stage has one name everywhere: the driver `workflows/<stage>.py`, the config section `<stage>`, the
sub-command `xh <stage>` and `infra/submit.sh <stage>` (`python -m workflows.cli <stage>` where no console
script is installed). Flags of a sub-command are shorthands for `--set <stage>.<key>=...`; every setting
is also reachable with `--set`. Each command reads its config first (`stage_config`: user errors, i.e. a
wrong path, an unknown key or a bad value, are one line on stderr and exit code 2, before Ray starts and
before the driver's imports, torch's seconds among them), then calls its driver's function (`report`:
the summary is one JSON line on stdout).
"""

import inspect
import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
from enum import Enum
from importlib.metadata import PackageNotFoundError, version
from typing import Annotated, get_args

import typer
import yaml
from typer.core import TyperGroup

import xh
from xh.config import (
    STAGES,
    ConfigError,
    GraphsConfig,
    Section,
    WikiConfig,
    XHConfig,
    describe,
    load_config,
    stage_dict,
    storage_uris,
)
from xh.storage.jsonfiles import InputFileError
from xh.storage.store import Store
from xh.storage.uris import StorageSettingsError
from xh.tracking import redact_tree

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
    # MLflow sets its loggers' level again when it is first imported (later, lazily), from this variable
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "INFO" if verbosity > 0 else "WARNING")


def check_before_ray(cfg: XHConfig, stage: str) -> None:
    """What a stage can refuse before any work (one line, exit 2): each s3:// location it reads without an
    S3 endpoint configured (the demo's: every section's). URI schemes and dates are checked when the config
    is read (`xh.config.load_config`); the tracking store, when a stage first opens it (`xh.tracking.configure`:
    a store or artifact location a Ray job would lose, a registry that does not exist)."""
    store = Store.from_config(cfg)
    for _, uri in storage_uris(cfg, None if stage == "demo" else STAGES.get(stage)):
        store.require_endpoint(uri)


# `xh --help` lists the stages in the order the pipeline runs them, then the tools.
ORDER = ("synth", "wiki", "retrieve", "rerank", "graphs", "train", "qtype", "promote", "score", "serve")
ORDER += ("demo", "eval", "config")


def _tidy_help(command) -> None:
    """In every sub-command's help: flags show no value type (`--help`, not `--help <bool>`), and a
    docstring's paragraphs flow (typer keeps the line breaks of all but the first)."""
    for param in [*command.params, command.get_help_option(typer.Context(command))]:
        if getattr(param, "is_flag", False) and param.metavar is None:
            param.metavar = ""
        if param is not None and param.param_type_name == "argument" and param.metavar:  # its name says it
            param.display_type_rich = lambda ctx: None
    if command.help:
        paragraphs = inspect.cleandoc(command.help).split("\n\n")
        command.help = "\n\n".join(" ".join(p.split()) for p in paragraphs)
    for sub in getattr(command, "commands", {}).values():
        _tidy_help(sub)


class PipelineOrder(TyperGroup):
    def list_commands(self, ctx: typer.Context) -> list[str]:
        return sorted(super().list_commands(ctx), key=lambda name: ORDER.index(name) if name in ORDER else len(ORDER))

    def main(self, *args, standalone_mode: bool = True, **kwargs):
        """A usage error (an unknown option, a value not among a flag's choices) is one line and exit code 2,
        as every other user error; the rest as click's standalone mode has it."""
        _tidy_help(self)
        if not standalone_mode:
            return super().main(*args, standalone_mode=False, **kwargs)
        try:
            code = super().main(*args, standalone_mode=False, **kwargs)
        except typer.exceptions.TyperException as e:  # click's usage errors
            message = e.format_message() if hasattr(e, "format_message") else str(e)
            if message:  # none after the help a group without its sub-command prints
                typer.echo(f"error: {message}", err=True)
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

# Metavars say what a value looks like; `sets(example)` gives each command a `--set` example of its own.
LOCATION = "PATH|s3://..."
MODEL_URI = "models:/NAME@ALIAS"
Config = Annotated[str | None, typer.Option("--config", "-c", metavar="PATH", help="YAML file of config sections")]


def sets(example: str):
    return Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            "-s",
            metavar="KEY=VALUE",
            help=f"any setting, e.g. --set {example} (repeatable; `xh config show --describe` lists them)",
        ),
    ]


def _version(shown: bool) -> None:
    if shown:
        try:
            number = version("transformer-xh-ray")
        except PackageNotFoundError:  # run from a checkout that is not installed
            number = xh.__version__
        typer.echo(f"xh {number}")
        raise typer.Exit()


@app.callback()
def main(
    verbose: Annotated[
        int,
        typer.Option("--verbose", "-v", count=True, metavar="", show_default=False, help="debug lines, Ray's own logs"),
    ] = 0,
    quiet: Annotated[
        int, typer.Option("--quiet", "-q", count=True, metavar="", show_default=False, help="warnings and errors only")
    ] = 0,
    show_version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="print the version and exit")
    ] = False,
) -> None:
    configure_logging(verbose - quiet)


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


def stage_config(stage: str, config: str | None, overrides: list[str] | None, extra: Sequence[str] = ()) -> XHConfig:
    """Defaults, the file, `--set`, then the flags; checked before Ray (`check_before_ray`). A user error
    exits 2 in one line."""
    try:
        cfg = load_config(config, [*(overrides or []), *extra])
        check_before_ray(cfg, stage)
    except USER_ERRORS as e:
        fail(str(e))
    return cfg


def report(run: Callable[[XHConfig], dict], cfg: XHConfig) -> dict:
    """Run a driver's function and print its summary as one JSON line; a user error exits 2 in one line."""
    try:
        summary = run(cfg)
    except USER_ERRORS as e:
        fail(str(e))
    typer.echo(json.dumps(summary, sort_keys=True, default=str))
    return summary


config_app = typer.Typer(help="Inspect configuration.", no_args_is_help=True)
app.add_typer(config_app, name="config")


@config_app.command("show")
def config_show(
    stage: Annotated[
        str | None, typer.Argument(metavar="STAGE", help="a stage's sections (synth, train, score, ...); default all")
    ] = None,
    describe_: Annotated[
        bool, typer.Option("--describe", help="each setting with its description, as YAML comments")
    ] = False,
    markdown: Annotated[
        bool, typer.Option("--markdown", help="with --describe: the Markdown reference (docs/configuration.md)")
    ] = False,
    config: Config = None,
    overrides: sets("train.epochs=2") = None,
) -> None:
    """Print the effective config (defaults, then the file, then --set) as YAML; credentials in a value
    (a tracking URI's password, a token in a query) are shown as ***."""
    try:
        cfg = load_config(config, overrides or [])
        sections = stage_dict(cfg, stage) if stage else cfg.model_dump(mode="json")
    except ConfigError as e:
        fail(str(e))
    sections = redact_tree(sections)
    if describe_ or markdown:
        typer.echo(describe(sections, markdown=markdown).rstrip())
    else:
        typer.echo(yaml.safe_dump(sections, sort_keys=False).rstrip())


@app.command()
def synth(config: Config = None, overrides: sets("synth.num_docs=500") = None) -> None:
    """Generate the mini-Wikipedia world (HotpotQA dump, questions, FEVER claims) on Ray."""
    cfg = stage_config("synth", config, overrides)
    from workflows import synth as driver

    report(driver.run, cfg)


TrainFirst = Annotated[bool | None, typer.Option(show_default=False)]


@app.command()
def demo(
    train_reranker: TrainFirst = None,
    train_path_scorer: TrainFirst = None,
    train_sentence_reranker: TrainFirst = None,
    config: Config = None,
    overrides: sets("synth.num_docs=1000") = None,
) -> None:
    """Run the whole pipeline end to end on the embedded default (local Ray, SQLite MLflow, local files).

    --train-*: train that model first and use it (demo.train_*); the summary table comes last, on stderr."""
    given = {"train_reranker": train_reranker, "train_path_scorer": train_path_scorer}
    given["train_sentence_reranker"] = train_sentence_reranker
    cfg = stage_config("demo", config, overrides, [f"demo.{k}={v}" for k, v in given.items() if v is not None])
    from workflows import demo as driver
    from xh.stages.demo import summary_table

    summary = report(driver.run, cfg)
    typer.echo("\n" + summary_table(summary), err=True)


wiki_app = typer.Typer(
    help="Wikipedia dumps -> docs / links / redirects / anchors / quarantine tables.", no_args_is_help=True
)
app.add_typer(wiki_app, name="wiki")


@wiki_app.command("process")
def wiki_process(
    format: Annotated[Format | None, typer.Option("--format", "-f", help="the dump's format")] = None,
    inputs: Annotated[
        list[str] | None,
        typer.Option("--input", "-i", metavar=LOCATION, help="dump file or folder (repeatable)"),
    ] = None,
    output: Annotated[
        str | None, typer.Option("--output", "-o", metavar=LOCATION, help="default <storage.root>/tables")
    ] = None,
    config: Config = None,
    overrides: sets("wiki.workers=4") = None,
) -> None:
    """Read a dump on Ray Data workers; print a JSON summary (records, docs, redirects, links, quarantined)."""
    cfg = stage_config("wiki", config, overrides, flags("wiki", format=format, inputs=inputs, output=output))
    from workflows import wiki as driver

    report(driver.run, cfg)


retrieve_app = typer.Typer(help="BM25 + entity linking + hyperlink expansion -> candidates.", no_args_is_help=True)
app.add_typer(retrieve_app, name="retrieve")
Questions = Annotated[
    str | None, typer.Option("--questions", metavar=LOCATION, help="HotpotQA question file (JSON array)")
]


@retrieve_app.command("index")
def retrieve_index(config: Config = None, overrides: sets("retrieve.shards=8") = None) -> None:
    """Build the sharded BM25 index of the docs table (corpus-wide statistics, exact rank-bm25 scores)."""
    cfg = stage_config("retrieve", config, overrides)
    from workflows import retrieve as driver

    report(driver.index, cfg)


@retrieve_app.command("run")
def retrieve_run(
    questions: Questions = None, config: Config = None, overrides: sets("retrieve.ir_candidates=100") = None
) -> None:
    """Questions -> candidates: BM25 top 100, entity links, hyperlink expansion (needs the index)."""
    cfg = stage_config("retrieve", config, overrides, flags("retrieve", questions=questions))
    from workflows import retrieve as driver

    report(driver.run, cfg)


@retrieve_app.command("eval")
def retrieve_eval(config: Config = None, overrides: sets("retrieve.output=runs/demo/retrieval") = None) -> None:
    """Supp / Ans recall at 2, 5, 10, 100 and after expansion, overall and per question type."""
    cfg = stage_config("retrieve", config, overrides)
    from workflows import retrieve as driver

    report(driver.evaluate, cfg)


@retrieve_app.command("all")
def retrieve_all(
    questions: Questions = None, config: Config = None, overrides: sets("retrieve.shards=8") = None
) -> None:
    """Index (if missing), candidates and evaluation in one go."""
    cfg = stage_config("retrieve", config, overrides, flags("retrieve", questions=questions))
    from workflows import retrieve as driver

    report(driver.all_steps, cfg)


@retrieve_app.command("paths")
def retrieve_paths(
    questions: Questions = None, config: Config = None, overrides: sets("retrieve.path_seed=7") = None
) -> None:
    """Train the path scorer on the questions' supporting facts (needs the index); use it with
    --set retrieve.path_scorer=PATH."""
    cfg = stage_config("retrieve", config, overrides, flags("retrieve", questions=questions))
    from workflows import retrieve as driver

    report(driver.paths, cfg)


@app.command()
def rerank(
    questions: Annotated[
        str | None, typer.Option("--questions", metavar=LOCATION, help="HotpotQA file, distractor format")
    ] = None,
    output: Annotated[
        str | None, typer.Option("--output", "-o", metavar=LOCATION, help="default <storage.root>/models/reranker")
    ] = None,
    config: Config = None,
    overrides: sets("rerank.max_steps=200") = None,
) -> None:
    """Train the cross-encoder re-ranker on Ray Train; retrieval uses it with --set retrieve.reranker=PATH."""
    cfg = stage_config("rerank", config, overrides, flags("rerank", questions=questions, output=output))
    from workflows import rerank as driver

    report(driver.run, cfg)


graphs_app = typer.Typer(help="Evidence graphs (HotpotQA, FEVER) -> the sharded graphs table.", no_args_is_help=True)
app.add_typer(graphs_app, name="graphs")


@graphs_app.command("build")
def graphs_build(
    task: Annotated[Task | None, typer.Option("--task", "-t", help="the task's graphs")] = None,
    setting: Annotated[Setting | None, typer.Option("--setting", help="nodes from retrieval or the contexts")] = None,
    questions: Annotated[
        str | None, typer.Option("--questions", metavar=LOCATION, help="distractor setting: file with contexts")
    ] = None,
    config: Config = None,
    overrides: sets("graphs.edge_mode=bidirectional") = None,
) -> None:
    """Build one graph per question on Ray Data; print a JSON summary (graphs, quarantined, answer recall, sizes)."""
    cfg = stage_config("graphs", config, overrides, flags("graphs", task=task, setting=setting, questions=questions))
    from workflows import graphs as driver

    report(driver.run, cfg)


@app.command()
def train(config: Config = None, overrides: sets("train.epochs=2") = None) -> None:
    """Train Transformer-XH on Ray Train (DDP), track it in MLflow, register it as @challenger."""
    cfg = stage_config("train", config, overrides)
    from workflows import train as driver

    report(driver.run, cfg)


@app.command()
def qtype(
    questions: Annotated[
        str | None, typer.Option("--questions", metavar=LOCATION, help="HotpotQA file with types; default the world's")
    ] = None,
    output: Annotated[
        str | None,
        typer.Option("--output", "-o", metavar=LOCATION, help="default <storage.root>/models/question_type"),
    ] = None,
    config: Config = None,
    overrides: sets("qtype.dev_fraction=0.1") = None,
) -> None:
    """Train the question-type classifier (bridge or comparison) for questions without a type.

    Scoring and serving use it with --set score.question_classifier=PATH; it is measured on the questions
    it holds out."""
    cfg = stage_config("qtype", config, overrides, flags("qtype", questions=questions, output=output))
    from workflows import qtype as driver

    report(driver.run, cfg)


promote_app = typer.Typer(help="Move the champion alias in the MLflow registry.", invoke_without_command=True)
app.add_typer(promote_app, name="promote")
Model = Annotated[str | None, typer.Option("--model", metavar="NAME", help="registered model name (promote.model)")]


@promote_app.callback()
def promote(
    ctx: typer.Context,
    model: Model = None,
    eval_set: Annotated[
        str | None, typer.Option("--eval-set", metavar=LOCATION, help="graphs folder with gold labels")
    ] = None,
    metric: Annotated[
        str | None, typer.Option("--metric", metavar="NAME", help="f1, em, joint_f1, label_accuracy, ...")
    ] = None,
    min_delta: Annotated[
        float | None, typer.Option("--min-delta", metavar="POINTS", help="points the challenger must win by")
    ] = None,
    floor: Annotated[
        float | None, typer.Option("--floor", metavar="SCORE", help="score (x100) the first model must reach")
    ] = None,
    challenger: Annotated[
        str | None, typer.Option("--challenger", metavar="VERSION", help="version to judge (default @challenger)")
    ] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="evaluate and report; move nothing")] = False,
    config: Config = None,
    overrides: sets("promote.min_delta=1.0") = None,
) -> None:
    """Evaluate @challenger and @champion on the challenger's gate set (or --eval-set); move @champion only if
    the challenger wins. Exit 0: promoted; 3: champion kept; 2: refused (a dry run exits as it would decide)."""
    if ctx.invoked_subcommand is not None:
        return
    given = flags("promote", model=model, eval_set=eval_set, metric=metric, min_delta=min_delta, floor=floor)
    given += flags("promote", challenger=challenger, dry_run=dry_run)
    cfg = stage_config("promote", config, overrides, given)
    from workflows import promote as driver
    from xh.stages.promote import exit_code  # after the run: a refusal comes before any import of MLflow

    code = exit_code(report(driver.run, cfg))
    if code:
        raise typer.Exit(code)


@promote_app.command("rollback")
def promote_rollback(
    model: Model = None, config: Config = None, overrides: sets("promote.model=xh-fever") = None
) -> None:
    """Give @champion back to the version the last promotion replaced."""
    cfg = stage_config("promote", config, overrides, flags("promote", model=model))
    from workflows import promote as driver

    report(driver.rollback, cfg)


@app.command()
def score(
    input: Annotated[
        str | None,
        typer.Option("--input", metavar=LOCATION, help="question files or folder (JSON lines / Parquet); score.input"),
    ] = None,
    model: Annotated[
        str | None, typer.Option("--model", metavar=MODEL_URI, help="or models:/NAME/VERSION; score.model")
    ] = None,
    config: Config = None,
    overrides: sets("score.run_date=2026-11-22") = None,
) -> None:
    """Batch-score new questions with one registered model version: retrieval, graphs, inference.

    `{run_date}` in the input becomes the run date (score.run_date, default today, UTC), e.g.
    --input 's3://bucket/incoming/{run_date}/'.

    Output: the predictions land in <score.output>/run_date=DATE/model=NAME/version=V/ (score.output
    defaults to <storage.root>/predictions); a re-run of a date adds its rows, a re-scored question's row
    replaced (--set score.replace=true replaces the partition). The summary is one JSON line.

    --set score.incremental=true scores only the input files this version has not scored yet (same URI
    and content, in any run_date partition): a nightly job over a whole incoming/ folder."""
    cfg = stage_config("score", config, overrides, flags("score", input=input, model=model))
    from workflows import score as driver

    report(driver.run, cfg)


serve_app = typer.Typer(
    help="The champion as a Ray Serve application (POST /answer), following its alias.", invoke_without_command=True
)
app.add_typer(serve_app, name="serve")


@serve_app.callback()
def serve(
    ctx: typer.Context,
    model: Annotated[
        str | None, typer.Option("--model", metavar=MODEL_URI, help="followed as the alias moves; serve.model")
    ] = None,
    host: Annotated[str | None, typer.Option("--host", metavar="ADDRESS", help="HTTP address (serve.host)")] = None,
    port: Annotated[int | None, typer.Option("--port", metavar="PORT", help="HTTP port (serve.port)")] = None,
    config: Config = None,
    overrides: sets("serve.model_replicas=2") = None,
) -> None:
    """Serve the model version the alias names until interrupted: retrieval + graphs, then the model, batched."""
    if ctx.invoked_subcommand is not None:
        return
    cfg = stage_config("serve", config, overrides, flags("serve", model=model, host=host, port=port))
    from workflows import serve as driver

    report(driver.run, cfg)


@serve_app.command("reload")
def serve_reload(
    url: Annotated[
        str | None, typer.Option("--url", metavar="http://HOST:PORT", help="the app's address; default serve.host/port")
    ] = None,
    config: Config = None,
    overrides: sets("serve.port=8001") = None,
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
Gold = Annotated[str, typer.Option("--gold", "-g", metavar=LOCATION, help="the gold file")]
Pred = Annotated[str, typer.Option("--pred", "-p", metavar=LOCATION, help="the prediction file")]
Slices = Annotated[bool, typer.Option("--slices", help="also the metrics per slice (question type / evidence count)")]


@eval_app.command("hotpot")
def eval_hotpot(gold: Gold, pred: Pred, slices: Slices = False) -> None:
    """hotpot_evaluate_v1.py's metrics: answer, supporting-fact and joint EM / F1 / precision / recall."""
    from xh.eval.hotpot import evaluate_hotpot_files
    from xh.storage.jsonfiles import InputFileError as EvalInputError

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
    from xh.eval.fever import evaluate_fever_files
    from xh.storage.jsonfiles import InputFileError as EvalInputError

    try:
        result = evaluate_fever_files(gold, pred, slices=slices)
    except EvalInputError as e:
        fail(str(e))
    typer.echo(json.dumps(result, sort_keys=True))


if __name__ == "__main__":  # `python -m workflows.cli`, where the `xh` script is not installed
    app(prog_name="xh")
