"""The `xh` command: one sub-command per stage, each the same driver `python -m workflows.<stage>` runs.

    xh config show synth --set synth.num_docs=500
    xh synth --config configs/demo.yaml
    xh -v graphs build --setting distractor --questions hotpot_train_sample500.json
    xh demo

A stage has one name everywhere: the module `workflows/<stage>.py`, the config section `<stage>`, the
sub-command `xh <stage>` and `infra/submit.sh <stage>`. Flags of a sub-command are shorthands for
`--set <stage>.<key>=...`; every setting is also reachable with `--set`. User errors (a wrong path, an
unknown key, a bad value) are one line on stderr and exit code 2; the summary is one JSON line on stdout.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from importlib import import_module
from typing import Annotated

import typer
import yaml

from workflows.common import USER_ERRORS, check_before_ray, configure_logging
from xh.config import ConfigError, XHConfig, load_config, stage_dict

app = typer.Typer(
    help="Transformer-XH on Ray: multi-hop QA and fact verification over Wikipedia.", no_args_is_help=True
)

Config = Annotated[str | None, typer.Option("--config", "-c", help="YAML file of config sections")]
Sets = Annotated[
    list[str] | None, typer.Option("--set", "-s", help="override, e.g. --set synth.num_docs=500 (repeatable)")
]


@app.callback()
def main(
    verbose: Annotated[int, typer.Option("--verbose", "-v", count=True, help="debug lines and Ray's own logs")] = 0,
    quiet: Annotated[int, typer.Option("--quiet", "-q", count=True, help="warnings and errors only")] = 0,
) -> None:
    configure_logging(verbose - quiet)


def fail(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


def flags(section: str, **values) -> list[str]:
    """`--set` overrides for the flags that were given (lists as JSON)."""
    return [
        f"{section}.{key}={json.dumps(value) if isinstance(value, list) else value}"
        for key, value in values.items()
        if value is not None and value is not False and value != []
    ]


def run_stage(
    stage: str, config: str | None, overrides: list[str] | None, extra: list[str] = (), verb: str = "run"
) -> None:
    """Load the config, run `workflows.<stage>.<verb>(cfg)`, print its summary; user errors exit 2 in one line."""
    try:
        cfg = load_config(config, [*(overrides or []), *extra])  # a config error before the stage's imports (torch)
        check_before_ray(cfg, stage)
        run: Callable[[XHConfig], dict] = getattr(import_module(f"workflows.{stage}"), verb)
        summary = run(cfg)
    except USER_ERRORS as e:
        fail(str(e))
    typer.echo(json.dumps(summary, sort_keys=True, default=str))


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


@app.command()
def demo(config: Config = None, overrides: Sets = None) -> None:
    """Run the whole pipeline end to end on the embedded default (local Ray, SQLite MLflow, local files)."""
    run_stage("demo", config, overrides)


wiki_app = typer.Typer(
    help="Wikipedia dumps -> docs / links / redirects / anchors / quarantine tables.", no_args_is_help=True
)
app.add_typer(wiki_app, name="wiki")


@wiki_app.command("process")
def wiki_process(
    format: Annotated[str | None, typer.Option("--format", "-f", help="hotpot, mediawiki or fever")] = None,
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
    task: Annotated[str | None, typer.Option("--task", "-t", help="hotpot or fever")] = None,
    setting: Annotated[str | None, typer.Option("--setting", help="retrieval or distractor")] = None,
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
    config: Config = None,
    overrides: Sets = None,
) -> None:
    """Evaluate @challenger and @champion on the same set; move @champion only if the challenger wins."""
    if ctx.invoked_subcommand is not None:
        return
    given = flags("promote", model=model, eval_set=eval_set, metric=metric, min_delta=min_delta, floor=floor)
    run_stage("promote", config, overrides, ["promote.action=promote", *given])


@promote_app.command("rollback")
def promote_rollback(model: Model = None, config: Config = None, overrides: Sets = None) -> None:
    """Give @champion back to the version the last promotion replaced."""
    run_stage("promote", config, overrides, ["promote.action=rollback", *flags("promote", model=model)])


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
    app()
