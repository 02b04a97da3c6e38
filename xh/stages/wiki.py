"""Wikipedia dump -> docs / links / redirects / anchors / quarantine tables, on Ray.

    store = Store.from_config(cfg)
    summary = wiki.run(cfg, store)                     # on the Ray cluster the caller joined
    wiki.write_tables(store.at("out"), [store.at("dump")], "hotpot", partitions=2, local=True)  # no Ray

The steps are the library's (`xh.wiki.process`: what each does and why it is partitioned); this
module is their one sequence, spread over Ray workers or, with `local=True`, run one after the other
in this process (tests, the benchmark's baseline):

1. the input files over an actor pool of `workers` readers (`stage_file`, one file per call);
   the caller sees one small counts row per file, never the corpus;
2. the `partitions` hash partitions as Ray tasks, in three rounds (`resolve_titles`,
   `resolve_links`, `count_anchors`), then the rare docs files holding a later copy of a doc id.

The summary counts records, docs, redirects, links, quarantined (and more);
`records == docs + redirects + quarantined` holds, or the run fails.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable

from xh.config import XHConfig
from xh.storage import locations
from xh.storage.store import Location, Store
from xh.storage.tables import WIKI_TABLES
from xh.wiki import process

log = logging.getLogger("xh.wiki").info

TIMINGS = ("read_seconds", "seconds")  # the summary's keys that differ from run to run


def check(cfg: XHConfig, store: Store) -> None:
    """What stops the stage before any Ray work, in one line: no dump, a missing one, or an output folder
    the stage may not replace."""
    process.input_files([store.at(uri) for uri in cfg.wiki.inputs], cfg.wiki.format)
    store.at(locations.tables(cfg, cfg.wiki.output)).check_replaceable(WIKI_TABLES)


def run(cfg: XHConfig, store: Store, *, local: bool = False) -> dict:
    """The tables of `cfg.wiki` at `wiki.output` (default `<storage.root>/tables`)."""
    w = cfg.wiki
    return write_tables(
        store.at(locations.tables(cfg, w.output)),
        [store.at(uri) for uri in w.inputs],
        w.format,
        partitions=w.partitions,
        rows_per_file=w.rows_per_file,
        workers=w.workers,
        cpus_per_worker=w.cpus_per_worker,
        local=local,
    )


def write_tables(
    output: Location,
    inputs: list[Location],
    fmt: str,
    *,
    partitions: int = 8,
    rows_per_file: int = 250_000,
    workers: int = 2,
    cpus_per_worker: float = 1.0,
    local: bool = False,
) -> dict:
    """Every step, from the dump files or folders `inputs` to the tables at `output`; returns the summary.

    Built in a staging sibling and swapped into place with its `_complete.json` (`xh.storage.tables.staged`):
    a run that fails leaves the previous tables as they were."""
    files = process.input_files(inputs, fmt)
    fingerprint = {"format": fmt, "files": [f.uri for f in files]}
    with output.staged(kind=WIKI_TABLES, stage="wiki", inputs=fingerprint) as stage:
        where = stage.location
        start = time.perf_counter()
        process.clear_output(where)
        log(f"reading {len(files)} {fmt} file(s) with {1 if local else min(workers, len(files))} worker(s) -> {output}")
        read = _read_local if local else _read_on_ray
        per_file = read(fmt, files, where, partitions, rows_per_file, workers, cpus_per_worker)
        read_seconds = time.perf_counter() - start
        log(f"read {sum(f['records'] for f in per_file):,} records in {read_seconds:.1f} s; resolving titles")

        over = _over_local if local else _over_on_ray
        titles = over(
            range(partitions), lambda p: process.resolve_titles(where, p, partitions, rows_per_file), cpus_per_worker
        )
        first_file = {d: f for r in titles for d, f in r["first_file"].items()}  # duplicated ids only: small
        log("resolving links")
        links = over(
            range(partitions),
            lambda p: process.resolve_links(where, p, partitions, rows_per_file, first_file),
            cpus_per_worker,
        )
        log("counting anchors")
        over(range(partitions), lambda p: process.count_anchors(where, p, rows_per_file), cpus_per_worker)
        duplicates = sum(
            process.drop_duplicate_docs(where, k, later, files[k].uri, rows_per_file)
            for k, later in process.group_later_copies(titles).items()
        )
        process.finish(where)
        summary = {
            "format": fmt,
            **process.summarize(per_file, titles, links, duplicates),
            "read_seconds": round(read_seconds, 3),
            "seconds": round(time.perf_counter() - start, 3),
            "output": output.uri,
        }
        where.join("_summary.json").write_bytes(json.dumps(summary, indent=1).encode())
        stage.rows = summary["docs"]
    return summary


def _read_local(fmt, files, output, partitions, rows_per_file, workers, cpus) -> list[dict]:
    return [process.stage_file(fmt, f, k, output, partitions, rows_per_file) for k, f in enumerate(files)]


class _FileReader:
    """Ray Data actor: one dump file per call -> its counts row (the rows themselves go to storage)."""

    def __init__(self, fmt: str, output: Location, partitions: int, rows_per_file: int):
        self.fmt, self.output, self.args = fmt, output, (output, partitions, rows_per_file)

    def __call__(self, batch: dict) -> dict:
        rows = [
            process.stage_file(self.fmt, self.output.store.at(str(path)), int(k), *self.args)
            for path, k in zip(batch["path"], batch["file_index"])
        ]
        return {key: [row[key] for row in rows] for key in rows[0]}


def _read_on_ray(fmt, files, output, partitions, rows_per_file, workers, cpus) -> list[dict]:
    import ray.data
    from ray.data import ActorPoolStrategy

    items = [{"path": f.uri, "file_index": k} for k, f in enumerate(files)]
    return (
        ray.data.from_items(items, override_num_blocks=len(items))
        .map_batches(
            _FileReader,
            batch_size=1,
            compute=ActorPoolStrategy(size=min(workers, len(files))),
            num_cpus=cpus,
            fn_constructor_args=(fmt, output, partitions, rows_per_file),
        )
        .take_all()
    )


def _over_local(items, fn: Callable, cpus: float) -> list:
    return [fn(item) for item in items]


def _over_on_ray(items, fn: Callable, cpus: float) -> list:
    """`fn(item)` for each item as a Ray task; the results are small. (Plain tasks: a Ray Data
    execution per round would cost a second of start-up for a handful of partitions.)"""
    import ray

    task = ray.remote(num_cpus=cpus)(fn)
    return ray.get([task.remote(item) for item in items])
