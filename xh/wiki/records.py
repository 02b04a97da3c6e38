"""What the readers yield: one `Doc`, `Redirect` or `Quarantine` per input record, and the counts.

    doc = Doc("1", "Paris", ["Paris is a city.", " It lies on the Seine."], "wiki_00", [Link("Seine", "Seine", 1)])
    doc.row()        # a DOCS row; doc.link_rows() are its LINKS rows (less target_doc_id/missing)
    redirect.row()   # a REDIRECTS row (less to_doc_id)
    quarantine.row() # a QUARANTINE row: source, position, reason, raw

Sentences follow HotpotQA's convention: the whitespace between two sentences starts the next one,
so `doc.text == "".join(doc.sentences)` reads as prose. Titles are normalised (`xh.wiki.titles`).

A quarantine reason starts with one of the stable prefixes in `REASONS` (`Quarantine.group` returns
it), optionally followed by ": <detail>". A quarantine row can also describe a *partial* loss: the
record was kept (as a doc) but a part of it could not be read. It then comes right after its doc,
with `partial=True`, and is counted in `counts.partial`, not in `counts.quarantined` (the record is
already counted as a doc, so `records == docs + redirects + quarantined` still holds; the quarantine
table holds `quarantined + partial` rows). The one partial loss today: "links dropped" (hotpot), when
"text_with_links" is malformed or does not line up with "text" (the doc keeps no links).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import ClassVar, NamedTuple

from xh.schemas import RAW_LIMIT

__all__ = [
    "Link",
    "Doc",
    "Redirect",
    "Quarantine",
    "Record",
    "ReadCounts",
    "REASONS",
    "Unreadable",
    "clip_raw",
    "has_text",
]

# The stable prefixes of quarantine reasons (the last one is the partial loss of a kept doc).
REASONS = (
    "invalid json",
    "invalid record",
    "missing id",
    "missing title",
    "missing redirect target",
    "empty text",
    "non-utf8 bytes",
    "duplicate id",
    "invalid xml page",
    "unreadable wikitext",
    "truncated bz2 stream",
    "links dropped",
)


class Link(NamedTuple):
    """One hyperlink in a doc: the normalised target title, the displayed text, the sentence it is in."""

    target: str
    anchor: str
    sentence: int


@dataclass(slots=True)
class Doc:
    """An article: its sentences and, kept apart from the DOCS row, its outgoing links."""

    kind: ClassVar[str] = "doc"
    doc_id: str
    title: str  # normalised
    sentences: list[str]
    source: str
    links: list[Link] = field(default_factory=list)
    lost: str = ""  # the reason of a partial loss ("links dropped: ..."), "" when the record was read whole

    @property
    def text(self) -> str:
        return "".join(self.sentences)

    def row(self) -> dict:
        """A row of `xh.schemas.DOCS`."""
        return {
            "doc_id": self.doc_id,
            "title": self.title,
            "text": self.text,
            "sentences": self.sentences,
            "source": self.source,
        }

    def link_rows(self) -> list[dict]:
        """Rows of `xh.schemas.LINKS` without `target_doc_id` and `missing` (they need the whole corpus)."""
        doc_id = self.doc_id
        return [
            {"src_doc_id": doc_id, "target_title": target, "anchor": anchor, "sentence": sentence}
            for target, anchor, sentence in self.links
        ]


@dataclass(slots=True)
class Redirect:
    kind: ClassVar[str] = "redirect"
    from_title: str  # normalised
    to_title: str  # normalised
    source: str

    def row(self) -> dict:
        """A row of `xh.schemas.REDIRECTS` without `to_doc_id` (it needs the whole corpus)."""
        return {"from_title": self.from_title, "to_title": self.to_title}


@dataclass(slots=True)
class Quarantine:
    kind: ClassVar[str] = "quarantine"
    source: str
    position: int  # 1-based line number, or 1-based <page> ordinal
    reason: str  # "<stable prefix>" or "<stable prefix>: <detail>"
    raw: str  # the record as read, cut to RAW_LIMIT characters (`clip_raw`)
    partial: bool = False  # True: the record was kept as a doc; this row says what of it was lost

    @property
    def group(self) -> str:
        """The stable prefix of the reason, for counting quarantined records by cause."""
        return self.reason.split(":", 1)[0]

    def row(self) -> dict:
        """A row of `xh.schemas.QUARANTINE`."""
        return {"source": self.source, "position": self.position, "reason": self.reason, "raw": self.raw}


Record = Doc | Redirect | Quarantine


@dataclass
class ReadCounts:
    """Input records read and skipped (counted by the readers) and what came out (counted as yielded)."""

    records: int = 0
    skipped: int = 0
    docs: int = 0
    redirects: int = 0
    quarantined: int = 0
    partial: int = 0  # quarantine rows about kept docs that lost a part (not records of their own)

    @property
    def balanced(self) -> bool:
        """Every record read became exactly one doc, redirect or quarantine row."""
        return self.records == self.docs + self.redirects + self.quarantined

    def add(self, record: Record) -> None:
        if record.kind == "doc":
            self.docs += 1
        elif record.kind == "redirect":
            self.redirects += 1
        elif record.partial:
            self.partial += 1
        else:
            self.quarantined += 1

    def tally(self, records: Iterable[Record]) -> Iterator[Record]:
        """Pass `records` through, counting each as it is yielded."""
        for record in records:
            self.add(record)
            yield record


class Unreadable(Exception):
    """A record that cannot be read; the message is the quarantine reason."""


def clip_raw(text: str) -> str:
    """A quarantined record as the QUARANTINE table keeps it: its first RAW_LIMIT characters."""
    return text[:RAW_LIMIT]


def has_text(sentences: list[str]) -> bool:
    """Whether any sentence holds more than whitespace (a doc without text is quarantined "empty text")."""
    return any(not sentence.isspace() for sentence in sentences if sentence)
