"""Train Transformer-XH on Ray Train (DDP), track it in MLflow, register the model as `@challenger`.

    xh train --set train.workers=2 --set train.epochs=2
    xh train --config configs/demo.yaml
    infra/submit.sh train --config configs/cluster.yaml

The stage itself is `xh.stages.train`.
"""

from __future__ import annotations

from workflows.common import init_ray
from xh.config import XHConfig
from xh.stages import train
from xh.storage.store import Store


def _job(cfg: XHConfig) -> train.Job:
    job = train.Job.of(cfg, Store.from_config(cfg))  # bad input: a one-line error before Ray starts
    init_ray(cfg)
    return job


def fit(cfg: XHConfig) -> dict:
    """Ray Train alone: the best checkpoint's folder, its metrics and the MLflow run (no registration)."""
    return train.fit(_job(cfg))


def run(cfg: XHConfig) -> dict:
    return train.run(_job(cfg))
