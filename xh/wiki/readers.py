"""Readers for three Wikipedia dump formats, one input file at a time, all with the same output.

    from xh.wiki import ReadCounts, read_records

    counts = ReadCounts()
    with open("wiki_00.bz2", "rb") as stream:  # raw bytes: bz2 is detected ("BZh") and decompressed
        for record in read_records("hotpot", stream, source="wiki/AA/wiki_00.bz2", counts=counts):
            if record.kind == "doc":
                record.row()  # a DOCS row; record.link_rows() are its LINKS rows (less target_doc_id/missing)
            elif record.kind == "redirect":
                record.row()  # a REDIRECTS row (less to_doc_id)
            else:
                record.row()  # a QUARANTINE row: source, position, reason, raw
    assert counts.balanced  # records read == docs + redirects + quarantined
    # counts.partial: quarantine rows about docs that were kept but lost a part (see xh.wiki.records)

The formats (`read_records(fmt, ...)` picks one; each is a module of its own):

    hotpot     `xh.wiki.hotpot.read_hotpot`: HotpotQA's processed Wikipedia: JSON lines with "id",
               "title", "text" (sentences) and "text_with_links" (the same sentences with
               <a href="Quoted%20Title">anchor</a>).
    mediawiki  `xh.wiki.mediawiki.read_mediawiki`: a MediaWiki XML dump (pages-articles*.xml[.bz2]):
               the lead section of each article (cleaned by `xh.wiki.wikitext`).
    fever      `xh.wiki.fever.read_fever`: FEVER's wiki-pages: JSON lines with "id" (the FEVER page
               id) and "lines" ("0<TAB>sentence<TAB>anchor<TAB>target...<NEWLINE>1<TAB>...").

What a *record* is, the unit that the invariant `records == docs + redirects + quarantined` counts:

    hotpot, fever  every line that is not blank (blank lines are counted in `skipped`)
    mediawiki      every <page> in the main (article) namespace, plus every <page> that cannot be read
                   far enough to know its namespace; pages of other namespaces (Talk:, Wikipedia:, ...)
                   are not records and are counted in `skipped`
    all            a truncated or corrupt bz2 tail: one record, quarantined, after which the file ends

Each record becomes exactly one `Doc`, `Redirect` or `Quarantine` (`xh.wiki.records`: the types, the
quarantine reasons, partial losses). Positions are 1-based line numbers (JSON lines) or 1-based
ordinals of <page> elements in the file, skipped pages included. Ids are unique within a file (a
repeated id is quarantined); duplicates across files are the pipeline's business.

The readers stream (a bounded buffer, never a whole file: `xh.wiki.streams`) and use only the
standard library, except `read_mediawiki`, which needs mwparserfromhell (imported when first called).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import BinaryIO

from xh.wiki.fever import read_fever
from xh.wiki.hotpot import read_hotpot
from xh.wiki.mediawiki import read_mediawiki
from xh.wiki.records import ReadCounts, Record

__all__ = ["FORMATS", "read_records"]

FORMATS: dict[str, Callable[..., Iterator[Record]]] = {
    "hotpot": read_hotpot,
    "mediawiki": read_mediawiki,
    "fever": read_fever,
}


def read_records(fmt: str, stream: BinaryIO, source: str, counts: ReadCounts | None = None) -> Iterator[Record]:
    """The records of one file in format `fmt` ("hotpot", "mediawiki" or "fever")."""
    try:
        reader = FORMATS[fmt]
    except KeyError:
        raise ValueError(f"unknown wiki format {fmt!r}; expected one of {sorted(FORMATS)}") from None
    return reader(stream, source, counts)
