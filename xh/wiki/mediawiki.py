"""A MediaWiki XML dump -> docs (the lead section of each article) and redirects.

    with open("enwiki-pages-articles1.xml.bz2", "rb") as stream:
        for record in read_mediawiki(stream, source="enwiki-pages-articles1.xml.bz2"):
            ...  # a Doc, a Redirect, or a Quarantine (a page that cannot be read)

This module cuts the dump into <page>s and reads each page's XML; turning an article's wikitext
into clean sentences and links is `xh.wiki.wikitext` (mwparserfromhell, imported when first needed,
so that the other formats never load it).
"""

from __future__ import annotations

import html
import re
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Iterator
from typing import BinaryIO

from xh.wiki.records import Doc, Quarantine, ReadCounts, Record, Redirect, Unreadable, clip_raw, has_text
from xh.wiki.streams import Truncated, decompressed, non_utf8
from xh.wiki.titles import cached_normalize_title

__all__ = ["read_mediawiki"]


def read_mediawiki(stream: BinaryIO, source: str, counts: ReadCounts | None = None) -> Iterator[Record]:
    """Docs and redirects from a MediaWiki XML dump (pages-articles*.xml, plain or bz2).

    Main-namespace pages only (others are counted in `counts.skipped`; a page without <ns>, as in
    old dumps, counts as main namespace). A page with <redirect title>
    (or, in old dumps, text "#REDIRECT [[X]]") is a `Redirect`; any other is a `Doc`: doc_id = <id>,
    title = normalised <title>, sentences and links of the lead section of its last revision (see
    `xh.wiki.wikitext`; empty after clean-up -> quarantined "empty text").

    Pages are cut from the byte stream at <page>...</page> and parsed one by one (ElementTree), so a
    malformed page is quarantined ("invalid xml page: ...") and the next one is read: an iterparse
    over the whole file would stop at the first error. Links into the dump's namespaces (from its
    <siteinfo>) are not article links.
    """
    from xh.wiki.wikitext import DEFAULT_NAMESPACES  # needs mwparserfromhell; hotpot/fever do not

    counts = ReadCounts() if counts is None else counts
    return counts.tally(_read_pages(stream, source, counts, DEFAULT_NAMESPACES))


_NAMESPACE_RE = re.compile(rb'<namespace key="(-?\d+)"[^>]*>([^<]*)</namespace>')
_REDIRECT_TEXT_RE = re.compile(r"^\s*#REDIRECT\s*:?\s*\[\[([^\]|]*)", re.IGNORECASE)


def _read_pages(stream: BinaryIO, source: str, counts: ReadCounts, namespaces: frozenset) -> Iterator[Record]:
    seen_ids: set[str] = set()
    ordinal = 0
    try:
        for kind, blob in _xml_blocks(decompressed(stream)):
            if kind == "header":
                names = {
                    html.unescape(name.decode("utf-8", "replace")).strip().lower()
                    for key, name in _NAMESPACE_RE.findall(blob)
                    if key != b"0"
                }
                namespaces = namespaces | frozenset(name for name in names if name)
                continue
            ordinal += 1
            record = _page_record(blob, ordinal, source, namespaces, seen_ids)
            if record is None:
                counts.skipped += 1
                continue
            counts.records += 1
            yield record
    except Truncated as truncated:
        counts.records += 1
        yield truncated.record(source, ordinal + 1)


# --- cutting the dump into pages -----------------------------------------------------------------

_PAGE_OPEN, _PAGE_CLOSE = b"<page>", b"</page>"
_HEADER_LIMIT = 1 << 26  # bytes before the first <page> kept for <siteinfo>; more means no dump


def _xml_blocks(chunks: Iterable[bytes]) -> Iterator[tuple[str, bytes]]:
    """("header", bytes before the first <page>), then ("page", b"<page>...</page>") for each page.

    A page's text escapes "<" as "&lt;", so "<page>" and "</page>" can only be the element's own
    tags: cutting there is exact. A last page without "</page>" comes as ("page", its bytes) and
    fails to parse (quarantined). On `Truncated`, `partial` is the page being read.
    """
    buffer = bytearray()
    position = 0  # everything before it is consumed
    close_from = 0  # where to resume looking for "</page>" in a long page
    header_done = False
    try:
        for chunk in chunks:
            buffer += chunk
            while True:
                start = buffer.find(_PAGE_OPEN, position)
                if start < 0:
                    break
                end = buffer.find(_PAGE_CLOSE, max(start, close_from))
                if end < 0:
                    close_from = max(start, len(buffer) - len(_PAGE_CLOSE))
                    break
                if not header_done:
                    header_done = True
                    yield "header", bytes(buffer[position:start])
                end += len(_PAGE_CLOSE)
                yield "page", bytes(buffer[start:end])
                position = close_from = end
            if start < 0 and (header_done or len(buffer) > _HEADER_LIMIT):
                position = max(position, len(buffer) - len(_PAGE_OPEN))  # only a cut "<page" can matter
                header_done = True
            # Drop what is consumed, once per chunk (not per page: that would copy the buffer each time).
            del buffer[:position]
            close_from -= position
            position = 0
    except Truncated as truncated:
        start = buffer.find(_PAGE_OPEN, position)
        truncated.partial = bytes(buffer[start:]) if start >= 0 else b""
        raise
    start = buffer.find(_PAGE_OPEN, position)
    if start >= 0:
        yield "page", bytes(buffer[start:])


# --- one page ------------------------------------------------------------------------------------


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def _page_record(blob: bytes, ordinal: int, source: str, namespaces: frozenset, seen_ids: set[str]) -> Record | None:
    """The record of one <page>, or None for a page outside the main namespace (not a record)."""
    try:
        text = blob.decode("utf-8")
    except UnicodeDecodeError as error:
        return non_utf8(blob, error, source, ordinal)
    try:
        page = ET.fromstring(text)
    except ET.ParseError as error:
        return Quarantine(source, ordinal, f"invalid xml page: {error}", clip_raw(text))
    fields = {_local(child.tag): child for child in page}  # a later <revision> wins: the newest
    namespace = fields.get("ns")
    if namespace is not None and (namespace.text or "").strip() not in ("", "0"):
        return None
    try:
        record = _page_content(fields, source, namespaces)
    except Unreadable as unreadable:
        return Quarantine(source, ordinal, str(unreadable), clip_raw(text))
    page_id = (fields["id"].text or "").strip()
    if page_id in seen_ids:
        return Quarantine(source, ordinal, f"duplicate id: {page_id}", clip_raw(text))
    seen_ids.add(page_id)
    return record


def _page_content(fields: dict, source: str, namespaces: frozenset) -> Doc | Redirect:
    from xh.wiki.wikitext import article_lead  # loaded already by read_mediawiki

    title_element = fields.get("title")
    title = cached_normalize_title(title_element.text or "") if title_element is not None else ""
    if not title:
        raise Unreadable("missing title")
    if "id" not in fields or not (fields["id"].text or "").strip():
        raise Unreadable("missing id")
    page_id = fields["id"].text.strip()
    wikitext = _last_revision_text(fields)
    redirect = fields.get("redirect")
    if redirect is not None or _REDIRECT_TEXT_RE.match(wikitext):
        raw_target = redirect.get("title", "") if redirect is not None else ""
        if not raw_target:
            match = _REDIRECT_TEXT_RE.match(wikitext)
            raw_target = match.group(1) if match else ""
        target = cached_normalize_title(raw_target)
        if not target:
            raise Unreadable("missing redirect target")
        return Redirect(title, target, source)
    try:
        lead = article_lead(wikitext, namespaces)
    except Exception as error:  # a parser failure on one page (deep nesting...) must not end the file
        raise Unreadable(f"unreadable wikitext: {type(error).__name__}: {error}") from None
    if not has_text(lead.sentences):
        raise Unreadable("empty text")
    return Doc(page_id, title, lead.sentences, source, lead.links)


def _last_revision_text(fields: dict) -> str:
    revision = fields.get("revision")
    if revision is None:
        return ""
    text = None
    for child in revision:
        if _local(child.tag) == "text":
            text = child.text
    return text or ""
