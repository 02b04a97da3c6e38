"""Wikipedia dump -> docs / links / redirects / anchors / quarantine tables, on Ray Data.

    python -m workflows.wiki --config configs/demo.yaml \\
        --set wiki.format=mediawiki --set 'wiki.inputs=[../shared/data/wiki]'
    xh wiki process --format hotpot --input runs/demo/world/wiki --output runs/demo/tables

The steps are the library's (`xh.wiki.process`: what each does and why it is partitioned); this
driver spreads them over Ray Data workers:

1. the input files over an actor pool of `wiki.workers` readers (`stage_file`, one file per call);
   the driver sees one small counts row per file, never the corpus;
2. the `wiki.partitions` hash partitions as Ray tasks, in three rounds (`resolve_titles`,
   `resolve_links`, `count_anchors`), then the rare docs files holding a later copy of a doc id.

Prints one JSON summary line: records, docs, redirects, links, quarantined (and more);
`records == docs + redirects + quarantined` holds, or the run fails.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

from workflows.common import init_ray, log, main, s3_settings
from xh.config import XHConfig
from xh.storage import join, open_output
from xh.tables import WIKI_TABLES, staged
from xh.wiki import process


class _FileReader:
    """Ray Data actor: one dump file per call -> its counts row (the rows themselves go to storage)."""

    def __init__(self, fmt: str, output: str, partitions: int, rows_per_file: int, s3):
        self.args = (output, partitions, rows_per_file, s3)
        self.fmt = fmt

    def __call__(self, batch: dict) -> dict:
        rows = [
            process.stage_file(self.fmt, str(path), int(index), *self.args)
            for path, index in zip(batch["path"], batch["file_index"])
        ]
        return {key: [row[key] for row in rows] for key in rows[0]}


def _over(items: list, fn: Callable, cpus: float) -> list:
    """`fn(item)` for each item as a Ray task; the results are small. (Plain tasks: a Ray Data
    execution per round would cost a second of start-up for a handful of partitions.)"""
    import ray

    task = ray.remote(num_cpus=cpus)(fn)
    return ray.get([task.remote(item) for item in items])


def run(cfg: XHConfig) -> dict:
    wiki, s3 = cfg.wiki, s3_settings(cfg)
    output = wiki.output or join(cfg.storage.root, "tables")
    files = process.input_files(wiki.inputs, wiki.format, s3)
    # built in a staging sibling, swapped into place with its `_complete.json` only when whole
    with staged(output, s3, kind=WIKI_TABLES, stage="wiki", inputs={"format": wiki.format, "files": files}) as stage:
        summary = _process(cfg, files, stage.uri, s3)
        summary["output"] = output
        with open_output(join(stage.uri, "_summary.json"), s3) as f:
            f.write(json.dumps(summary, indent=1).encode())
        stage.rows = summary["docs"]
    return summary


def _process(cfg: XHConfig, files: list[str], output: str, s3) -> dict:
    import ray.data
    from ray.data import ActorPoolStrategy

    wiki = cfg.wiki
    process.clear_output(output, s3)
    init_ray(cfg)
    start = time.perf_counter()

    log(
        "wiki", f"reading {len(files)} {wiki.format} file(s) with {min(wiki.workers, len(files))} worker(s) -> {output}"
    )
    items = [{"path": path, "file_index": index} for index, path in enumerate(files)]
    per_file = (
        ray.data.from_items(items, override_num_blocks=len(items))
        .map_batches(
            _FileReader,
            batch_size=1,
            compute=ActorPoolStrategy(size=min(wiki.workers, len(files))),
            num_cpus=wiki.cpus_per_worker,
            fn_constructor_args=(wiki.format, output, wiki.partitions, wiki.rows_per_file, s3),
        )
        .take_all()
    )
    read_seconds = time.perf_counter() - start
    log("wiki", f"read {sum(f['records'] for f in per_file):,} records in {read_seconds:.1f} s; resolving titles")

    parts, rows, cpus = wiki.partitions, wiki.rows_per_file, wiki.cpus_per_worker
    titles = _over(range(parts), lambda p: process.resolve_titles(output, p, parts, rows, s3), cpus)
    first_file = {d: f for r in titles for d, f in r["first_file"].items()}  # duplicated ids only: small
    log("wiki", "resolving links")
    links = _over(range(parts), lambda p: process.resolve_links(output, p, parts, rows, first_file, s3), cpus)
    log("wiki", "counting anchors")
    _over(range(parts), lambda p: process.count_anchors(output, p, rows, s3), cpus)
    duplicates = sum(
        process.drop_duplicate_docs(output, k, later, files[k], rows, s3)
        for k, later in process.group_later_copies(titles).items()
    )
    process.finish(output, s3)

    summary = {
        "format": wiki.format,
        **process.summarize(per_file, titles, links, duplicates),
        "read_seconds": round(read_seconds, 3),
        "seconds": round(time.perf_counter() - start, 3),
    }
    return summary


if __name__ == "__main__":
    main("wiki", run)
