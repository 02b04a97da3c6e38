"""Docs and links of a tables folder by doc id: a node-local, memory-mapped copy built once, read-only.

    store = DocStore.open(store.at("s3://bucket/runs/demo/tables"))   # built on first use on this node
    docs, links = store.lookup({"12", "7"})   # {doc_id: (title, sentences)}, {src: [(dst, anchor, sentence)]}

Graph building needs the text and the hyperlinks of a batch's candidate documents only. Filtering the
docs and links tables for them reads every file of both tables for every batch (a scan whose cost grows
with the corpus, not the batch); the store reads only the rows the batch names.

The copy lives under `cache_root` (default: `$XH_DOC_CACHE`, else the system temp folder), in a folder
named after the tables' location and their files (path, size, modification time), so a rewritten table
gets a new copy (copies are not removed: delete the folder when no actor runs). The first process of a node builds it under a file lock, the others of that node wait for it and
then map the same files: the pages are the OS page cache's, held once per node whatever the number of
actors. Files:

    docs.arrow     Arrow IPC file (uncompressed, memory-mapped): doc_id, title, sentences, in table order
    hashes.npy     a 64-bit hash of each doc id, sorted; rows.npy the docs row of each
    links.arrow    target (docs row), anchor, sentence: the links whose both ends are docs, self-links
                   left out, grouped by source row in table order
    offsets.npy    where each docs row's links start in links.arrow (one more entry than docs)

A lookup hashes the wanted ids, finds them by binary search and checks each id's text (so a hash
collision costs a comparison, never a wrong document).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.fs as pafs

from xh.storage.store import Location, located

FORMAT = 1  # bump when the files change: older copies are then rebuilt, not misread
DOC_COLUMNS = ["doc_id", "title", "sentences"]
LINK_SCHEMA = pa.schema([("target", pa.int64()), ("anchor", pa.string()), ("sentence", pa.int32())])
_HASH_KEY = "xh-docstore-0001"  # 16 bytes: pandas' hash of a string is then the same in every process


def hash_ids(ids) -> np.ndarray:
    """uint64 hashes of doc id strings (a list or an Arrow/numpy array of them)."""
    import pandas as pd

    if isinstance(ids, (pa.Array, pa.ChunkedArray)):
        ids = ids.to_numpy(zero_copy_only=False)
    return pd.util.hash_array(np.asarray(ids, dtype=object), hash_key=_HASH_KEY, categorize=False)


def default_cache_root() -> str:
    return os.environ.get("XH_DOC_CACHE") or os.path.join(tempfile.gettempdir(), "xh-docstore")


class DocStore:
    """The memory-mapped files of one tables folder (module docstring)."""

    def __init__(self, folder: str | Path):
        folder = Path(folder)
        self.folder = folder
        self.docs = pa.ipc.open_file(pa.memory_map(str(folder / "docs.arrow"))).read_all()
        self.links = pa.ipc.open_file(pa.memory_map(str(folder / "links.arrow"))).read_all()
        self.hashes = np.load(folder / "hashes.npy", mmap_mode="r")
        self.rows = np.load(folder / "rows.npy", mmap_mode="r")
        self.offsets = np.load(folder / "offsets.npy", mmap_mode="r")
        self._ids = self.docs.column("doc_id")

    def __len__(self) -> int:
        return self.docs.num_rows

    @classmethod
    def open(cls, tables: str | Location, cache_root: str | None = None) -> DocStore:
        """The store of `tables` on this node, built first when no process of the node has built it."""
        tables = located(tables)
        key = json.dumps({"tables": tables.uri.rstrip("/"), "files": _files(tables), "format": FORMAT})
        root = Path(cache_root or default_cache_root())
        folder = root / hashlib.sha256(key.encode()).hexdigest()[:24]
        if not (folder / "_done").exists():
            root.mkdir(parents=True, exist_ok=True)
            with open(root / f"{folder.name}.lock", "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)  # one builder per node; the others wait, then map its files
                if not (folder / "_done").exists():
                    staging = Path(tempfile.mkdtemp(prefix=f"{folder.name}.", dir=root))
                    try:
                        build(tables, staging)
                        (staging / "_done").write_text(key)
                        shutil.rmtree(folder, ignore_errors=True)
                        os.rename(staging, folder)
                    finally:
                        shutil.rmtree(staging, ignore_errors=True)
        return cls(folder)

    def row_of(self, doc_ids: Iterable[str]) -> dict[str, int]:
        """{doc_id: docs row} of the given ids that the docs table holds."""
        ids = list(dict.fromkeys(doc_ids))
        if not ids:
            return {}
        rows = _resolve_rows(pa.array(ids, pa.string()), self.hashes, self.rows, self._ids)
        return {doc_id: row for doc_id, row in zip(ids, rows.tolist()) if row >= 0}

    def lookup(
        self, doc_ids: Iterable[str]
    ) -> tuple[dict[str, tuple[str, list[str]]], dict[str, list[tuple[str, str, int]]]]:
        """(docs, links) of the given ids: doc_id -> (title, sentences) for those the table holds, and
        src doc_id -> [(target doc_id, anchor, sentence)] for the links between two of them (no self-links),
        in the links table's order."""
        found = self.row_of(doc_ids)
        if not found:
            return {}, {}
        rows = np.fromiter(found.values(), dtype=np.int64, count=len(found))
        picked = take_rows(self.docs.select(DOC_COLUMNS[1:]), rows)
        docs = dict(zip(found, zip(picked.column("title").to_pylist(), picked.column("sentences").to_pylist())))
        starts, ends = self.offsets[rows], self.offsets[rows + 1]
        counts = ends - starts
        if not counts.sum():
            return docs, {}
        # every link of the wanted rows, then only those whose target is wanted too
        positions = np.repeat(starts - np.cumsum(counts) + counts, counts) + np.arange(counts.sum())
        sources = np.repeat(rows, counts)
        targets = take_rows(self.links.select(["target"]), positions).column("target").to_numpy()
        keep = np.isin(targets, rows)
        if not keep.any():
            return docs, {}
        kept = take_rows(self.links, positions[keep])
        id_of = {row: doc_id for doc_id, row in found.items()}
        links: dict[str, list[tuple[str, str, int]]] = {}
        for src, dst, anchor, sentence in zip(
            sources[keep].tolist(),
            kept.column("target").to_pylist(),
            kept.column("anchor").to_pylist(),
            kept.column("sentence").to_pylist(),
        ):
            links.setdefault(id_of[src], []).append((id_of[dst], anchor, sentence))
        return docs, links


def take_rows(table: pa.Table, rows: np.ndarray) -> pa.Table:
    """`table.take(rows)` a record batch at a time: Arrow's take over a chunked column joins its chunks
    first, a copy of the whole column per call (the store's files are mapped in batches of rows)."""
    rows = np.asarray(rows, dtype=np.int64)
    batches = table.to_batches()
    if len(batches) <= 1 or not len(rows):
        return table.take(pa.array(rows, pa.int64()))
    bounds = np.cumsum([0, *(b.num_rows for b in batches)])
    batch_of = np.searchsorted(bounds, rows, side="right") - 1
    order = np.argsort(batch_of, kind="stable")  # grouped by batch
    sorted_batches = batch_of[order]
    starts = np.searchsorted(sorted_batches, np.arange(len(batches) + 1))
    parts = [
        batches[b].take(pa.array(rows[order[starts[b] : starts[b + 1]]] - bounds[b], pa.int64()))
        for b in np.unique(sorted_batches).tolist()
    ]
    picked = pa.Table.from_batches(parts, schema=table.schema).combine_chunks()  # only the rows taken
    back = np.empty(len(rows), np.int64)
    back[order] = np.arange(len(rows))
    return picked.take(pa.array(back))


def _take_column(column: pa.ChunkedArray, rows: np.ndarray) -> pa.ChunkedArray | pa.Array:
    return take_rows(pa.table({"value": column}), rows).column("value")


def _files(tables: Location) -> list:
    """(path, size, modification time) of the docs and links tables' files: what names a copy."""
    fs, root = tables.fs_path()
    out = []
    for table in ("docs", "links"):
        infos = fs.get_file_info(pafs.FileSelector(f"{root}/{table}", recursive=True, allow_not_found=True))
        out += sorted((i.path, i.size, i.mtime_ns) for i in infos if i.type == pafs.FileType.File)
    return out


def _resolve_rows(ids: pa.Array, hashes: np.ndarray, rows: np.ndarray, doc_ids: pa.ChunkedArray) -> np.ndarray:
    """The docs row of each id (-1 for an id that is no doc, or a null one), vectorised."""
    out = np.full(len(ids), -1, dtype=np.int64)
    valid = ~np.asarray(ids.is_null().to_numpy(zero_copy_only=False), dtype=bool)
    if not valid.any() or not len(hashes):
        return out
    present = ids.filter(pa.array(valid))
    wanted = hash_ids(present)
    left = np.searchsorted(hashes, wanted, side="left")
    right = np.searchsorted(hashes, wanted, side="right")
    result = np.full(len(present), -1, dtype=np.int64)
    single = right - left == 1
    if single.any():
        candidate = rows[left[single]]
        same = np.asarray(
            pc.equal(_take_column(doc_ids, candidate), present.filter(pa.array(single))).to_numpy(zero_copy_only=False),
            dtype=bool,
        )
        result[np.flatnonzero(single)[same]] = candidate[same]
    for k in np.flatnonzero(right - left > 1):  # a hash collision: compare the ids themselves
        text = present[int(k)].as_py()
        for j in range(left[k], right[k]):
            if doc_ids[int(rows[j])].as_py() == text:
                result[k] = rows[j]
                break
    out[np.flatnonzero(valid)] = result
    return out


def build(tables: str | Location, folder: str | Path, batch_rows: int = 65536) -> None:
    """Write the store's files (module docstring) for the tables at `tables` into `folder`, reading
    each table once, a batch at a time."""
    folder = Path(folder)
    fs, root = located(tables).fs_path()
    docs_schema = pa.schema([("doc_id", pa.string()), ("title", pa.string()), ("sentences", pa.list_(pa.string()))])
    hashes = []
    with pa.OSFile(str(folder / "docs.arrow"), "wb") as sink, pa.ipc.new_file(sink, docs_schema) as writer:
        dataset = pads.dataset(f"{root}/docs", filesystem=fs, format="parquet")
        for batch in dataset.to_batches(columns=DOC_COLUMNS, batch_size=batch_rows):
            batch = pa.RecordBatch.from_arrays([batch.column(c) for c in DOC_COLUMNS], schema=docs_schema)
            writer.write_batch(batch)
            hashes.append(hash_ids(batch.column("doc_id")))
    all_hashes = np.concatenate(hashes) if hashes else np.zeros(0, dtype=np.uint64)
    order = np.argsort(all_hashes, kind="stable")
    np.save(folder / "hashes.npy", all_hashes[order])
    np.save(folder / "rows.npy", order.astype(np.int64))
    del hashes, all_hashes
    store_docs = pa.ipc.open_file(pa.memory_map(str(folder / "docs.arrow"))).read_all()
    sorted_hashes = np.load(folder / "hashes.npy", mmap_mode="r")
    doc_ids = store_docs.column("doc_id")

    # links: resolved to docs rows batch by batch into an unsorted file, then grouped by source row
    sources = []
    unsorted = folder / "links.unsorted.arrow"
    with pa.OSFile(str(unsorted), "wb") as sink, pa.ipc.new_file(sink, LINK_SCHEMA) as writer:
        dataset = pads.dataset(f"{root}/links", filesystem=fs, format="parquet")
        columns = ["src_doc_id", "target_doc_id", "anchor", "sentence"]
        for batch in dataset.to_batches(columns=columns, batch_size=batch_rows):
            src = _resolve_rows(batch.column("src_doc_id"), sorted_hashes, order, doc_ids)
            dst = _resolve_rows(batch.column("target_doc_id"), sorted_hashes, order, doc_ids)
            keep = (src >= 0) & (dst >= 0) & (src != dst)  # a link to a page outside the corpus, or to itself
            if not keep.any():
                continue
            mask = pa.array(keep)
            writer.write_batch(
                pa.RecordBatch.from_arrays(
                    [
                        pa.array(dst[keep]),
                        batch.column("anchor").filter(mask),
                        batch.column("sentence").filter(mask).cast(pa.int32()),
                    ],
                    schema=LINK_SCHEMA,
                )
            )
            sources.append(src[keep])
    src_rows = np.concatenate(sources) if sources else np.zeros(0, dtype=np.int64)
    by_source = np.argsort(src_rows, kind="stable")  # grouped by source, the table's order within a group
    np.save(folder / "offsets.npy", np.searchsorted(src_rows[by_source], np.arange(len(store_docs) + 1)))
    links = pa.ipc.open_file(pa.memory_map(str(unsorted))).read_all()
    with pa.OSFile(str(folder / "links.arrow"), "wb") as sink, pa.ipc.new_file(sink, LINK_SCHEMA) as writer:
        for start in range(0, len(by_source), batch_rows):
            writer.write_table(links.take(pa.array(by_source[start : start + batch_rows])))
    del links
    unsorted.unlink()
