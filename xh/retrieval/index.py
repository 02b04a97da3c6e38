"""The BM25 index on storage: how it is cut, written and read back.

An index lives under one URI: `manifest.json` (the analyzer, the corpus statistics, the docs table it
was built from, and its shards with their doc ranges) and one folder per shard, `shards/shard-NNNNN`
(a `xh.retrieval.bm25.BM25Shard`). Writing it, in the order `workflows.retrieve.build_index` runs
(one Ray task per doc range for the two middle steps):

    ranges = doc_ranges("runs/demo/tables/docs", shards=4)                 # contiguous doc ranges
    stats = CorpusStats.merge(range_stats(r, index_titles=True) for r in ranges)
    with staged_index("runs/demo/index/bm25", inputs={...}) as stage:     # built aside, swapped in whole
        entries = [build_shard(r, stats, stage.uri, index_titles=True) for r in ranges]
        write_manifest(stage.uri, stats, entries, docs_uri="runs/demo/tables", index_titles=True)
        stage.rows = stats.num_docs

Reading it:

    shards = load_index("runs/demo/index/bm25")             # every shard, checked against the manifest
    corpus_snapshot("runs/demo/index/bm25", s3)             # "<uri> docs=2000 analyzer=xh-analyzer/1:..."

Every shard is built from the statistics of the whole corpus, so the shards together score exactly
like one index (`xh.retrieval.bm25`). A rebuild writes the new index beside the old one and swaps it in
with its `_complete.json` (`xh.tables.staged`): a rebuild that fails or is killed leaves the previous
index whole, never old shards mixed with new ones.
"""

from __future__ import annotations

import json
import posixpath

import pyarrow as pa
import pyarrow.parquet as pq

from xh.retrieval.analyzer import Analyzer
from xh.retrieval.bm25 import BM25Shard, CorpusStats
from xh.storage import S3Settings, join, list_files, open_input, open_output, resolve
from xh.tables import BM25_INDEX, staged

INDEX_MANIFEST = "manifest.json"


def shard_path(k: int) -> str:
    """Where shard `k` lives, relative to the index URI."""
    return posixpath.join("shards", f"shard-{k:05d}")


# --- writing ---------------------------------------------------------------------------------


def doc_ranges(docs_uri: str, shards: int, s3: S3Settings | None = None) -> list[dict]:
    """The docs table cut into `shards` contiguous doc ranges of about equal size.

    A range is `{shard, pieces, doc_start, num_docs}`, its pieces a list of `[file, first row, stop row]`;
    corpus order is file order, then row order. Ranges are plain JSON, to travel to Ray tasks.
    """
    files = list_files(docs_uri, s3, suffix=".parquet")
    fs, _ = resolve(docs_uri, s3)
    rows = [pq.read_metadata(resolve(f, s3)[1], filesystem=fs).num_rows for f in files]
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


def analyze_range(
    doc_range: dict, index_titles: bool, s3: S3Settings | None = None
) -> tuple[list[str], list[list[str]]]:
    """The doc ids of a range and their analyzed texts ("title. paragraph" with `index_titles`)."""
    pieces = list(doc_range["pieces"])
    fs, _ = resolve(pieces[0][0], s3)
    table = pa.concat_tables(
        pq.read_table(resolve(f, s3)[1], filesystem=fs, columns=["doc_id", "title", "text"]).slice(first, stop - first)
        for f, first, stop in pieces
    )
    texts = table["text"].to_pylist()
    if index_titles:
        texts = [f"{t}. {x}" for t, x in zip(table["title"].to_pylist(), texts)]
    return table["doc_id"].to_pylist(), Analyzer().analyze_batch(texts)


def range_stats(doc_range: dict, index_titles: bool, s3: S3Settings | None = None) -> CorpusStats:
    """One range's part of the corpus statistics (`CorpusStats.merge` the parts)."""
    _, tokens = analyze_range(doc_range, index_titles, s3)
    return CorpusStats.from_token_lists(tokens)


def build_shard(
    doc_range: dict, stats: CorpusStats, index_uri: str, index_titles: bool, s3: S3Settings | None = None
) -> dict:
    """Build and save the shard of one range; returns its manifest entry `{path, doc_start, doc_stop}`."""
    doc_ids, tokens = analyze_range(doc_range, index_titles, s3)
    shard = BM25Shard.build(doc_ids, tokens, stats, doc_start=int(doc_range["doc_start"]))
    path = shard_path(int(doc_range["shard"]))
    shard.save(join(index_uri, path), s3)
    return {"path": path, "doc_start": shard.doc_start, "doc_stop": shard.doc_stop}


def staged_index(index_uri: str, s3: S3Settings | None = None, inputs: object = None):
    """`xh.tables.staged` for an index: build shards and manifest under `stage.uri`, set `stage.rows`."""
    return staged(index_uri, s3, kind=BM25_INDEX, stage="retrieve", inputs=inputs)


def write_manifest(
    index_uri: str,
    stats: CorpusStats,
    shards: list[dict],
    docs_uri: str,
    index_titles: bool,
    s3: S3Settings | None = None,
) -> dict:
    """Write the index manifest, written last: an index without one is not an index. Returns it."""
    analyzer = Analyzer()
    manifest = {
        "analyzer": {"fingerprint": analyzer.fingerprint(), "settings": analyzer.settings()},
        "stats": stats.summary(),
        "index_titles": index_titles,
        "docs": docs_uri,
        "shards": sorted(shards, key=lambda s: s["doc_start"]),
    }
    with open_output(join(index_uri, INDEX_MANIFEST), s3) as f:
        f.write(json.dumps(manifest, indent=1).encode())
    return manifest


# --- reading ---------------------------------------------------------------------------------


def index_exists(index_uri: str, s3: S3Settings | None = None) -> bool:
    fs, path = resolve(join(index_uri, INDEX_MANIFEST), s3)
    return fs.get_file_info(path).type.name != "NotFound"


def read_manifest(index_uri: str, s3: S3Settings | None = None) -> dict:
    try:
        with open_input(join(index_uri, INDEX_MANIFEST), s3) as f:
            return json.loads(f.read())
    except FileNotFoundError:
        raise FileNotFoundError(
            f"no BM25 index at {index_uri} (missing {INDEX_MANIFEST}): build it with `xh retrieve index`"
        ) from None


def load_index(index_uri: str, s3: S3Settings | None = None, only: list[int] | None = None) -> list[BM25Shard]:
    """All shards of an index (or those numbered in `only`), checked to be parts of one index (same analyzer
    and corpus stats). Each process holds its own copy: query actors map one per node (`xh.retrieval.shared`)."""
    manifest = read_manifest(index_uri, s3)
    entries = [manifest["shards"][k] for k in only] if only is not None else manifest["shards"]
    shards = [BM25Shard.load(join(index_uri, shard["path"]), s3=s3) for shard in entries]
    for shard in shards:
        shard.analyzer.check_same(manifest["analyzer"]["fingerprint"], what=f"the index manifest of {index_uri}")
    return shards


def corpus_snapshot(index_uri: str, s3: S3Settings | None) -> str:
    """The index manifest's analyzer fingerprint and corpus size: what every prediction was retrieved from."""
    manifest = read_manifest(index_uri, s3)
    stats = manifest.get("stats", {})
    return f"{index_uri} docs={stats.get('num_docs', '?')} analyzer={manifest['analyzer']['fingerprint']}"
