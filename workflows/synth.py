"""Generate the mini-Wikipedia world (the stage: `xh.stages.synth`).

    xh synth --config configs/demo.yaml --set synth.num_docs=200000
    xh synth --set storage.root=s3://bucket/xh

Writes under `<storage.root>/world/` (`xh.storage.locations.world`; layout in `xh.synth`).
"""

from __future__ import annotations

from workflows.common import init_ray
from xh.config import XHConfig
from xh.stages import synth
from xh.storage.store import Store


def run(cfg: XHConfig) -> dict:
    store = Store.from_config(cfg)
    init_ray(cfg)
    return synth.run(cfg, store)
