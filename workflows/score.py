"""`xh score`: new questions -> retrieval -> evidence graphs -> the champion model -> predictions.

    xh score --set score.input=s3://bucket/incoming/2026-11-22/ --set score.model=models:/xh-hotpot@champion
    xh score --config configs/demo.yaml

The stage is `xh.stages.score` (its stages, resumption, partitions and the version's pipeline); this
driver checks everything before Ray starts, joins Ray only when there is something to score, and prints
the summary.
"""

from __future__ import annotations

from workflows.common import init_ray
from xh.config import XHConfig
from xh.stages import score
from xh.storage.store import Store


def run(cfg: XHConfig) -> dict:
    store = Store.from_config(cfg)
    job = score.prepare(cfg, store)  # a bad input, model URI or path scorer: one line, exit 2, no cluster
    try:
        if job.digests:
            init_ray(cfg)
    except BaseException:
        job.release()  # the model version's lock, taken by `prepare`
        raise
    return score.run(job)
