"""Promotion and rollback in the MLflow registry, as CLI and job entry points.

    xh promote --model xh-hotpot --eval-set runs/demo/graphs/hotpot-dev --metric f1 --min-delta 0.5
    xh promote rollback --model xh-hotpot

Every decision is printed as one JSON line and recorded as a tag on the challenger version.
"""

from __future__ import annotations

from workflows.common import s3_settings
from xh.config import XHConfig
from xh.graph.store import read_eval_set
from xh.registry import promote, rollback
from xh.tracking import configure


def promote_from_config(cfg: XHConfig, model: str, eval_set: str, metric: str, min_delta: float, floor: float) -> dict:
    s3 = s3_settings(cfg)
    rows = read_eval_set(eval_set, s3)
    configure(cfg.mlflow, s3)
    task = rows[0]["task"] if rows else "hotpot"
    return promote(model, rows, metric=metric, min_delta=min_delta, floor=floor, task=task)


def rollback_from_config(cfg: XHConfig, model: str) -> dict:
    configure(cfg.mlflow, s3_settings(cfg))
    return rollback(model)
