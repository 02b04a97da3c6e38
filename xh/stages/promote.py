"""Promotion and rollback (`xh promote`, `xh promote rollback`; config section `promote`).

    plan = prepare(cfg, store)          # every refusal, before Ray starts: the eval set, its overlap, its graphs
    decision = run(cfg, store, plan)    # on the connected Ray cluster: an actor pool per evaluated version
    rollback(cfg, store)

Promotion judges on held-out data only: a named eval set that shares questions with the challenger's
training set is refused (one line), and so is one whose graphs were built with a graph setting unlike the
challenger's (its pipeline record, `xh.registry.eval_graph_drift`) unless `score.allow_drift=true`, which the
decision then records. Each version is evaluated on a Ray actor pool (`xh.promotion`; a GPU per actor where
the cluster has GPUs). Each decision is an MLflow run of its own (the eval set logged as its input, the
decision as `decision.json`), returned and recorded as a tag on the challenger version.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import mlflow

from xh import registry
from xh.config import XHConfig
from xh.store import Store
from xh.tracking import configure, log_datasets, stage_run


@dataclass(frozen=True)
class Plan:
    """What a promotion judges, checked: the challenger version (None: there is none), its evaluation set
    (`xh.registry.evaluation_set`) and the graph settings of the set that differ from its own, opted into."""

    challenger: str | None
    held: dict | None = None
    drift: dict | None = None


def prepare(cfg: XHConfig, store: Store) -> Plan:
    """The checks a promotion can fail before any work: a missing or broken eval set folder (before MLflow is
    touched), one sharing questions with the challenger's training set, or built with other graph settings."""
    from xh.graph.store import require_graphs

    p = cfg.promote
    if p.eval_set:
        require_graphs(store.at(p.eval_set), "evaluation set")
    configure(cfg.mlflow, store, registry="promote.model")
    challenger = registry.alias_version(p.model, "challenger")
    if challenger is None:
        return Plan(None)
    held = registry.evaluation_set(store, p.model, challenger, store.at(p.eval_set) if p.eval_set else None)
    # graphs unlike those the challenger trained on: refused like scoring's, unless score.allow_drift
    drift = registry.eval_graph_drift(p.model, challenger, store.at(held["folder"]), allow_drift=cfg.score.allow_drift)
    return Plan(challenger, held, drift)


def run(cfg: XHConfig, store: Store, plan: Plan | None = None) -> dict:
    """The decision on `plan` (default: `prepare`'s), evaluated on the connected Ray cluster and logged as an
    MLflow run of its own."""
    from xh.promotion import on_ray

    p = cfg.promote
    plan = plan or prepare(cfg, store)
    gate = dict(metric=p.metric, min_delta=p.min_delta, floor=p.floor)
    if plan.challenger is None:
        return registry.promote(p.model, [], **gate)  # the decision says there is none
    held, drift = plan.held, plan.drift
    rows = held["rows"]
    task = rows[0]["task"] if rows else "hotpot"
    tags = {"model_name": p.model, "challenger": plan.challenger}
    with stage_run(cfg, "promote", run_name=f"promote-{p.model}", store=store, tags=tags) as decision_run:
        log_datasets([(held["dataset"], "evaluation")])
        decision = registry.promote(
            p.model,
            rows,
            **gate,
            task=task,
            challenger_version=plan.challenger,
            missed=held["missed"],
            eval_set=held["uri"],
            decision_run_id=decision_run.info.run_id,
            evaluate=on_ray(mlflow.get_tracking_uri()),  # an actor pool per version; GPUs where present
            pipeline_drift=drift,
        )
        mlflow.set_tags(
            {
                "promoted": str(decision["promoted"]).lower(),
                "champion": str(decision["champion"]),
                "pipeline_drift": json.dumps(drift, sort_keys=True) if drift else "none",
            }
        )
        scores = {k: decision[k] for k in ("challenger_score", "champion_score") if isinstance(decision.get(k), float)}
        mlflow.log_metrics(scores)
        mlflow.log_dict(decision, "decision.json")
    return decision


def rollback(cfg: XHConfig, store: Store) -> dict:
    """Give `@champion` of `promote.model` back to the version the last promotion replaced."""
    configure(cfg.mlflow, store, registry="promote.model")
    return registry.rollback(cfg.promote.model)
