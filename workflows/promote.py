"""Promotion and rollback in the MLflow registry (config section `promote`).

    python -m workflows.promote --config my.yaml --set promote.eval_set=runs/demo/graphs/hotpot
    python -m workflows.promote --set promote.action=rollback --set promote.model=xh-hotpot
    xh promote --model xh-hotpot --eval-set runs/demo/graphs/hotpot --metric f1 --min-delta 0.5
    xh promote rollback --model xh-hotpot

Every decision is printed as one JSON line and recorded as a tag on the challenger version.
"""

from __future__ import annotations

from workflows.common import main, s3_settings
from xh.config import XHConfig
from xh.graph.store import quarantined_qids, read_eval_set
from xh.registry import promote, rollback
from xh.storage import join
from xh.tracking import configure


def run(cfg: XHConfig) -> dict:
    p, s3 = cfg.promote, s3_settings(cfg)
    if p.action == "rollback":
        configure(cfg.mlflow, s3)
        return rollback(p.model)
    eval_set = p.eval_set or join(cfg.storage.root, "graphs", cfg.model.task)
    rows = read_eval_set(eval_set, s3)
    missed = quarantined_qids(eval_set, s3)  # questions without a graph score 0, as in the official script
    configure(cfg.mlflow, s3)
    task = rows[0]["task"] if rows else "hotpot"
    return promote(p.model, rows, metric=p.metric, min_delta=p.min_delta, floor=p.floor, task=task, missed=missed)


if __name__ == "__main__":
    main("promote", run)
