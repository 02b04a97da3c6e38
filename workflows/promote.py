"""Promotion and rollback in the MLflow registry (config section `promote`; the stage is `xh.stages.promote`).

    xh promote --model xh-hotpot --metric f1 --min-delta 0.5   # on the gate split @challenger's training recorded
    xh promote --model xh-hotpot --eval-set s3://bucket/graphs/hotpot-heldout
    xh promote --model xh-hotpot --challenger 7 --dry-run     # evaluate, log and report; move nothing
    xh promote --config my.yaml --set promote.eval_set=runs/demo/graphs/hotpot-heldout
    xh promote rollback --model xh-hotpot

Exit codes: 0 promoted, 3 champion kept (`xh.stages.promote.EXIT_KEPT`), 2 refused: an unknown model or
version, a challenger without a gate set, an eval set that is missing, shares questions with either model's
training set or was built with other graph settings, each in one line before Ray starts. The decision is
printed as one JSON line.
"""

from __future__ import annotations

from workflows.common import init_ray
from xh.config import XHConfig
from xh.stages import promote
from xh.storage.store import Store
from xh.tracking import absolute_tracking


def run(cfg: XHConfig) -> dict:
    store, cfg = Store.from_config(cfg), absolute_tracking(cfg)  # absolute: Ray actors read the tracking store too
    plan = promote.prepare(cfg, store)  # every refusal, before Ray starts
    if plan.challenger is not None:  # without one there is nothing to evaluate
        init_ray(cfg)
    return promote.run(cfg, store, plan)


def rollback(cfg: XHConfig) -> dict:
    return promote.rollback(cfg, Store.from_config(cfg))
