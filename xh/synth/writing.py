"""Writing a world: shard by shard, through a caller-supplied `open_output`.

    from xh.synth import WorldSpec, write_world, output_under
    summary = write_world(WorldSpec(num_docs=2000), output_under("/tmp/synth-world"))

`write_shard` writes pages `[shard * docs_per_shard, ...)` and depends on nothing but the spec,
so `workflows/synth.py` runs the shards in parallel on Ray, then `write_tasks_and_summary`.
"""

from __future__ import annotations

import bz2
import json
import queue
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import IO, TYPE_CHECKING

from xh.synth.claims import make_claims
from xh.synth.formats import fever_page_record, hotpot_record, link_rows
from xh.synth.layout import WorldSpec, kind_counts
from xh.synth.pages import page
from xh.synth.questions import make_questions

if TYPE_CHECKING:
    from xh.storage.store import Location

OpenOutput = Callable[[str], AbstractContextManager[IO[bytes]]]


def output_under(root: str | Location) -> OpenOutput:
    """An `open_output` writing under a Location, or a storage URI (local folder or s3://bucket/prefix)
    reached with the environment's S3 settings."""
    from xh.storage.store import located

    return partial(_open_under, located(root))


def _open_under(root: Location, relative_path: str):
    return root.join(relative_path).open_output()


def wiki_shard_path(shard: int) -> str:
    """wiki/AA/wiki_00.bz2 ... wiki/AA/wiki_99.bz2, wiki/AB/wiki_00.bz2 ...: 100 shards a folder."""
    folder = shard // 100
    if folder >= 26 * 26:
        raise ValueError(f"shard {shard} is past the last folder (ZZ)")
    return f"wiki/{chr(65 + folder // 26)}{chr(65 + folder % 26)}/wiki_{shard % 100:02d}.bz2"


def links_shard_path(shard: int) -> str:
    return f"truth/links/links-{shard:05d}.jsonl.bz2"


def fever_pages_path(shard: int) -> str:
    return f"fever/wiki-pages/wiki-{shard:03d}.jsonl"


QUESTIONS_PATH = "hotpot/questions.json"
CLAIMS_PATH = "fever/claims.jsonl"
SUMMARY_PATH = "truth/summary.json"


@dataclass
class WorldSummary:
    """What `write_world` wrote: counts and the paths relative to the output root."""

    num_docs: int
    seed: int
    docs_by_kind: dict
    num_links: int
    num_shards: int
    docs_per_shard: int
    num_questions: dict = field(default_factory=dict)  # by type, and "total"
    num_claims: dict = field(default_factory=dict)  # by label, and "total"
    paths: dict = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)


BZ2_LEVEL = 9  # bz2's default; levels 1-5 are only 10-25 % faster and compress worse


class _Bz2Lines:
    """Writes lines bz2-compressed into an open binary file, a chunk at a time.

    Compression runs in a helper thread: bz2 releases the GIL, so pages are generated while the
    previous chunk is compressed. At most `max_waiting` chunks wait, so memory stays bounded.
    Use as a context manager; leaving it finishes the stream (or, on error, just stops).
    """

    def __init__(self, raw: IO[bytes], chunk_bytes: int = 1 << 20, max_waiting: int = 3) -> None:
        self.raw, self.chunk_bytes = raw, chunk_bytes
        self.lines: list[str] = []
        self.pending = 0
        self.error: BaseException | None = None
        self.aborted = False
        self.chunks: queue.Queue = queue.Queue(maxsize=max_waiting)
        self.worker = threading.Thread(target=self._compress, name="synth-bz2", daemon=True)
        self.worker.start()

    def _compress(self) -> None:
        compressor = bz2.BZ2Compressor(BZ2_LEVEL)
        while True:
            chunk = self.chunks.get()
            if chunk is None:
                break
            if self.error is None:
                try:
                    self.raw.write(compressor.compress(chunk))
                except BaseException as error:  # reported by close(); keep draining so put() never blocks
                    self.error = error
        if self.error is None and not self.aborted:
            try:
                self.raw.write(compressor.flush())
            except BaseException as error:
                self.error = error

    def write(self, line: str) -> None:
        self.lines.append(line)
        self.pending += len(line)
        if self.pending >= self.chunk_bytes:
            self._hand_over()

    def _hand_over(self) -> None:
        if self.lines:
            self.lines.append("")
            self.chunks.put("\n".join(self.lines).encode("utf-8"))
            self.lines, self.pending = [], 0

    def __enter__(self) -> _Bz2Lines:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.aborted = exc_type is not None
        if not self.aborted:
            self._hand_over()
        self.chunks.put(None)
        self.worker.join()
        if self.error is not None and not self.aborted:
            raise self.error


_JSON = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


def _default_questions(num_docs: int) -> int:
    return min(5_000, max(10, num_docs // 10))


@dataclass
class ShardSummary:
    """What one shard of pages wrote (paths relative to the output root)."""

    shard: int
    wiki: str
    fever_pages: str | None
    links: str
    num_links: int


def num_shards(spec: WorldSpec, docs_per_shard: int) -> int:
    if docs_per_shard < 1:
        raise ValueError(f"docs_per_shard must be >= 1, got {docs_per_shard}")
    return -(-spec.num_docs // docs_per_shard)


def write_shard(
    spec: WorldSpec, shard: int, open_output: OpenOutput, *, docs_per_shard: int = 10_000, fever_pages: bool = True
) -> ShardSummary:
    """Write pages `[shard * docs_per_shard, ...)`: their HotpotQA shard, FEVER pages and true links.

    Shards depend on nothing but the spec, so they can be written in any order, in parallel.
    """
    start, stop = shard * docs_per_shard, min(spec.num_docs, (shard + 1) * docs_per_shard)
    wiki_path, links_path = wiki_shard_path(shard), links_shard_path(shard)
    fever_lines = []
    num_links = 0
    with (
        open_output(wiki_path) as wiki_raw,
        _Bz2Lines(wiki_raw) as wiki_out,
        open_output(links_path) as links_raw,
        _Bz2Lines(links_raw) as links_out,
    ):
        for i in range(start, stop):
            p = page(spec, i)
            wiki_out.write(_JSON(hotpot_record(p)))
            for row in link_rows(p):
                links_out.write(_JSON(row))
            num_links += len(p.links)
            if fever_pages:
                fever_lines.append(_JSON(fever_page_record(p)))
    fever_path = fever_pages_path(shard) if fever_pages else None
    if fever_path:
        with open_output(fever_path) as fever_raw:
            fever_raw.write(("\n".join(fever_lines) + "\n").encode("utf-8"))
    return ShardSummary(shard, wiki_path, fever_path, links_path, num_links)


def write_tasks_and_summary(
    spec: WorldSpec,
    open_output: OpenOutput,
    shards: list[ShardSummary],
    *,
    docs_per_shard: int,
    num_questions: int | None = None,
    num_claims: int | None = None,
    question_seed: int = 0,
    comparison_fraction: float = 0.2,
) -> WorldSummary:
    """After the shards: the questions, the claims and the summary (they touch only the pages they need)."""
    questions = make_questions(
        spec,
        _default_questions(spec.num_docs) if num_questions is None else num_questions,
        seed=question_seed,
        comparison_fraction=comparison_fraction,
    )
    with open_output(QUESTIONS_PATH) as f:
        f.write(json.dumps(questions).encode("utf-8"))
    claims = make_claims(
        spec, _default_questions(spec.num_docs) if num_claims is None else num_claims, seed=question_seed
    )
    with open_output(CLAIMS_PATH) as f:
        f.write("".join(json.dumps(c) + "\n" for c in claims).encode("utf-8"))

    by_type: dict[str, int] = {"total": len(questions)}
    for q in questions:
        by_type[q["type"]] = by_type.get(q["type"], 0) + 1
    by_label: dict[str, int] = {"total": len(claims)}
    for c in claims:
        by_label[c["label"]] = by_label.get(c["label"], 0) + 1
    shards = sorted(shards, key=lambda s: s.shard)
    summary = WorldSummary(
        num_docs=spec.num_docs,
        seed=spec.seed,
        docs_by_kind=kind_counts(spec),
        num_links=sum(s.num_links for s in shards),
        num_shards=len(shards),
        docs_per_shard=docs_per_shard,
        num_questions=by_type,
        num_claims=by_label,
        paths={
            "wiki": [s.wiki for s in shards],
            "fever_pages": [s.fever_pages for s in shards if s.fever_pages],
            "questions": QUESTIONS_PATH,
            "claims": CLAIMS_PATH,
            "links": [s.links for s in shards],
            "summary": SUMMARY_PATH,
        },
    )
    with open_output(SUMMARY_PATH) as f:
        f.write(summary.to_json().encode("utf-8"))
    return summary


def write_world(
    spec: WorldSpec,
    open_output: OpenOutput,
    *,
    docs_per_shard: int = 10_000,
    num_questions: int | None = None,
    num_claims: int | None = None,
    fever_pages: bool = True,
    question_seed: int = 0,
    comparison_fraction: float = 0.2,
) -> WorldSummary:
    """Write the whole world in this process, one shard at a time; returns a `WorldSummary`.

    Memory does not grow with the size. `workflows/synth.py` writes the shards in parallel on Ray.
    `num_questions` / `num_claims` default to a tenth of the pages (at least 10, at most 5,000).
    """
    shards = [
        write_shard(spec, k, open_output, docs_per_shard=docs_per_shard, fever_pages=fever_pages)
        for k in range(num_shards(spec, docs_per_shard))
    ]
    return write_tasks_and_summary(
        spec,
        open_output,
        shards,
        docs_per_shard=docs_per_shard,
        num_questions=num_questions,
        num_claims=num_claims,
        question_seed=question_seed,
        comparison_fraction=comparison_fraction,
    )
