"""Promotion and rollback (`xh promote`, `xh promote rollback`; config section `promote`): the one place a
promotion is run from, by the CLI, the RayJob and the demo alike.

    plan = prepare(cfg, store)          # every refusal, before Ray starts: the versions, the eval set, its overlaps
    decision = run(cfg, store, plan)    # on the connected Ray cluster: an actor pool per evaluated version
    code = exit_code(decision)          # 0 promoted, 3 kept the champion (EXIT_KEPT); a refusal is 2, before
    rollback(cfg, store)

Promotion judges on data that chose nothing: by default the gate split of the challenger's training run
(`xh.train.split`: neither trained on nor used to pick its checkpoint). A set (the gate or a named one) that
shares questions with either model's training set is refused in one line, and so is one whose graphs were
built with a graph setting unlike the challenger's (`xh.registry.evaluation.eval_graph_drift`) unless
`score.allow_drift=true`. A named set's questions from the challenger's dev split are flagged (`dev_overlap`).
Each version is evaluated on a Ray actor pool (a GPU per actor where the cluster has GPUs); each actor loads
the version from its data alone (`xh.registry.versions.load_registered`), so no code from the artifact store runs.

Each decision is an MLflow run of its own: the eval set as its input, each version's official metrics logged
against that version's model and the eval set (`mlflow.log_metrics(model_id=, dataset=)`), the per-question
predictions of both models as the table `promotion_predictions.json`, the decision as `decision.json`. A dry
run (`promote.dry_run`) evaluates and logs all of it and moves nothing; its exit code is the decision's.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

import mlflow

from xh.config import ConfigError, XHConfig
from xh.registry.champion import promote
from xh.registry.champion import rollback as registry_rollback
from xh.registry.evaluation import eval_graph_drift, evaluation_set, version_predictions
from xh.registry.versions import alias_version, logged_model_id
from xh.storage.store import Store
from xh.tracking import absolute_tracking, configure, log_datasets, stage_run

EXIT_PROMOTED = 0
EXIT_KEPT = 3  # the champion stays (or there is nothing to promote); 2 is a refusal, before any work
TABLE = "promotion_predictions.json"


@dataclass(frozen=True)
class Plan:
    """What a promotion judges, checked: the challenger version (None: there is none), the champion, the
    evaluation set (`xh.registry.evaluation.evaluation_set`) and the graph settings of the set that differ, opted into."""

    challenger: str | None
    champion: str | None = None
    held: dict | None = None
    drift: dict | None = None


def prepare(cfg: XHConfig, store: Store) -> Plan:
    """The checks a promotion can fail before any work: a missing or broken eval set folder (before MLflow is
    touched), an unknown model or version, a challenger without a gate set, an eval set sharing questions
    with either model's training set, or built with other graph settings."""
    from xh.graph.store import require_graphs

    p = cfg.promote
    if p.eval_set:
        require_graphs(store.at(p.eval_set), "evaluation set")
    # absolute: the Ray actors read the tracking store too
    configure(absolute_tracking(cfg).mlflow, store, registry="promote.model")
    try:
        mlflow.MlflowClient().get_registered_model(p.model)
    except mlflow.exceptions.MlflowException as e:
        if e.error_code != "RESOURCE_DOES_NOT_EXIST":
            raise
        raise ConfigError(f"promote.model: no registered model {p.model!r} in the registry") from None
    challenger = p.challenger or alias_version(p.model, "challenger")
    champion = alias_version(p.model, "champion")
    if challenger is None:
        return Plan(None, champion)
    named = store.at(p.eval_set) if p.eval_set else None
    held = evaluation_set(store, p.model, challenger, named, champion=champion)
    # graphs unlike those the challenger trained on: refused like scoring's, unless score.allow_drift
    drift = eval_graph_drift(p.model, challenger, store.at(held["folder"]), allow_drift=cfg.score.allow_drift)
    return Plan(challenger, champion, held, drift)


def run(cfg: XHConfig, store: Store, plan: Plan | None = None) -> dict:
    """The decision on `plan` (default: `prepare`'s), evaluated on the connected Ray cluster and logged as an
    MLflow run of its own (module doc)."""
    cfg, p = absolute_tracking(cfg), cfg.promote
    plan = plan or prepare(cfg, store)
    gate = dict(metric=p.metric, min_delta=p.min_delta, floor=p.floor, dry_run=p.dry_run)
    if plan.challenger is None:
        return _outcome(promote(p.model, [], **gate))  # the decision says there is none
    held, drift = plan.held, plan.drift
    rows = held["rows"]
    task = rows[0]["task"] if rows else "hotpot"
    profile = held["dataset"]["profile"]
    notes = {"eval_set": held["uri"], "eval_questions": len(rows) + len(held["missed"])}
    notes |= {"training_split": profile["training_split"]} | ({"pipeline_drift": drift} if drift else {})
    notes |= {"dev_overlap": profile["dev_overlap"]} if profile.get("dev_overlap") else {}
    tags = {"model_name": p.model, "challenger": plan.challenger, "dry_run": str(p.dry_run).lower()}
    with stage_run(cfg, "promote", run_name=f"promote-{p.model}", store=store, tags=tags) as decision_run:
        log_datasets([(held["dataset"], "evaluation")])
        evaluated = Evaluated(p.model, held["dataset"])
        decision = promote(
            p.model,
            rows,
            **gate,
            task=task,
            challenger_version=plan.challenger,
            missed=held["missed"],
            evaluate=on_ray(mlflow.get_tracking_uri()),  # an actor pool per version; GPUs where present
            on_evaluated=evaluated,
            notes=notes | {"decision_run_id": decision_run.info.run_id},
        )
        decision = _outcome(decision)
        evaluated.log_table(rows, plan.challenger)
        _log_decision(decision, drift)
    return decision


def exit_code(decision: dict) -> int:
    """0 when the challenger was promoted (a dry run: would be), EXIT_KEPT otherwise."""
    return EXIT_PROMOTED if decision["outcome"] in ("promoted", "would promote") else EXIT_KEPT


def _outcome(decision: dict) -> dict:
    if decision.get("dry_run"):
        return decision | {"outcome": "would promote" if decision.get("would_promote") else "would keep"}
    return decision | {"outcome": "promoted" if decision["promoted"] else "kept"}


def _log_decision(decision: dict, drift: dict | None) -> None:
    mlflow.set_tags(
        {
            "promoted": str(decision["promoted"]).lower(),
            "outcome": decision["outcome"],
            "champion": str(decision["champion"]),
            "pipeline_drift": json.dumps(drift, sort_keys=True) if drift else "none",
        }
    )
    scores = {k: decision[k] for k in ("challenger_score", "champion_score") if isinstance(decision.get(k), float)}
    mlflow.log_metrics(scores)
    mlflow.log_dict(decision, "decision.json")


class Evaluated:
    """`promote`'s `on_evaluated`: each version's metrics logged against its model and the eval set,
    its predictions kept for the per-question table."""

    def __init__(self, name: str, dataset: dict):
        self.name, self.dataset = name, dataset
        self.predictions: dict[str, list[dict]] = {}

    def __call__(self, version: str, metrics: dict, predictions: list) -> None:
        from mlflow.entities import Dataset

        self.predictions[version] = predictions
        model_id = logged_model_id(mlflow.MlflowClient().get_model_version(self.name, version))
        ref = self.dataset
        source = json.dumps({"uri": ref["uri"]})
        dataset = Dataset(ref["name"], ref["digest"], "s3" if ref["uri"].startswith("s3://") else "local", source)
        numbers = {f"eval_{k}": float(v) for k, v in metrics.items() if isinstance(v, (int, float))}
        mlflow.log_metrics(numbers, model_id=model_id or None, dataset=dataset)

    def log_table(self, rows: Sequence[dict], challenger: str) -> None:
        """One row per (question, evaluated version): the gold, the prediction and whether they match."""
        if not self.predictions:
            return
        mlflow.log_table(question_table(rows, self.predictions, challenger), TABLE)


def question_table(rows: Sequence[dict], predictions: dict[str, list[dict]], challenger: str) -> dict[str, list]:
    """The per-question table of a decision, as columns: qid, question, gold, version, role, prediction, match
    (HotpotQA: the answer's exact match, official normalisation; FEVER: the label's)."""
    from xh.eval.hotpot import normalize_answer

    table: dict[str, list] = {k: [] for k in ("qid", "question", "gold", "version", "role", "prediction", "match")}
    for version, predicted in predictions.items():
        for row, p in zip(rows, predicted):
            fever = "label" in p
            gold, guess = (row.get("claim_label"), p["label"]) if fever else (row.get("answer"), p.get("answer"))
            match = gold == guess if fever else normalize_answer(guess or "") == normalize_answer(gold or "")
            table["qid"].append(row["qid"])
            table["question"].append(row.get("question"))
            table["gold"].append(gold)
            table["version"].append(str(version))
            table["role"].append("challenger" if str(version) == str(challenger) else "champion")
            table["prediction"].append(guess)
            table["match"].append(bool(match))
    return table


def rollback(cfg: XHConfig, store: Store) -> dict:
    """Give `@champion` of `promote.model` back to the version the last promotion replaced."""
    configure(cfg.mlflow, store, registry="promote.model")
    return registry_rollback(cfg.promote.model)


# --- each version's predictions on a Ray actor pool ---------------------------------------------------------


class VersionPredictor:
    """One actor: a registered version loaded once, predicting shards of graph rows."""

    def __init__(self, tracking_uri: str, name: str, version: str):
        mlflow.set_tracking_uri(tracking_uri)  # credentials, if any, come from the worker's environment
        self.name, self.version = name, version

    def predict(self, rows: Sequence[dict]) -> list[dict]:
        return version_predictions(self.name, self.version, rows)


def pool_size(rows: int, gpus: float, actors: int | None = None) -> int:
    """Actors for `rows` rows: `actors`, or one per GPU of the cluster (one on a CPU cluster), never more than
    the rows, and at least one (so that a version that does not load is still found out)."""
    return max(1, min(actors or int(gpus) or 1, rows))


def on_ray(tracking_uri: str, actors: int | None = None, cpus_per_actor: float = 1.0):
    """`evaluate_version` on the connected Ray cluster: an actor pool per evaluated version
    (`pool_size`). The rows are cut into contiguous shards, one per actor, and the predictions joined in the
    rows' order (FEVER's scorer pairs gold and predictions by line)."""
    import ray

    from xh.eval.official import official_metrics

    def evaluate(name: str, version: str, rows: Sequence[dict], task: str, missed: Sequence[str] = ()) -> dict:
        gpus = ray.cluster_resources().get("GPU", 0)
        size_of_pool = pool_size(len(rows), gpus, actors)
        remote = ray.remote(num_cpus=cpus_per_actor, num_gpus=1 if gpus else 0)(VersionPredictor)
        pool = [remote.remote(tracking_uri, name, str(version)) for _ in range(size_of_pool)]
        size = -(-len(rows) // size_of_pool)
        shards = [list(rows[i * size : (i + 1) * size]) for i in range(size_of_pool)]
        try:
            parts = ray.get([actor.predict.remote(shard) for actor, shard in zip(pool, shards)])
        except ray.exceptions.RayTaskError as e:  # the version's own failure, as evaluate_version raises it
            raise e.as_instanceof_cause() from None
        finally:
            for actor in pool:
                ray.kill(actor)
        predictions = [p for part in parts for p in part]
        return official_metrics(rows, predictions, task, missed) | {"predictions": predictions}

    return evaluate
