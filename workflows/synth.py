"""Generate the mini-Wikipedia world, its shards written in parallel by Ray tasks.

    python -m workflows.synth --config configs/demo.yaml --set synth.num_docs=200000
    xh synth --set storage.root=s3://bucket/xh

Writes under `<storage.root>/world/` (layout in `xh.synth`). Every shard is a pure function of
the spec, so shards are independent Ray tasks that write straight to storage; the driver then
writes the questions and claims (they touch only the pages they need) and the summary.
"""

from __future__ import annotations

import time

from workflows.common import init_ray, log, main, s3_settings
from xh import synth
from xh.config import XHConfig
from xh.storage import join


def world_uri(cfg: XHConfig) -> str:
    return join(cfg.storage.root, "world")


def run(cfg: XHConfig) -> dict:
    import ray

    spec = synth.WorldSpec(num_docs=cfg.synth.num_docs, seed=cfg.synth.seed)
    root, s3 = world_uri(cfg), s3_settings(cfg)
    per_shard = cfg.synth.docs_per_shard
    init_ray(cfg)
    start = time.perf_counter()

    @ray.remote(num_cpus=1)
    def write_shard(shard: int) -> synth.ShardSummary:
        return synth.write_shard(
            spec, shard, synth.output_under(root, s3), docs_per_shard=per_shard, fever_pages=cfg.synth.fever_pages
        )

    count = synth.num_shards(spec, per_shard)
    log("synth", f"writing {spec.num_docs:,} pages in {count} shard(s) -> {root}")
    shards = ray.get([write_shard.remote(k) for k in range(count)])
    log("synth", "writing questions and claims")
    summary = synth.write_tasks_and_summary(
        spec,
        synth.output_under(root, s3),
        shards,
        docs_per_shard=per_shard,
        num_questions=cfg.synth.num_questions,
        num_claims=cfg.synth.num_claims,
        comparison_fraction=cfg.synth.comparison_fraction,
    )
    seconds = time.perf_counter() - start
    return {
        "world": root,
        "docs": summary.num_docs,
        "links": summary.num_links,
        "shards": summary.num_shards,
        "questions": summary.num_questions,
        "claims": summary.num_claims,
        "seconds": round(seconds, 3),
        "docs_per_s": round(summary.num_docs / seconds, 1),
    }


if __name__ == "__main__":
    main("synth", run)
