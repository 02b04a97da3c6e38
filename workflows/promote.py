"""Promotion and rollback in the MLflow registry (config section `promote`).

    xh promote --model xh-hotpot --metric f1 --min-delta 0.5        # on the dev split @challenger's training recorded
    xh promote --model xh-hotpot --eval-set s3://bucket/graphs/hotpot-heldout
    python -m workflows.promote --config my.yaml --set promote.eval_set=runs/demo/graphs/hotpot-heldout
    xh promote rollback --model xh-hotpot                  # python -m workflows.promote rollback --set promote.model=...

Promotion judges on held-out data only: a named eval set that shares questions with the challenger's
training set is refused (one line, exit 2), before Ray starts, and so is one whose graphs were built with
a graph setting unlike the challenger's (its pipeline record, `xh.registry.eval_graph_drift`) unless
`score.allow_drift=true`, which the decision then records. Each version is evaluated on a Ray actor
pool (`xh.promotion`; a GPU per actor where the cluster has GPUs). Each decision is an MLflow run of its
own (the eval set logged as its input, the decision as `decision.json`), printed as one JSON line and
recorded as a tag on the challenger version.
"""

from __future__ import annotations

import json

import mlflow

from workflows.common import init_ray, main, s3_settings
from xh import registry
from xh.config import XHConfig
from xh.graph.store import require_graphs
from xh.promotion import on_ray
from xh.registry import alias_version, eval_graph_drift, evaluation_set, promote
from xh.tracking import absolute_tracking, configure, log_datasets, stage_run


def run(cfg: XHConfig) -> dict:
    s3, cfg = s3_settings(cfg), absolute_tracking(cfg)  # absolute: Ray actors read the tracking store too
    p = cfg.promote
    if p.eval_set:  # a missing or broken folder: one line, before MLflow or Ray
        require_graphs(p.eval_set, s3, "evaluation set")
    configure(cfg.mlflow, s3)
    gate = dict(metric=p.metric, min_delta=p.min_delta, floor=p.floor)
    challenger = alias_version(p.model, "challenger")
    if challenger is None:
        return promote(p.model, [], **gate)  # the decision says there is none
    held = evaluation_set(p.model, challenger, p.eval_set, s3)  # refused here, before Ray starts
    # graphs unlike those the challenger trained on: refused like scoring's, unless score.allow_drift
    drift = eval_graph_drift(p.model, challenger, held["folder"], s3, allow_drift=cfg.score.allow_drift)
    init_ray(cfg)
    rows = held["rows"]
    task = rows[0]["task"] if rows else "hotpot"
    tags = {"model_name": p.model, "challenger": challenger}
    with stage_run(cfg, "promote", run_name=f"promote-{p.model}", s3=s3, tags=tags) as decision_run:
        log_datasets([(held["dataset"], "evaluation")])
        decision = promote(
            p.model,
            rows,
            **gate,
            task=task,
            challenger_version=challenger,
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


def rollback(cfg: XHConfig) -> dict:
    """Give `@champion` of `promote.model` back to the version the last promotion replaced."""
    configure(cfg.mlflow, s3_settings(cfg))
    return registry.rollback(cfg.promote.model)


if __name__ == "__main__":  # `python -m workflows.promote [rollback] --config ... --set ...`
    import sys

    verb = sys.argv[1] if sys.argv[1:2] == ["rollback"] else None
    main("promote", rollback if verb else run, sys.argv[2:] if verb else None)
