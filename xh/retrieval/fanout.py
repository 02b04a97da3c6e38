"""BM25 over shards no one process maps together: each shard group on its own actor, their top-k merged.

    groups = shard_groups(layout_shard_bytes(folder), budget_bytes=2 * 2**30)    # [[0, 1], [2], [3]]
    searcher = FanoutShards.start(index, tables, groups)                         # one Ray actor per group
    retriever = Retriever(state.shards, state.linker, state.graph, settings, positions=..., searcher=searcher)

A query actor maps the node's layout (`xh.retrieval.shared`) for the linker, the link graph and the doc
lookup; with a searcher, BM25 runs on the shard actors instead: each scores its shards and returns its
top-k, and the merge keeps the global top-k by the index's one ranking rule (score descending, then corpus
position), so the result is exactly that of one process holding every shard (`merge_topk`: the global
top-k of a query is among the union of the shards' top-k). The weights a path scorer and the expansion read
for given documents come from the same actors (`Retriever.term_weights_batch`). Groups are contiguous shards
whose mapped files fit `budget_bytes` together; a shard larger than the budget alone is refused (index with
more `retrieve.shards`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from xh.retrieval.bm25 import SearchResult, merge_topk, search_shards
from xh.retrieval.shared import READY, ensure_layout, map_layout
from xh.storage.store import Location


def layout_shard_bytes(folder: Path) -> list[int]:
    """Bytes each shard of a layout maps: its own files and the index files it refers to."""
    layout = json.loads((folder / READY).read_text())
    sizes = []
    for k, meta in enumerate(layout["shards"]):
        own = sum(f.stat().st_size for f in (folder / f"shard-{k:05d}").iterdir())
        referred = sum(Path(p).stat().st_size for p in meta["files"].values() if Path(p).is_absolute())
        sizes.append(own + referred)
    return sizes


def shard_groups(sizes: Sequence[int], budget_bytes: float) -> list[list[int]]:
    """Contiguous groups of shards, each mapping at most `budget_bytes` together."""
    groups: list[list[int]] = []
    used = 0.0
    for k, size in enumerate(sizes):
        if size > budget_bytes:
            raise ValueError(
                f"shard {k} maps {size / 2**30:.2f} GiB, more than the budget of {budget_bytes / 2**30:.2f} GiB: "
                "build the index with more shards (retrieve.shards)"
            )
        if groups and used + size <= budget_bytes:
            groups[-1].append(k)
            used += size
        else:
            groups.append([k])
            used = size
    return groups


class ShardGroup:
    """The shards of one group, mapped from the node's layout: what one shard actor serves."""

    def __init__(self, index: Location | str, tables: Location | str, shards: list[int], cache_dir=None):
        state = map_layout(ensure_layout(index, tables, cache_dir))
        self.numbers = list(shards)
        self.shards = {k: state.shards[k] for k in shards}  # the others stay unmapped pages: never touched

    def search(self, queries: list[list[str]], k: int) -> list[SearchResult]:
        return merge_topk([self.shards[n].search(queries, k) for n in self.numbers], k)

    def term_entries(self, terms: list[list[str]], requests: list[tuple]) -> list[tuple]:
        from xh.retrieval.candidates import shard_term_entries

        return [shard_term_entries(self.shards[s], terms, cols, doc_query) for s, cols, doc_query in requests]


class FanoutShards:
    """BM25 through shard groups: Ray actors (`start`), or `ShardGroup`s in this process (for checks)."""

    def __init__(self, groups: list, numbers: list[list[int]]):
        self.groups, self.numbers = groups, numbers
        self.group_of = {k: g for g, shards in enumerate(numbers) for k in shards}

    @classmethod
    def start(
        cls,
        index: Location | str,
        tables: Location | str,
        numbers: list[list[int]],
        num_cpus: float = 0,
        cache_dir=None,
    ) -> FanoutShards:
        import ray

        # no CPU reserved by default: a shard actor works while the query actor that called it waits, and
        # actors reserving CPUs beside the query actors starve the tasks that feed and write them
        actor = ray.remote(num_cpus=num_cpus)(ShardGroup)
        return cls([actor.remote(index, tables, g, cache_dir) for g in numbers], numbers)

    def _call(self, method: str, args_per_group: list[tuple]) -> list:
        calls = [(g, args) for g, args in enumerate(args_per_group) if args is not None]
        if all(isinstance(g, ShardGroup) for g in self.groups):
            return [getattr(self.groups[g], method)(*args) for g, args in calls]
        import ray

        return ray.get([getattr(self.groups[g], method).remote(*args) for g, args in calls])

    def search(self, queries: list[list[str]], k: int) -> list[SearchResult]:
        """Each group's top-k, merged: the top-k of one index over every shard."""
        return merge_topk(self._call("search", [(queries, k)] * len(self.groups)), k)

    def term_entries(self, terms: list[list[str]], requests: list[tuple]) -> list[tuple]:
        """`xh.retrieval.candidates.shard_term_entries` of each request (shard, cols, doc_query), on its group."""
        per_group: list[list[tuple]] = [[] for _ in self.groups]
        for request in requests:
            per_group[self.group_of[request[0]]].append(request)
        answers = self._call("term_entries", [(terms, r) if r else None for r in per_group])
        by_group = iter(answers)
        found = {}
        for group_requests in per_group:
            if group_requests:
                for request, entries in zip(group_requests, next(by_group)):
                    found[request[0]] = entries
        return [found[request[0]] for request in requests]


def same_results(a: Sequence[SearchResult], b: Sequence[SearchResult]) -> bool:
    """The same documents, scores (bit for bit), positions and reasons, in the same order."""
    return len(a) == len(b) and all(
        x.doc_ids == y.doc_ids
        and np.array_equal(x.scores, y.scores)
        and np.array_equal(x.positions, y.positions)
        and x.reason == y.reason
        for x, y in zip(a, b)
    )


def compare_fanout(
    index: Location | str,
    tables: Location | str,
    questions: list[str],
    budget_bytes: float,
    k: int = 100,
    batch: int = 256,
) -> dict:
    """BM25 top-k of the questions through shard actors grouped under `budget_bytes`, against one process
    mapping every shard: whether they are identical, and the time each took. Needs Ray."""
    import ray

    folder = ensure_layout(index, tables)
    sizes = layout_shard_bytes(folder)
    numbers = shard_groups(sizes, budget_bytes)
    state = map_layout(folder)
    analyzed = [state.shards[0].analyzer.analyze(q) for q in questions]
    start = time.perf_counter()
    searcher = FanoutShards.start(index, tables, numbers)
    fanned = [r for i in range(0, len(analyzed), batch) for r in searcher.search(analyzed[i : i + batch], k)]
    fanout_seconds = time.perf_counter() - start
    for actor in searcher.groups:
        ray.kill(actor)
    start = time.perf_counter()
    whole = [r for i in range(0, len(analyzed), batch) for r in search_shards(state.shards, analyzed[i : i + batch], k)]
    one_seconds = time.perf_counter() - start
    return {
        "groups": numbers,
        "group_mib": [round(sum(sizes[k] for k in g) / 2**20, 1) for g in numbers],
        "budget_mib": round(budget_bytes / 2**20, 1),
        "questions": len(questions),
        "k": k,
        "identical": same_results(fanned, whole),
        "fanout_seconds": round(fanout_seconds, 2),
        "one_process_seconds": round(one_seconds, 2),
    }
