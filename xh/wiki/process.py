"""Wikipedia dump files -> the docs / links / redirects / anchors / quarantine tables.

The work comes in two halves, each a set of independent calls that the stage
(`xh.stages.wiki`) spreads over Ray workers, or runs one after the other in its own process
(`local=True`: tests, and the benchmark's baseline):

1. `stage_file` — once per input file: read it with the reader of its format, write its docs and
   quarantined records straight to the output tables, and *stage* what needs the whole corpus:
   doc ids, titles, redirects and links, each hash-partitioned on the key it will be joined on.
2. Once per partition, in three rounds, no shuffle service needed:
   - `resolve_titles(p)`: titles of partition p -> doc ids; redirects whose target falls in p get
     their target doc (written out) and become aliases, re-staged on their own title; doc ids seen in
     several files are found (the copy in the earliest file is kept).
   - `resolve_links(p)`: links whose target title falls in p -> target doc ids (through titles or
     aliases; links to missing pages are kept and flagged); anchor counts staged by surface.
   - `count_anchors(p)`: anchor counts of partition p summed per (surface, doc).
   Then `drop_duplicate_docs(file)` rewrites the (rare) docs files that hold later copies of an id and
   quarantines those copies.

Partitions use crc32 of the key (Python's `hash` differs between processes). Every Parquet file
holds at most `rows_per_file` rows.
"""

from __future__ import annotations

import time
import zlib
from collections import defaultdict
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from xh import schemas
from xh.storage.store import Location
from xh.storage.uris import list_paths
from xh.wiki.readers import read_records
from xh.wiki.records import ReadCounts

TABLES = ("docs", "links", "redirects", "anchors", "quarantine")
STAGING = "_staging"

# What half 1 stages for half 2, and the column each is partitioned on.
STAGED = {
    "ids": pa.schema([("doc_id", pa.string()), ("file_index", pa.int32()), ("position", pa.int64())]),
    "titles": pa.schema([("title", pa.string()), ("doc_id", pa.string())]),
    "redirects": pa.schema([("from_title", pa.string()), ("to_title", pa.string())]),
    "links": pa.schema(
        [
            ("src_doc_id", pa.string()),
            ("target_title", pa.string()),
            ("anchor", pa.string()),
            ("sentence", pa.int32()),
            ("file_index", pa.int32()),
        ]
    ),
    "aliases": pa.schema([("title", pa.string()), ("doc_id", pa.string())]),
    "anchors": schemas.ANCHORS,
}
PARTITION_KEY = {
    "ids": "doc_id",
    "titles": "title",
    "redirects": "to_title",
    "links": "target_title",
    "aliases": "title",
    "anchors": "surface",
}


def bucket(key: str, partitions: int) -> int:
    return zlib.crc32(key.encode("utf-8", "surrogatepass")) % partitions


class TableWriter:
    """Rows (dicts) or Arrow tables -> Parquet files `<folder>/<stem>-NNN.parquet` of at most `rows_per_file` rows."""

    BATCH = 20_000  # rows buffered as Python dicts before they become Arrow

    def __init__(self, fs, folder: str, stem: str, schema: pa.Schema, rows_per_file: int):
        self.fs, self.folder, self.stem, self.schema, self.rows_per_file = fs, folder, stem, schema, rows_per_file
        self.rows: list[dict] = []
        self.writer: pq.ParquetWriter | None = None
        self.in_file = self.parts = self.written = 0

    def add(self, row: dict) -> None:
        self.rows.append(row)
        if len(self.rows) >= self.BATCH:
            self._flush_rows()

    def write(self, table: pa.Table) -> None:
        self._flush_rows()
        table = table.select(self.schema.names).cast(self.schema)
        while table.num_rows:
            if self.writer is None:
                self.fs.create_dir(self.folder, recursive=True)
                path = f"{self.folder}/{self.stem}-{self.parts:03d}.parquet"
                self.writer = pq.ParquetWriter(path, self.schema, filesystem=self.fs, compression="zstd")
                self.parts += 1
            room = self.rows_per_file - self.in_file
            self.writer.write_table(table.slice(0, room))
            self.in_file += min(room, table.num_rows)
            self.written += min(room, table.num_rows)
            table = table.slice(room)
            if self.in_file >= self.rows_per_file:
                self._close_file()

    def _flush_rows(self) -> None:
        if self.rows:
            rows, self.rows = self.rows, []
            self.write(pa.Table.from_pylist(rows, schema=self.schema))

    def _close_file(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer, self.in_file = None, 0

    def close(self) -> None:
        self._flush_rows()
        self._close_file()


class PartitionedWriter:
    """Rows routed to `<folder>/pNNN/<stem>-*.parquet` by the crc32 bucket of one column."""

    def __init__(self, fs, folder: str, stem: str, schema: pa.Schema, key: str, partitions: int, rows_per_file: int):
        self.key, self.partitions = key, partitions
        self.writers = [TableWriter(fs, f"{folder}/p{p:03d}", stem, schema, rows_per_file) for p in range(partitions)]

    def add(self, row: dict) -> None:
        self.writers[bucket(row[self.key], self.partitions)].add(row)

    def close(self) -> None:
        for writer in self.writers:
            writer.close()


def read_folder(fs, folder: str, schema: pa.Schema) -> pa.Table:
    """All Parquet files under a folder as one table; an absent or empty folder is an empty table."""
    try:
        files = [f for f in list_paths(fs, folder) if f.endswith(".parquet")]
    except FileNotFoundError:
        files = []
    if not files:
        return schema.empty_table()
    return pa.concat_tables(pq.read_table(f, filesystem=fs, schema=schema) for f in files)


# --- half 1: one input file --------------------------------------------------------------------


def stage_file(
    fmt: str, source: Location, file_index: int, output: Location, partitions: int, rows_per_file: int
) -> dict[str, Any]:
    """Read one dump file: docs and quarantine rows to the output, the rest staged by partition."""
    start = time.perf_counter()
    uri = source.uri
    fs, root = output.fs_path()
    stem = f"part-{file_index:05d}"
    docs = TableWriter(fs, f"{root}/docs", stem, schemas.DOCS, rows_per_file)
    quarantine = TableWriter(fs, f"{root}/quarantine", stem, schemas.QUARANTINE, rows_per_file)
    staged = {
        name: PartitionedWriter(
            fs, f"{root}/{STAGING}/{name}", stem, STAGED[name], PARTITION_KEY[name], partitions, rows_per_file
        )
        for name in ("ids", "titles", "redirects", "links")
    }
    counts = ReadCounts()
    links = 0
    with source.open_input() as stream:
        for record in read_records(fmt, stream, uri, counts):
            if record.kind == "doc":
                docs.add(record.row())
                staged["ids"].add({"doc_id": record.doc_id, "file_index": file_index, "position": counts.records})
                staged["titles"].add({"title": record.title, "doc_id": record.doc_id})
                for link in record.link_rows():
                    staged["links"].add({**link, "file_index": file_index})
                links += len(record.links)
            elif record.kind == "redirect":
                staged["redirects"].add(record.row())
            else:
                quarantine.add(record.row())
    for writer in (docs, quarantine, *staged.values()):
        writer.close()
    if not counts.balanced:  # a reader bug, not bad input: fail loudly rather than lose records
        raise RuntimeError(f"{uri}: records {counts.records} != docs + redirects + quarantined ({counts})")
    return {
        "path": uri,
        "file_index": file_index,
        "records": counts.records,
        "skipped": counts.skipped,
        "docs": counts.docs,
        "redirects": counts.redirects,
        "quarantined": counts.quarantined,
        "links": links,
        "seconds": time.perf_counter() - start,
    }


# --- half 2: one partition at a time ----------------------------------------------------------


def _staged(fs, root: str, name: str, p: int) -> pa.Table:
    return read_folder(fs, f"{root}/{STAGING}/{name}/p{p:03d}", STAGED[name])


def _first_by(table: pa.Table, key: str, value: str) -> dict[str, str]:
    """key -> smallest value (one doc per title, however many ids share it)."""
    grouped = table.group_by(key).aggregate([(value, "min")])
    return dict(zip(grouped[key].to_pylist(), grouped[f"{value}_min"].to_pylist()))


def resolve_titles(output: Location, p: int, partitions: int, rows_per_file: int) -> dict:
    """Round 1 for partition p: duplicate doc ids, and redirects -> target docs (written) and aliases (staged)."""
    fs, root = output.fs_path()
    ids = _staged(fs, root, "ids", p)
    per_id = ids.group_by("doc_id").aggregate([("file_index", "min"), ("file_index", "count")])
    repeated = per_id.filter(pc.greater(per_id["file_index_count"], 1))
    first_file = dict(zip(repeated["doc_id"].to_pylist(), repeated["file_index_min"].to_pylist()))
    later = [
        (d, f, pos)
        for d, f, pos in zip(*(ids[c].to_pylist() for c in ("doc_id", "file_index", "position")))
        if d in first_file and f != first_file[d]
    ]

    doc_of = _first_by(_staged(fs, root, "titles", p), "title", "doc_id")
    redirects = _staged(fs, root, "redirects", p)
    to_doc = pa.array([doc_of.get(t) for t in redirects["to_title"].to_pylist()], pa.string())
    redirects = redirects.append_column("to_doc_id", to_doc)
    out = TableWriter(fs, f"{root}/redirects", f"part-{p:05d}", schemas.REDIRECTS, rows_per_file)
    out.write(redirects)
    out.close()
    aliases = PartitionedWriter(
        fs, f"{root}/{STAGING}/aliases", f"part-{p:05d}", STAGED["aliases"], "title", partitions, rows_per_file
    )
    for title, doc_id in zip(redirects["from_title"].to_pylist(), to_doc.to_pylist()):
        if doc_id is not None:
            aliases.add({"title": title, "doc_id": doc_id})
    aliases.close()
    return {
        "later_copies": later,  # (doc_id, file_index, position) of copies to drop: rare, small
        "first_file": first_file,
        "redirects": redirects.num_rows,
        "redirects_unresolved": to_doc.null_count,
    }


def resolve_links(output: Location, p: int, partitions: int, rows_per_file: int, first_file: dict[str, int]) -> dict:
    """Round 2 for partition p: link targets -> doc ids (written); anchor counts staged by surface."""
    fs, root = output.fs_path()
    doc_of = _first_by(_staged(fs, root, "aliases", p), "title", "doc_id")
    doc_of.update(_first_by(_staged(fs, root, "titles", p), "title", "doc_id"))  # a page beats a redirect
    links = _staged(fs, root, "links", p)
    if first_file:  # links written by a later copy of a duplicated doc go with it
        keep = [
            first_file.get(d, f) == f for d, f in zip(links["src_doc_id"].to_pylist(), links["file_index"].to_pylist())
        ]
        links = links.filter(pa.array(keep, pa.bool_()))
    target = pa.array([doc_of.get(t) for t in links["target_title"].to_pylist()], pa.string())
    links = links.append_column("target_doc_id", target).append_column("missing", pc.is_null(target))
    out = TableWriter(fs, f"{root}/links", f"part-{p:05d}", schemas.LINKS, rows_per_file)
    out.write(links)
    out.close()

    found = links.filter(pc.invert(links["missing"]))
    surfaces = pc.utf8_lower(pc.utf8_trim_whitespace(found["anchor"]))
    pairs = pa.table({"surface": surfaces, "doc_id": found["target_doc_id"]})
    pairs = pairs.filter(pc.not_equal(pairs["surface"], ""))
    counted = (
        pairs.group_by(["surface", "doc_id"])
        .aggregate([("doc_id", "count")])
        .rename_columns(["surface", "doc_id", "count"])
    )
    anchors = PartitionedWriter(
        fs, f"{root}/{STAGING}/anchors", f"part-{p:05d}", STAGED["anchors"], "surface", partitions, rows_per_file
    )
    for row in counted.to_pylist():
        anchors.add(row)
    anchors.close()
    return {"links": links.num_rows, "missing_links": target.null_count}


def count_anchors(output: Location, p: int, rows_per_file: int) -> dict:
    """Round 3 for partition p: anchor counts summed per (surface, doc)."""
    fs, root = output.fs_path()
    partial = _staged(fs, root, "anchors", p)
    total = (
        partial.group_by(["surface", "doc_id"])
        .aggregate([("count", "sum")])
        .rename_columns(["surface", "doc_id", "count"])
    )
    out = TableWriter(fs, f"{root}/anchors", f"part-{p:05d}", schemas.ANCHORS, rows_per_file)
    out.write(total.sort_by([("surface", "ascending"), ("count", "descending")]))
    out.close()
    return {"anchors": total.num_rows}


def drop_duplicate_docs(
    output: Location, file_index: int, later: list[tuple[str, int]], source: str, rows_per_file: int
) -> int:
    """Rewrite the docs of one input file without the later copies `later` [(doc_id, position)]; quarantine them."""
    fs, root = output.fs_path()
    stem = f"part-{file_index:05d}"
    paths = [p for p in list_paths(fs, f"{root}/docs") if p.rsplit("/", 1)[-1].startswith(stem)]
    docs = pa.concat_tables(pq.read_table(p, filesystem=fs, schema=schemas.DOCS) for p in paths)
    drop = {doc_id for doc_id, _ in later}
    docs = docs.filter(pc.invert(pc.is_in(docs["doc_id"], pa.array(sorted(drop), pa.string()))))
    for path in paths:
        fs.delete_file(path)
    out = TableWriter(fs, f"{root}/docs", stem, schemas.DOCS, rows_per_file)
    out.write(docs)
    out.close()
    quarantine = TableWriter(
        fs, f"{root}/quarantine", f"duplicates-{file_index:05d}", schemas.QUARANTINE, rows_per_file
    )
    for doc_id, position in sorted(later, key=lambda x: x[1]):
        quarantine.add(
            {
                "source": source,
                "position": position,
                "reason": "duplicate id: first seen in an earlier file",
                "raw": doc_id[: schemas.RAW_LIMIT],
            }
        )
    quarantine.close()
    return len(later)


def group_later_copies(rounds: list[dict]) -> dict[int, list[tuple[str, int]]]:
    """file_index -> [(doc_id, position)] of later copies, from every partition's round-1 result."""
    by_file: dict[int, list[tuple[str, int]]] = defaultdict(list)
    for result in rounds:
        for doc_id, file_index, position in result["later_copies"]:
            by_file[file_index].append((doc_id, position))
    return dict(by_file)


def input_files(inputs: list[Location], fmt: str) -> list[Location]:
    """The files of a dump: each input is a file or a folder (searched recursively; hidden files skipped)."""
    if not inputs:
        raise FileNotFoundError("no input given: set wiki.inputs (or pass --input)")
    files: list[Location] = []
    for where in inputs:
        found = [f for f in where.files() if not f.rsplit("/", 1)[-1].startswith((".", "_"))]
        if not found:
            raise FileNotFoundError(f"no {fmt} dump files under {where}")
        files.extend(where.store.at(f) for f in found)
    return files


def clear_output(output: Location) -> None:
    """A run replaces the tables it writes (and any staging left by a failed run)."""
    fs, root = output.fs_path()
    for name in (*TABLES, STAGING):
        fs.create_dir(f"{root}/{name}", recursive=True)
        fs.delete_dir_contents(f"{root}/{name}")


def finish(output: Location) -> None:
    """Drop the staging area; a table that got no rows still gets one empty file, so it can be read."""
    fs, root = output.fs_path()
    fs.delete_dir(f"{root}/{STAGING}")
    for name in TABLES:
        if not list_paths(fs, f"{root}/{name}"):
            pq.write_table(schemas.TABLES[name].empty_table(), f"{root}/{name}/empty.parquet", filesystem=fs)


def summarize(files: list[dict], titles: list[dict], links: list[dict], duplicates: int) -> dict:
    """The run's counts; `records == docs + redirects + quarantined` is checked here."""
    total = {k: sum(f[k] for f in files) for k in ("records", "skipped", "docs", "redirects", "quarantined", "links")}
    summary = {
        "files": len(files),
        "records": total["records"],
        "skipped": total["skipped"],
        "docs": total["docs"] - duplicates,
        "redirects": total["redirects"],
        "links": sum(r["links"] for r in links),
        "missing_links": sum(r["missing_links"] for r in links),
        "redirects_unresolved": sum(r["redirects_unresolved"] for r in titles),
        "quarantined": total["quarantined"] + duplicates,
        "duplicate_ids": duplicates,
    }
    if summary["records"] != summary["docs"] + summary["redirects"] + summary["quarantined"]:
        raise RuntimeError(f"records lost: {summary}")
    return summary
