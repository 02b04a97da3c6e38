"""Retrieval on Ray: the sharded BM25 index, the candidates of a question file, their recall, a path scorer.

    xh retrieve index  --set retrieve.shards=8                 # docs table -> BM25 shards + manifest
    xh retrieve run    --questions hotpot.json                 # questions -> candidates (ir, el, exp)
    xh retrieve run    --questions q.json --set retrieve.reranker=runs/demo/models/reranker   # re-ranked
    xh retrieve eval                                           # Supp / Ans recall of those candidates
    xh retrieve paths  --questions hotpot_train.json           # a path scorer from their supporting facts
    xh retrieve all    --questions q.json                      # the index (when missing), run and eval

One function per verb: config -> checks (one line, before Ray starts) -> Ray -> `xh.stages.retrieve`.
"""

from __future__ import annotations

from workflows.common import init_ray
from xh.config import XHConfig
from xh.stages import retrieve as stage
from xh.storage.store import Store


def _ready(cfg: XHConfig, check) -> Store:
    store = Store.from_config(cfg)
    check(cfg, store)
    init_ray(cfg)
    return store


def index(cfg: XHConfig) -> dict:
    return stage.index(cfg, _ready(cfg, stage.check_index_inputs))


def run(cfg: XHConfig) -> dict:
    return stage.run(cfg, _ready(cfg, stage.check_inputs))


def evaluate(cfg: XHConfig) -> dict:
    return stage.evaluate(cfg, Store.from_config(cfg))  # reads two tables: no Ray


def paths(cfg: XHConfig) -> dict:
    return stage.paths(cfg, _ready(cfg, stage.check_paths_inputs))


def all_steps(cfg: XHConfig) -> dict:
    return stage.all_steps(cfg, _ready(cfg, stage.check_paths_inputs))
