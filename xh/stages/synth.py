"""The mini-Wikipedia world (`xh.synth`), its shards written in parallel by Ray tasks.

Writes under `<storage.root>/world/` (layout in `xh.synth`). Every shard is a pure function of the
spec, so shards are independent Ray tasks that write straight to storage; then the questions and
claims (they touch only the pages they need) and the summary are written here.
"""

from __future__ import annotations

import logging
import time

from xh import synth
from xh.config import XHConfig
from xh.storage import locations
from xh.storage.store import Store

log = logging.getLogger("xh.synth").info


def run(cfg: XHConfig, store: Store) -> dict:
    """Write the world of `cfg.synth` on the Ray cluster the caller joined; returns its summary."""
    import ray

    s = cfg.synth
    spec = synth.WorldSpec(num_docs=s.num_docs, seed=s.seed)
    world = store.at(locations.world(cfg))
    output = synth.output_under(world)
    start = time.perf_counter()

    @ray.remote(num_cpus=1)
    def write_shard(shard: int) -> synth.ShardSummary:
        return synth.write_shard(spec, shard, output, docs_per_shard=s.docs_per_shard, fever_pages=s.fever_pages)

    count = synth.num_shards(spec, s.docs_per_shard)
    log(f"writing {spec.num_docs:,} pages in {count} shard(s) -> {world}")
    shards = ray.get([write_shard.remote(k) for k in range(count)])
    log("writing questions and claims")
    summary = synth.write_tasks_and_summary(
        spec,
        output,
        shards,
        docs_per_shard=s.docs_per_shard,
        num_questions=s.num_questions,
        num_claims=s.num_claims,
        comparison_fraction=s.comparison_fraction,
    )
    seconds = time.perf_counter() - start
    return {
        "world": world.uri,
        "docs": summary.num_docs,
        "links": summary.num_links,
        "shards": summary.num_shards,
        "questions": summary.num_questions,
        "claims": summary.num_claims,
        "seconds": round(seconds, 3),
        "docs_per_s": round(summary.num_docs / seconds, 1),
    }
