"""A query actor's retrieval state, once per node: memory-mapped files that every process of the node shares.

    state = node_state("runs/demo/index/bm25", "runs/demo/tables")       # built once per node, then mapped
    state.shards, state.linker, state.graph, state.positions            # read-only, shared page by page

What a query actor reads (the BM25 shards' weights and doc ids, the entity linker's surface index, the
link graph, the doc id -> shard lookup) is laid out once per node as `.npy` arrays and Arrow IPC files
in a cache folder (`XH_NODE_CACHE`, or `xh-node-cache` under the system's temporary folder), and every
process maps it (`np.load(mmap_mode="r")`, `pa.memory_map`): the pages live once in the node's page
cache, however many actors map them, so adding a query actor adds its own small working memory and no
copy of the index. The first process that finds no layout builds it, under a file lock (a second one
waits, then maps what the first wrote), in a folder beside the final one that it renames into place
when complete; a builder killed half-way leaves nothing that a later one would read.

What is laid out: a local index's weight and doc-index arrays are mapped where the index stage wrote
them (checked against the shard's manifest once, by the builder); an s3:// index's are fetched into
the layout, once per node. Everything a process used to derive when it loaded (the term lookup, the
frequent terms' dense rows, each term's largest weight, the linker's surface index built from the anchors and titles, the link
graph's in-link order, the doc id lookup) is derived once, by the builder, and written beside them.

A layout is named by a digest of the index's and tables' files (path, size, modification time), so a
rebuilt index or reprocessed tables get a new layout and a stale one is never read; layouts are not
removed (delete the cache folder when no actor runs).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import scipy.sparse as sp

from xh.retrieval.analyzer import Analyzer
from xh.retrieval.bm25 import BM25Params, BM25Shard
from xh.retrieval.entity_linking import EntityLinker
from xh.retrieval.expansion import LinkGraph
from xh.retrieval.index import load_index, read_manifest
from xh.storage.store import Location, located

CACHE_ENV = "XH_NODE_CACHE"
LAYOUT = "xh-retrieval-node-layout/2"
READY = "layout.json"
# Terms looked up by one process and remembered (a query vocabulary is small next to the corpus's).
TERM_MEMO = 1 << 18


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """Where a node keeps its layouts: `cache_dir`, else `$XH_NODE_CACHE`, else under the temporary folder."""
    return Path(cache_dir or os.environ.get(CACHE_ENV) or Path(tempfile.gettempdir()) / "xh-node-cache")


def string_keys(values: Sequence[str]) -> np.ndarray:
    """A 64-bit key per string, the same in every process (Python's `hash` is salted per process)."""
    digests = (hashlib.blake2b(v.encode("utf-8", "surrogatepass"), digest_size=8).digest() for v in values)
    return np.fromiter(digests, dtype="S8", count=len(values)).view("<u8")


class MappedTermRows:
    """Term -> row of a shard from mapped arrays: the terms' keys sorted, each key's row, the terms to
    check against (a key shared by two terms costs a comparison more, never a wrong row). Behaves as the
    `dict` a built shard holds, for the lookups retrieval makes (`in`, `[]`, `get`)."""

    def __init__(self, keys: np.ndarray, rows: np.ndarray, terms: pa.StringArray):
        self.keys, self.rows, self.terms = keys, rows, terms
        self._memo: dict[str, int] = {}

    def get(self, term: str, default=None):
        row = self._memo.get(term)
        if row is None:
            row = self._find(term)
            if len(self._memo) >= TERM_MEMO:
                self._memo.clear()
            self._memo[term] = row
        return default if row < 0 else row

    def _find(self, term: str) -> int:
        key = string_keys([term])[0]
        k = int(np.searchsorted(self.keys, key))
        while k < len(self.keys) and self.keys[k] == key:
            row = int(self.rows[k])
            if self.terms[row].as_py() == term:
                return row
            k += 1
        return -1

    def __contains__(self, term: object) -> bool:
        return isinstance(term, str) and self.get(term) is not None

    def __getitem__(self, term: str) -> int:
        row = self.get(term)
        if row is None:
            raise KeyError(term)
        return row

    def __len__(self) -> int:
        return len(self.terms)

    def __iter__(self) -> Iterator[str]:
        return iter(self.terms.to_pylist())


@dataclass
class NodeState:
    """What a query actor maps: the shards, the linker, the link graph, the doc id lookup (arrays of
    `xh.retrieval.candidates.DocPositions`), and the layout's folder."""

    shards: list[BM25Shard]
    linker: EntityLinker
    graph: LinkGraph
    positions: dict[str, np.ndarray]
    folder: Path


# --- naming a layout -------------------------------------------------------------------------


def _fingerprint(places: Sequence[Location]) -> list:
    """(path, size, mtime) of every file under the places: what a layout is derived from."""
    out = []
    for place in places:
        files = place.files()
        if not files:
            continue
        fs, _ = place.fs_path()
        infos = fs.get_file_info([place.store.at(f).fs_path()[1] for f in files])
        out += [[f, i.size, i.mtime_ns] for f, i in zip(files, infos)]
    return out


def layout_key(index: Location | str, tables: Location | str) -> str:
    index, tables = located(index), located(tables)
    parts = [index.join("shards"), index.join("manifest.json")]
    parts += [tables.join(t) for t in ("docs", "anchors", "links")]
    files = _fingerprint(parts)
    digest = hashlib.sha256(json.dumps([LAYOUT, index.uri, tables.uri, files]).encode()).hexdigest()
    return digest[:24]


# --- writing a layout ------------------------------------------------------------------------


def _save(folder: Path, name: str, array: np.ndarray) -> None:
    np.save(folder / f"{name}.npy", np.ascontiguousarray(array), allow_pickle=False)


def _save_strings(folder: Path, name: str, values) -> None:
    array = values if isinstance(values, pa.Array) else pa.array(list(values), pa.string())
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    table = pa.table({"value": array})
    with pa.OSFile(str(folder / f"{name}.arrow"), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=max(len(array), 1))  # one batch: one zero-copy array


def _index_dtype(n: int):
    return np.int32 if n < np.iinfo(np.int32).max else np.int64


def _write_shard(folder: Path, shard: BM25Shard, local_files: dict[str, str] | None) -> dict:
    """One shard's arrays; the weights and doc indices are referred to where a local index keeps them."""
    folder.mkdir(parents=True)
    w = shard.weights
    dtype = _index_dtype(max(w.nnz, shard.num_docs))
    if local_files is None:
        _save(folder, "weights", w.data.astype(np.float64))
        _save(folder, "doc_index", w.indices.astype(np.int32))
        local_files = {"weights": "weights.npy", "doc_index": "doc_index.npy"}  # in the layout: relative
    _save(folder, "indptr", w.indptr.astype(dtype))
    _save_strings(folder, "doc_ids", shard.doc_ids.tolist())
    _save(folder, "doc_lengths", shard.doc_lengths.astype(np.int32))
    _save_strings(folder, "terms", shard.terms)
    keys = string_keys(shard.terms)
    order = np.argsort(keys, kind="stable")
    _save(folder, "term_keys", keys[order])
    _save(folder, "term_key_rows", order.astype(np.int64))
    _save(folder, "term_dfs", shard.term_dfs.astype(np.int64))
    _save(folder, "slot", shard._slot)
    _save(folder, "dense", shard._dense)
    _save(folder, "dense_max", shard._dense_max)
    _save(folder, "term_max", shard._term_max)
    return {
        "analyzer": shard.analyzer.settings(),
        "params": {"k1": shard.params.k1, "b": shard.params.b, "epsilon": shard.params.epsilon},
        "stats": shard.stats,
        "doc_start": shard.doc_start,
        "shape": [len(shard.terms), shard.num_docs],
        "has_nonpositive": shard._has_nonpositive,
        "files": local_files,
    }


def _write_layout(folder: Path, index: Location, tables: Location) -> None:
    """Everything a query actor maps, written one part at a time (a part is dropped before the next)."""
    folder.mkdir(parents=True)
    manifest = read_manifest(index)
    shards_meta = []
    for k, entry in enumerate(manifest["shards"]):
        # `load_index` checks every file against its shard manifest: the arrays referred to are those checked
        [shard] = load_index(index, only=[k])
        local = None
        if not index.is_s3:
            root = index.join(entry["path"]).fs_path()[1]
            local = {"weights": os.path.join(root, "weights.npy"), "doc_index": os.path.join(root, "doc_index.npy")}
        shards_meta.append(_write_shard(folder / f"shard-{k:05d}", shard, local))
        del shard
    # the doc id -> (shard, column) lookup, by stable key
    ids = [
        pa.ipc.open_file(pa.memory_map(str(folder / f"shard-{k:05d}" / "doc_ids.arrow")))
        for k in range(len(shards_meta))
    ]
    columns = [r.read_all().column(0) for r in ids]
    keys = np.concatenate([string_keys(c.to_pylist()) for c in columns] or [np.zeros(0, np.uint64)])
    where = np.concatenate([np.full(len(c), k, np.int32) for k, c in enumerate(columns)] or [np.zeros(0, np.int32)])
    cols = np.concatenate([np.arange(len(c), dtype=np.int32) for c in columns] or [np.zeros(0, np.int32)])
    order = np.argsort(keys, kind="stable")
    positions = folder / "positions"
    positions.mkdir()
    _save(positions, "keys", keys[order])
    _save(positions, "where", where[order])
    _save(positions, "cols", cols[order])
    del keys, where, cols, order, columns, ids

    linker = EntityLinker.load(tables)
    part = folder / "linker"
    part.mkdir()
    for name in ("keys", "offsets", "entry_docs", "entry_counts"):
        _save(part, name, getattr(linker, name))
    _save_strings(part, "doc_ids", linker.doc_ids)
    del linker

    graph = LinkGraph.load(tables)
    part = folder / "graph"
    part.mkdir()
    for name in ("edge_src", "edge_dst", "edge_anchor", "out_offsets", "in_edges", "in_offsets"):
        _save(part, name, getattr(graph, name))
    _save_strings(part, "doc_ids", graph.doc_ids)
    _save_strings(part, "anchors", graph.anchors)
    del graph

    layout = {"format": LAYOUT, "index": index.uri, "tables": tables.uri, "shards": shards_meta}
    (folder / READY).write_text(json.dumps(layout, indent=1))


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)  # released when the file closes, or when the process dies
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def ensure_layout(index: Location | str, tables: Location | str, cache_dir: str | os.PathLike | None = None) -> Path:
    """The node's layout of this index and these tables, built first when there is none. Returns its folder."""
    root = cache_root(cache_dir)
    index, tables = located(index), located(tables)
    folder = root / layout_key(index, tables)
    if (folder / READY).exists():
        return folder
    root.mkdir(parents=True, exist_ok=True)
    with _locked(root / f"{folder.name}.lock"):
        if (folder / READY).exists():  # built by another process while this one waited
            return folder
        building = root / f".{folder.name}.building"
        shutil.rmtree(building, ignore_errors=True)  # left by a builder that was killed
        _write_layout(building, index, tables)
        shutil.rmtree(folder, ignore_errors=True)
        os.rename(building, folder)
    return folder


# --- mapping a layout ------------------------------------------------------------------------


def _map(path: str | Path) -> np.ndarray:
    try:
        return np.asarray(np.load(path, mmap_mode="r", allow_pickle=False))
    except ValueError:  # an empty array has no pages to map
        return np.load(path, allow_pickle=False)


def _map_strings(path: Path) -> pa.Array:
    table = pa.ipc.open_file(pa.memory_map(str(path))).read_all()
    column = table.column(0)
    return column.chunk(0) if column.num_chunks == 1 else pa.concat_arrays(column.chunks or [pa.array([], column.type)])


def _map_shard(folder: Path, meta: dict) -> BM25Shard:
    data, indices = (_map(folder / meta["files"][name]) for name in ("weights", "doc_index"))  # absolute stays
    indptr = _map(folder / "indptr.npy")
    shape = tuple(meta["shape"])
    if indices.dtype != indptr.dtype:  # beyond 2^31 postings: 64-bit indices, a copy (scipy needs one dtype)
        indices = indices.astype(indptr.dtype)
    weights = sp.csr_array((data, indices, indptr), shape=shape, copy=False)
    weights.has_sorted_indices = True  # written so (docs ascending within a term): no check over every posting
    terms = _map_strings(folder / "terms.arrow")
    p = meta["params"]
    return BM25Shard(
        analyzer=Analyzer.from_settings(meta["analyzer"]),
        params=BM25Params(p["k1"], p["b"], p["epsilon"]),
        stats=meta["stats"],
        doc_start=meta["doc_start"],
        doc_ids=_map_strings(folder / "doc_ids.arrow"),
        doc_lengths=_map(folder / "doc_lengths.npy"),
        terms=terms,
        term_dfs=_map(folder / "term_dfs.npy"),
        weights=weights,
        term_rows=MappedTermRows(_map(folder / "term_keys.npy"), _map(folder / "term_key_rows.npy"), terms),
        prepared={
            "has_nonpositive": meta["has_nonpositive"],
            "slot": _map(folder / "slot.npy"),
            "dense": _map(folder / "dense.npy"),
            "dense_max": _map(folder / "dense_max.npy"),
            "term_max": _map(folder / "term_max.npy"),
        },
    )


def map_layout(folder: Path) -> NodeState:
    """The state a layout holds, every array mapped read-only."""
    layout = json.loads((folder / READY).read_text())
    if layout.get("format") != LAYOUT:
        raise ValueError(f"{folder} is not a {LAYOUT} layout")
    shards = [_map_shard(folder / f"shard-{k:05d}", meta) for k, meta in enumerate(layout["shards"])]
    part = folder / "linker"
    linker = EntityLinker(
        *(_map(part / f"{n}.npy") for n in ("keys", "offsets", "entry_docs", "entry_counts")),
        _map_strings(part / "doc_ids.arrow"),
    )
    part = folder / "graph"
    graph = LinkGraph(
        _map_strings(part / "doc_ids.arrow"),
        *(_map(part / f"{n}.npy") for n in ("edge_src", "edge_dst", "edge_anchor")),
        _map_strings(part / "anchors.arrow"),
        offsets=tuple(_map(part / f"{n}.npy") for n in ("out_offsets", "in_edges", "in_offsets")),
    )
    positions = {n: _map(folder / "positions" / f"{n}.npy") for n in ("keys", "where", "cols")}
    return NodeState(shards, linker, graph, positions, folder)


def node_state(index: Location | str, tables: Location | str, cache_dir: str | os.PathLike | None = None) -> NodeState:
    """The retrieval state of this index and these tables, mapped from the node's layout (built once)."""
    return map_layout(ensure_layout(index, tables, cache_dir))
