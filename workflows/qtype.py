"""`xh qtype`: train the question-type classifier that scoring and serving use for untyped questions.

    xh qtype --config configs/demo.yaml
    xh qtype --set qtype.questions=s3://bucket/hotpot_train.json

The stage is `xh.stages.qtype`; it needs no Ray (one process fits the classifier's head).
"""

from __future__ import annotations

from xh.config import XHConfig
from xh.stages import qtype as stage
from xh.storage.store import Store


def run(cfg: XHConfig) -> dict:
    return stage.run(cfg, Store.from_config(cfg))
