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
            "run": lambda: retrieve.run_candidates(cfg),
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


@retrieve_app.command("train-reranker")
def retrieve_train_reranker(
    questions: Optional[str] = typer.Option(None, "--questions", "-q", help="HotpotQA file, distractor format (local or s3://)"),
    output: Optional[str] = typer.Option(None, "--output", "-o", help="where the re-ranker goes (default <storage.root>/models/reranker)"),
    config: Optional[str] = ConfigOpt,
    overrides: Optional[List[str]] = SetOpt,
) -> None:
    """Train the cross-encoder re-ranker on Ray Train (supporting facts as relevance labels); use it with
    --set retrieve.reranker=PATH."""
    flags = [f"rerank.questions={questions}"] if questions else []
    flags += [f"rerank.output={output}"] if output else []
    _run_stage("rerank", config, [*(overrides or []), *flags], module="train_reranker")


@retrieve_app.command("eval")
def retrieve_eval(config: Optional[str] = ConfigOpt, overrides: Optional[List[str]] = SetOpt) -> None:
    """Supp / Ans recall at 2, 5, 10, 100 and after expansion, overall and per question type."""
    _retrieve_step("eval", config, overrides, None)


@retrieve_app.command("all")
def retrieve_all(questions: Optional[str] = QuestionsOpt, config: Optional[str] = ConfigOpt,
                 overrides: Optional[List[str]] = SetOpt) -> None:  # fmt: skip
    """Index (if missing), candidates and evaluation in one go."""
    _retrieve_step("all", config, overrides, questions)


eval_app = typer.Typer(help="Official HotpotQA / FEVER metrics of a prediction file.", no_args_is_help=True)
app.add_typer(eval_app, name="eval")
GoldOpt = typer.Option(..., "--gold", "-g", help="gold file, local or s3://")
PredOpt = typer.Option(..., "--pred", "-p", help="prediction file, local or s3://")
SlicesOpt = typer.Option(False, "--slices", help="also the metrics per slice (question type / evidence count)")


@eval_app.command("hotpot")
def eval_hotpot(gold: str = GoldOpt, pred: str = PredOpt, slices: bool = SlicesOpt) -> None:
    """hotpot_evaluate_v1.py's metrics: answer, supporting-fact and joint EM / F1 / precision / recall."""
    from xh.eval import EvalInputError
    from xh.eval.hotpot import evaluate_hotpot_files

    try:
        result = evaluate_hotpot_files(gold, pred, slices=True)  # the slices count the missing predictions
    except EvalInputError as e:
        _fail(str(e))
    per_type = result.pop("slices") if not slices else result["slices"]
    missing_answer = sum(s["missing_answer"] for s in per_type.values())
    missing_sp = sum(s["missing_sp"] for s in per_type.values())
    if missing_answer or missing_sp:  # the official script reports them too; they score 0
        typer.echo(f"warning: {missing_answer} questions have no predicted answer and {missing_sp} no "
                   "predicted supporting facts; they score 0", err=True)  # fmt: skip
    typer.echo(json.dumps(result, sort_keys=True))


@eval_app.command("fever")
def eval_fever(gold: str = GoldOpt, pred: str = PredOpt, slices: bool = SlicesOpt) -> None:
    """The FEVER scorer's metrics (at most 5 evidence): FEVER score, label accuracy, evidence P / R / F1."""
    from xh.eval import EvalInputError
    from xh.eval.fever import evaluate_fever_files

    try:
        result = evaluate_fever_files(gold, pred, slices=slices)
    except EvalInputError as e:
        _fail(str(e))
    typer.echo(json.dumps(result, sort_keys=True))


@app.command()
def train(config: Optional[str] = ConfigOpt, overrides: Optional[List[str]] = SetOpt) -> None:
    """Train Transformer-XH on Ray Train (DDP), track it in MLflow, register it as @challenger."""
    _run_stage("train", config, overrides)


@app.command()
def score(input: Optional[str] = typer.Option(None, "--input", help="question files or folder (JSON lines / Parquet)"),
          model: Optional[str] = typer.Option(None, "--model", help="e.g. models:/xh-hotpot@champion"),
          config: Optional[str] = ConfigOpt, overrides: Optional[List[str]] = SetOpt) -> None:  # fmt: skip
    """Batch-score new questions with one registered model version: retrieval, graphs, inference."""
    extra = [f"score.input={input}"] * bool(input) + [f"score.model={model}"] * bool(model)
    _run_stage("score", config, [*(overrides or []), *extra], module="batch_score")


promote_app = typer.Typer(help="Move the champion alias in the MLflow registry.", invoke_without_command=True)
app.add_typer(promote_app, name="promote")


@promote_app.callback()
def promote(ctx: typer.Context, model: str = typer.Option("xh-hotpot", "--model", help="registered model name"),
            eval_set: Optional[str] = typer.Option(None, "--eval-set", help="graphs folder with gold labels"),
            metric: str = typer.Option("f1", "--metric"), min_delta: float = typer.Option(0.5, "--min-delta"),
            floor: float = typer.Option(0.0, "--floor", help="score (x100) the first model must reach"),
            config: Optional[str] = ConfigOpt, overrides: Optional[List[str]] = SetOpt) -> None:  # fmt: skip
    """Evaluate @challenger and @champion on the same set; move @champion only if the challenger wins."""
    if ctx.invoked_subcommand is not None:
        return
    if not eval_set:
        _fail("--eval-set is required (a graphs folder, local or s3://)")
    from workflows.promote import promote_from_config

    _run_with_config(lambda cfg: promote_from_config(cfg, model, eval_set, metric, min_delta, floor), config, overrides)


@promote_app.command("rollback")
def promote_rollback(model: str = typer.Option("xh-hotpot", "--model"), config: Optional[str] = ConfigOpt,
                     overrides: Optional[List[str]] = SetOpt) -> None:  # fmt: skip
    """Give @champion back to the version the last promotion replaced."""
    from workflows.promote import rollback_from_config

    _run_with_config(lambda cfg: rollback_from_config(cfg, model), config, overrides)


graphs_app = typer.Typer(help="Evidence graphs (HotpotQA, FEVER) -> the sharded graphs table.", no_args_is_help=True)
app.add_typer(graphs_app, name="graphs")


@graphs_app.command("build")
def graphs_build(
    task: Optional[str] = typer.Option(None, "--task", "-t", help="hotpot or fever (graphs.task)"),
    setting: Optional[str] = typer.Option(None, "--setting", help="retrieval or distractor (graphs.setting)"),
    questions: Optional[str] = typer.Option(None, "--questions", "-q", help="distractor setting: HotpotQA file with contexts"),
    config: Optional[str] = ConfigOpt,
    overrides: Optional[List[str]] = SetOpt,
) -> None:
    """Build one graph per question on Ray Data; print a JSON summary (graphs, quarantined, answer recall, sizes)."""
    flags = [f"graphs.task={task}"] if task else []
    flags += [f"graphs.setting={setting}"] if setting else []
    flags += [f"graphs.questions={questions}"] if questions else []
    _run_stage("graphs", config, [*(overrides or []), *flags], module="build_graphs")


def _run_with_config(action, config: Optional[str], overrides: Optional[List[str]]) -> None:
    from workflows.common import USER_ERRORS

    try:
        summary = action(load_config(config, overrides or []))
    except (*USER_ERRORS, ValueError) as e:
        _fail(str(e))
    typer.echo(json.dumps(summary, sort_keys=True))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(app())
