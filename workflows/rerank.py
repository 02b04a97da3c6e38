"""Train the cross-encoder re-ranker on Ray Train: relevance labels from HotpotQA supporting facts.

    xh rerank --set rerank.questions=hotpot_train_v1.1.json --set rerank.workers=2
    xh rerank --config my.yaml --set rerank.max_questions=400
    xh retrieve run --questions dev.json --set retrieve.reranker=runs/demo/models/reranker

Config -> the pairs and their step plan (read here, before Ray starts) -> Ray Train -> the re-ranker at
`rerank.output` (`xh.stages.rerank`).
"""

from __future__ import annotations

from workflows.common import init_ray
from xh.config import XHConfig
from xh.stages import rerank as stage
from xh.storage.store import Store


def run(cfg: XHConfig) -> dict:
    store = Store.from_config(cfg)
    prepared = stage.prepare(cfg, store)
    init_ray(cfg)
    return stage.train(cfg, store, prepared)
