"""The BM25 index on storage: how it is cut, written and read back.

An index lives under one URI: `manifest.json` (the analyzer, the corpus statistics, the docs table it
was built from, and its shards with their doc ranges) and one folder per shard, `shards/shard-NNNNN`
(a `xh.retrieval.bm25.BM25Shard`). Every place is a `xh.storage.store.Location` (or a URI of the environment's
store). Writing it, in the order `xh.stages.retrieve.index` runs (one Ray task per doc range for the two
middle steps):

    index, docs = store.at("runs/demo/index/bm25"), store.at("runs/demo/tables/docs")
    ranges = doc_ranges(docs, shards=4)                                    # contiguous doc ranges
    stats = CorpusStats.merge(range_stats(r, index_titles=True, store=store) for r in ranges)
    with staged_index(index, inputs={...}) as stage:                       # built aside, swapped in whole
        building = stage.location
        entries = [build_shard(r, stats, building, index_titles=True) for r in ranges]
        write_manifest(building, stats, entries, docs_uri="runs/demo/tables", index_titles=True)
        stage.rows = stats.num_docs

Reading it:

    shards = load_index(index)                              # every shard, checked against the manifest
    corpus_snapshot(index)                                  # "<uri> docs=2000 analyzer=xh-analyzer/1:..."

Every shard is built from the statistics of the whole corpus, so the shards together score exactly
like one index (`xh.retrieval.bm25`). A rebuild writes the new index beside the old one and swaps it in
with its `_complete.json` (`xh.storage.tables.staged`): a rebuild that fails or is killed leaves the previous
index whole, never old shards mixed with new ones.
"""

from __future__ import annotations

import json
import posixpath
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from xh.retrieval.analyzer import Analyzer
from xh.retrieval.bm25 import BM25Shard, CorpusStats
from xh.storage.store import Location, Store, located
from xh.storage.tables import BM25_INDEX

INDEX_MANIFEST = "manifest.json"


def shard_path(k: int) -> str:
    """Where shard `k` lives, relative to the index URI."""
    return posixpath.join("shards", f"shard-{k:05d}")


# --- writing ---------------------------------------------------------------------------------


def doc_ranges(docs: Location | str, shards: int) -> list[dict]:
    """The docs table cut into `shards` contiguous doc ranges of about equal size.

    A range is `{shard, pieces, doc_start, num_docs}`, its pieces a list of `[file, first row, stop row]`;
    corpus order is file order, then row order. Ranges are plain JSON, to travel to Ray tasks.
    """
    docs = located(docs)
    files = docs.files(suffix=".parquet")
    rows = [pq.read_metadata(path, filesystem=fs).num_rows for fs, path in map(_file_path(docs.store), files)]
    total = sum(rows)
    bounds = [round(total * k / shards) for k in range(shards + 1)]
    ranges = []
    for lo, hi in zip(bounds, bounds[1:]):
        pieces, offset = [], 0
        for f, n in zip(files, rows):
            first, stop = max(lo, offset), min(hi, offset + n)
            if first < stop:
                pieces.append([f, first - offset, stop - offset])
            offset += n
        if pieces:
            ranges.append({"shard": len(ranges), "pieces": pieces, "doc_start": lo, "num_docs": hi - lo})
    return ranges


def _file_path(store: Store | None):
    """A file's URI -> (filesystem, path) through `store` (the environment's without one)."""
    return lambda uri: (store or Store()).at(uri).fs_path()


def analyze_range(doc_range: dict, index_titles: bool, store: Store | None = None) -> tuple[list[str], list[list[str]]]:
    """The doc ids of a range and their analyzed texts ("title. paragraph" with `index_titles`); the range's
    files are reached through `store` (the environment's without one)."""
    reach = _file_path(store)
    table = pa.concat_tables(
        pq.read_table(path, filesystem=fs, columns=["doc_id", "title", "text"]).slice(first, stop - first)
        for (fs, path), first, stop in ((reach(f), first, stop) for f, first, stop in doc_range["pieces"])
    )
    texts = table["text"].to_pylist()
    if index_titles:
        texts = [f"{t}. {x}" for t, x in zip(table["title"].to_pylist(), texts)]
    return table["doc_id"].to_pylist(), Analyzer().analyze_batch(texts)


def range_stats(doc_range: dict, index_titles: bool, store: Store | None = None) -> CorpusStats:
    """One range's part of the corpus statistics (`CorpusStats.merge` the parts)."""
    _, tokens = analyze_range(doc_range, index_titles, store)
    return CorpusStats.from_token_lists(tokens)


def build_shard(doc_range: dict, stats: CorpusStats, index: Location | str, index_titles: bool) -> dict:
    """Build and save the shard of one range under `index` (its files read through the index's store);
    returns its manifest entry `{path, doc_start, doc_stop}`."""
    index = located(index)
    doc_ids, tokens = analyze_range(doc_range, index_titles, index.store)
    shard = BM25Shard.build(doc_ids, tokens, stats, doc_start=int(doc_range["doc_start"]))
    path = shard_path(int(doc_range["shard"]))
    shard.save(index.join(path))
    return {"path": path, "doc_start": shard.doc_start, "doc_stop": shard.doc_stop}


def staged_index(index: Location | str, inputs: object = None):
    """`xh.storage.tables.staged` for an index: build shards and manifest under `stage.uri`, set `stage.rows`."""
    return located(index).staged(kind=BM25_INDEX, stage="retrieve", inputs=inputs)


def write_manifest(
    index: Location | str, stats: CorpusStats, shards: list[dict], docs_uri: str, index_titles: bool
) -> dict:
    """Write the index manifest, written last: an index without one is not an index. Returns it."""
    analyzer = Analyzer()
    manifest = {
        "analyzer": {"fingerprint": analyzer.fingerprint(), "settings": analyzer.settings()},
        "stats": stats.summary(),
        "index_titles": index_titles,
        # a local tables folder by absolute path: the manifest is read from other working folders (a served version)
        "docs": docs_uri if "://" in docs_uri else str(Path(docs_uri).resolve()),
        "shards": sorted(shards, key=lambda s: s["doc_start"]),
    }
    located(index).join(INDEX_MANIFEST).write_bytes(json.dumps(manifest, indent=1).encode())
    return manifest


# --- reading ---------------------------------------------------------------------------------


def index_exists(index: Location | str) -> bool:
    return located(index).join(INDEX_MANIFEST).exists()


def read_manifest(index: Location | str) -> dict:
    index = located(index)
    try:
        return json.loads(index.join(INDEX_MANIFEST).read_bytes())
    except FileNotFoundError:
        raise FileNotFoundError(
            f"no BM25 index at {index} (missing {INDEX_MANIFEST}): build it with `xh retrieve index`"
        ) from None


def load_index(index: Location | str, only: list[int] | None = None) -> list[BM25Shard]:
    """All shards of an index (or those numbered in `only`), checked to be parts of one index (same analyzer
    and corpus stats). Each process holds its own copy: query actors map one per node (`xh.retrieval.shared`)."""
    index = located(index)
    manifest = read_manifest(index)
    entries = [manifest["shards"][k] for k in only] if only is not None else manifest["shards"]
    shards = [BM25Shard.load(index.join(shard["path"])) for shard in entries]
    for shard in shards:
        shard.analyzer.check_same(manifest["analyzer"]["fingerprint"], what=f"the index manifest of {index}")
    return shards


def corpus_snapshot(index: Location | str) -> str:
    """The index manifest's analyzer fingerprint and corpus size: what every prediction was retrieved from."""
    manifest = read_manifest(index)
    stats = manifest.get("stats", {})
    return f"{index} docs={stats.get('num_docs', '?')} analyzer={manifest['analyzer']['fingerprint']}"
