"""Readers for three Wikipedia dump formats, one input file at a time, all with the same output.

    from xh.wiki.readers import ReadCounts, read_records

    counts = ReadCounts()
    with open("wiki_00.bz2", "rb") as stream:  # raw bytes: bz2 is detected ("BZh") and decompressed here
        for record in read_records("hotpot", stream, source="wiki/AA/wiki_00.bz2", counts=counts):
            if record.kind == "doc":
                record.row()  # a DOCS row; record.link_rows() are its LINKS rows (less target_doc_id/missing)
            elif record.kind == "redirect":
                record.row()  # a REDIRECTS row (less to_doc_id)
            else:
                record.row()  # a QUARANTINE row: source, position, reason, raw
    assert counts.balanced  # records read == docs + redirects + quarantined
    # counts.partial: quarantine rows about docs that were kept but lost a part (see below)

The formats (`read_hotpot`, `read_mediawiki`, `read_fever`; `read_records(fmt, ...)` picks one):

    hotpot     HotpotQA's processed Wikipedia: JSON lines with "id", "title", "text" (sentences) and
               "text_with_links" (the same sentences with <a href="Quoted%20Title">anchor</a>).
    mediawiki  a MediaWiki XML dump (pages-articles*.xml[.bz2]): the lead section of each article.
    fever      FEVER's wiki-pages: JSON lines with "id" (the FEVER page id) and "lines"
               ("0<TAB>sentence<TAB>anchor<TAB>target...<NEWLINE>1<TAB>...").

What a *record* is, the unit that the invariant `records == docs + redirects + quarantined` counts:

    hotpot, fever  every line that is not blank (blank lines are counted in `skipped`)
    mediawiki      every <page> in the main (article) namespace, plus every <page> that cannot be read
                   far enough to know its namespace; pages of other namespaces (Talk:, Wikipedia:, ...)
                   are not records and are counted in `skipped`
    all            a truncated or corrupt bz2 tail: one record, quarantined, after which the file ends

Each record becomes exactly one `Doc`, `Redirect` or `Quarantine`. Quarantine reasons start with a
stable prefix (`Quarantine.group` returns it): "invalid json", "invalid record", "missing id",
"missing title", "missing redirect target", "empty text", "non-utf8 bytes", "duplicate id",
"invalid xml page", "unreadable wikitext", "truncated bz2 stream".

A quarantine row can also describe a *partial* loss: the record was kept (as a doc) but a part of it
could not be read. It then comes right after its doc, with `partial=True`, and is counted in
`counts.partial`, not in `counts.quarantined` (the record is already counted as a doc, so
`records == docs + redirects + quarantined` still holds; the quarantine table holds
`quarantined + partial` rows). The one partial loss today: "links dropped" (hotpot), when
"text_with_links" is malformed or does not line up with "text" (the doc keeps no links). Positions are 1-based line
numbers (JSON lines) or 1-based ordinals of <page> elements in the file, skipped pages included.

Sentences follow HotpotQA's convention: the whitespace between two sentences starts the next one,
so `doc.text == "".join(doc.sentences)` reads as prose. Ids are unique within a file (a repeated id
is quarantined); duplicates across files are the pipeline's business.

The readers stream (a bounded buffer, never a whole file) and use only the standard library, except
`read_mediawiki`, which needs mwparserfromhell (imported when first called).
"""

from __future__ import annotations

import bz2
import html
import json
import re
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from functools import lru_cache
from typing import BinaryIO, ClassVar, NamedTuple, Union

from xh.schemas import RAW_LIMIT
from xh.wiki.titles import normalize_title

__all__ = [
    "Link",
    "Doc",
    "Redirect",
    "Quarantine",
    "Record",
    "ReadCounts",
    "FORMATS",
    "read_records",
    "read_hotpot",
    "read_mediawiki",
    "read_fever",
]


# --- what the readers yield ----------------------------------------------------------------------


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
    raw: str  # the record as read, cut to RAW_LIMIT characters
    partial: bool = False  # True: the record was kept as a doc; this row says what of it was lost

    @property
    def group(self) -> str:
        """The stable prefix of the reason, for counting quarantined records by cause."""
        return self.reason.split(":", 1)[0]

    def row(self) -> dict:
        """A row of `xh.schemas.QUARANTINE`."""
        return {"source": self.source, "position": self.position, "reason": self.reason, "raw": self.raw}


Record = Union[Doc, Redirect, Quarantine]


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


class _Bad(Exception):
    """A record that cannot be read; the message is the quarantine reason."""


def _raw(text: str) -> str:
    return text[:RAW_LIMIT]


# Titles repeat a lot (link targets above all); normalising each distinct spelling once pays.
_title = lru_cache(maxsize=1 << 17)(normalize_title)


# --- bytes in: bz2 detection, decompression, lines -----------------------------------------------

_READ_SIZE = 1 << 20  # compressed bytes read per call
_OUT_SIZE = 1 << 22  # most decompressed bytes produced per call (a bz2 "bomb" stays bounded)


class _Truncated(Exception):
    """The bz2 stream ended early or is corrupt; `partial` is the incomplete record that was cut."""

    def __init__(self, detail: str):
        super().__init__(detail)
        self.partial = b""


def _decompressed(stream: BinaryIO) -> Iterator[bytes]:
    """The file's bytes in chunks, bz2-decompressed when the file starts with bz2's magic "BZh"."""
    head = b""
    while len(head) < 3:
        more = stream.read(_READ_SIZE)
        if not more:
            break
        head += more
    if head.startswith(b"BZh"):
        yield from _bunzip2(head, stream)
        return
    if head:
        yield head
    while chunk := stream.read(_READ_SIZE):
        yield chunk


def _bunzip2(data: bytes, stream: BinaryIO) -> Iterator[bytes]:
    """Incremental bz2 decompression of one or more concatenated streams (as pbzip2 writes them)."""
    decompressor = bz2.BZ2Decompressor()
    streams_done = 0
    produced = False  # has the current stream produced output yet?
    while True:
        try:
            out = decompressor.decompress(data, _OUT_SIZE)
        except OSError as error:
            if streams_done and not produced:
                return  # trailing garbage after a complete stream: ignored, as bz2.BZ2File does
            raise _Truncated(f"corrupt data ({error})") from None
        data = b""
        if out:
            produced = True
            yield out
        if decompressor.eof:
            data = decompressor.unused_data or stream.read(_READ_SIZE)
            if not data:
                return
            decompressor, streams_done, produced = bz2.BZ2Decompressor(), streams_done + 1, False
        elif decompressor.needs_input:
            data = stream.read(_READ_SIZE)
            if not data:
                raise _Truncated("the file ends before the end-of-stream marker")


def _lines(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """Split byte chunks into lines (without the newline); a cut line is kept on `_Truncated.partial`."""
    pending: list[bytes] = []
    try:
        for chunk in chunks:
            if b"\n" not in chunk:
                pending.append(chunk)
                continue
            lines = chunk.split(b"\n")
            if pending:
                pending.append(lines[0])
                lines[0] = b"".join(pending)
                pending = []
            tail = lines.pop()
            yield from lines
            if tail:
                pending.append(tail)
    except _Truncated as truncated:
        truncated.partial = b"".join(pending)
        raise
    if pending:
        yield b"".join(pending)


# --- JSON lines (hotpot, fever) ------------------------------------------------------------------


def _read_json_lines(
    stream: BinaryIO, source: str, counts: ReadCounts, to_doc: Callable[[dict, str], Doc]
) -> Iterator[Record]:
    """One record per non-blank line; `to_doc` turns a parsed object into a Doc or raises `_Bad`."""
    seen_ids: set[str] = set()
    number = 0
    try:
        for line in _lines(_decompressed(stream)):
            number += 1
            if not line or line.isspace():
                counts.skipped += 1
                continue
            counts.records += 1
            record = _json_line_record(line, number, source, to_doc, seen_ids)
            yield record
            if record.kind == "doc" and record.lost:
                yield Quarantine(source, number, record.lost, _raw(line.decode("utf-8", "replace")), partial=True)
    except _Truncated as truncated:
        counts.records += 1
        partial = truncated.partial.decode("utf-8", "replace")
        yield Quarantine(source, number + 1, f"truncated bz2 stream: {truncated}", _raw(partial))


def _json_line_record(
    line: bytes, number: int, source: str, to_doc: Callable[[dict, str], Doc], seen_ids: set[str]
) -> Record:
    if line.endswith(b"\r"):
        line = line[:-1]
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as error:
        reason = f"non-utf8 bytes: {error.reason} at byte {error.start}"
        return Quarantine(source, number, reason, _raw(line.decode("utf-8", "replace")))
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError) as error:  # RecursionError: absurdly deep nesting
        return Quarantine(source, number, f"invalid json: {getattr(error, 'msg', error)}", _raw(text))
    try:
        if not isinstance(obj, dict):
            raise _Bad(f"invalid record: a JSON {type(obj).__name__}, not an object")
        if "\\ud" in text or "\\uD" in text:
            _check_no_lone_surrogates(obj)
        doc = to_doc(obj, source)
    except _Bad as bad:
        return Quarantine(source, number, str(bad), _raw(text))
    if doc.doc_id in seen_ids:
        return Quarantine(source, number, f"duplicate id: {doc.doc_id}", _raw(text))
    seen_ids.add(doc.doc_id)
    return doc


def _check_no_lone_surrogates(obj: dict) -> None:
    """JSON may escape half a surrogate pair ("\\ud800"), which no UTF-8 writer (Parquet) accepts."""
    try:
        json.dumps(obj, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise _Bad("invalid record: unpaired surrogate in a string") from None


def _id_of(obj: dict, key: str = "id") -> str:
    value = obj.get(key)
    if isinstance(value, bool) or not isinstance(value, (str, int)) or not str(value).strip():
        raise _Bad("missing id")
    return str(value).strip()


def _has_text(sentences: list[str]) -> bool:
    return any(not sentence.isspace() for sentence in sentences if sentence)


# --- hotpot --------------------------------------------------------------------------------------

# HotpotQA's links: <a href="URL%20quoted%20Title">anchor</a>, never nested, one sentence each.
_ANCHOR_RE = re.compile(r'<a href="([^"]*)">(.*?)</a>', re.DOTALL)
_TAG_RE = re.compile(r"<[^>]*>")


def read_hotpot(stream: BinaryIO, source: str, counts: ReadCounts | None = None) -> Iterator[Record]:
    """Docs from HotpotQA's processed Wikipedia (JSON lines, plain or bz2).

    doc_id = "id", title = normalize_title("title"), sentences = "text" verbatim. "text" is either a
    list of sentences (the abstracts dump: the lead paragraph) or a list of paragraphs, each a list of
    sentences (the full-page dump): paragraphs are flattened in order and all kept, except a first
    paragraph that is only the title (the full-page dump starts each page with its title). Sentences
    are kept verbatim (after the first, they begin with a space); an abstract that is only the title
    (the dump has a few) stays a doc.

    Links come from "text_with_links" (flattened the same way): the href, unquoted and normalised, is
    the target; the anchor is the tag's text (entities decoded); the sentence is the one it sits in.
    When "text_with_links" is malformed or does not have one entry per sentence, the doc keeps no
    links and a partial quarantine row "links dropped: ..." follows it.
    """
    counts = ReadCounts() if counts is None else counts
    return _tallied(_read_json_lines(stream, source, counts, _hotpot_doc), counts)


def _hotpot_doc(obj: dict, source: str) -> Doc:
    doc_id = _id_of(obj)
    raw_title = obj.get("title")
    title = _title(raw_title) if isinstance(raw_title, str) else ""
    if not title:
        raise _Bad("missing title")
    sentences = _hotpot_sentences(obj.get("text"), raw_title, "text")
    if not _has_text(sentences):
        raise _Bad("empty text")
    links, lost = _hotpot_doc_links(obj, raw_title, len(sentences))
    return Doc(doc_id, title, sentences, source, links, lost)


def _hotpot_sentences(value, raw_title: str, key: str) -> list[str]:
    """The flat list of sentences of "text" (or "text_with_links"), in either of the dumps' shapes."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise _Bad(f"invalid record: {key} is not a list")
    if all(isinstance(item, str) for item in value):
        return value  # the abstracts dump: the sentences of the lead (a few are just the title: kept)
    if not all(isinstance(item, list) and all(isinstance(s, str) for s in item) for item in value):
        raise _Bad(f"invalid record: {key} is neither a list of sentences nor of paragraphs")
    paragraphs = value  # the full-page dump, whose first paragraph is the bare title: dropped
    if paragraphs and len(paragraphs[0]) == 1 and paragraphs[0][0].strip() == raw_title.strip():
        paragraphs = paragraphs[1:]
    return [sentence for paragraph in paragraphs for sentence in paragraph]


def _hotpot_doc_links(obj: dict, raw_title: str, n_sentences: int) -> tuple[list[Link], str]:
    """The doc's links, and the reason they were dropped ("" when none were).

    Links are an extra: a malformed or misaligned "text_with_links" costs the links, not the doc.
    A record without "text_with_links" has no links to lose.
    """
    if obj.get("text_with_links") is None:
        return [], ""
    try:
        linked = _hotpot_sentences(obj.get("text_with_links"), raw_title, "text_with_links")
    except _Bad as bad:
        return [], f"links dropped: {str(bad).removeprefix('invalid record: ')}"
    if len(linked) != n_sentences:
        return [], f"links dropped: text_with_links has {len(linked)} sentences, text has {n_sentences}"
    return _hotpot_links(linked), ""


def _hotpot_links(linked: list[str]) -> list[Link]:
    links = []
    for index, sentence in enumerate(linked):
        if "<a " not in sentence:
            continue
        for match in _ANCHOR_RE.finditer(sentence):
            href, anchor = match.groups()
            if "://" in href:  # an external link, not a page
                continue
            if "<" in anchor:
                anchor = _TAG_RE.sub("", anchor)
            if "&" in anchor:
                anchor = html.unescape(anchor)
            target = _title(href)
            anchor = anchor.strip()
            if target and anchor:
                links.append(Link(target, anchor, index))
    return links


# --- fever ---------------------------------------------------------------------------------------


def read_fever(stream: BinaryIO, source: str, counts: ReadCounts | None = None) -> Iterator[Record]:
    """Docs from FEVER's wiki-pages (JSON lines, plain or bz2).

    doc_id = the FEVER page id as given ("Gladiator_-LRB-2000_film-RRB-"), title = its normalised
    title ("Gladiator (2000 film)"). Sentences come from "lines": line `i` of FEVER is `sentences[i]`
    (evidence refers to these numbers), so empty lines stay as "" and missing numbers are filled
    with "". The text is FEVER's (tokenised, "-LRB-" kept); a non-empty sentence after the first
    gets a leading space (the separator of the HotpotQA convention): `sentence.strip()` is FEVER's.

    Links: the tab fields after a sentence alternate anchor, target ("greeting<TAB>greeting habits");
    a lone last field is taken as both. "text" is not read (it is "lines" joined).
    """
    counts = ReadCounts() if counts is None else counts
    return _tallied(_read_json_lines(stream, source, counts, _fever_doc), counts)


def _fever_doc(obj: dict, source: str) -> Doc:
    page_id = _id_of(obj)
    title = _title(page_id)
    if not title:
        raise _Bad("missing title")
    lines = obj.get("lines")
    if lines is not None and not isinstance(lines, str):
        raise _Bad("invalid record: lines is not a string")
    sentences, links = _fever_lines(lines or "")
    if not _has_text(sentences):
        raise _Bad("empty text")
    return Doc(page_id, title, sentences, source, links)


def _fever_lines(lines: str) -> tuple[list[str], list[Link]]:
    by_number: dict[int, str] = {}
    links = []
    for line in lines.split("\n"):
        if not line:
            continue
        fields = line.split("\t")
        try:
            number = int(fields[0])
        except ValueError:
            raise _Bad(f"invalid record: bad line number {fields[0][:20]!r}") from None
        if number < 0 or number > len(lines):
            raise _Bad(f"invalid record: bad line number {number}")
        if number in by_number:
            raise _Bad(f"invalid record: line {number} given twice")
        by_number[number] = fields[1] if len(fields) > 1 else ""
        extra = fields[2:]
        for i in range(0, len(extra), 2):
            anchor = extra[i].strip()
            target = _title(extra[i + 1] if i + 1 < len(extra) else extra[i])
            if anchor and target:
                links.append(Link(target, anchor, number))
    if not by_number:
        return [], []
    sentences = []
    started = False
    for number in range(max(by_number) + 1):
        sentence = by_number.get(number, "")
        if sentence and started and not sentence[0].isspace():
            sentence = " " + sentence
        started = started or bool(sentence)
        sentences.append(sentence)
    return sentences, links


# --- mediawiki -----------------------------------------------------------------------------------


def read_mediawiki(stream: BinaryIO, source: str, counts: ReadCounts | None = None) -> Iterator[Record]:
    """Docs and redirects from a MediaWiki XML dump (pages-articles*.xml, plain or bz2).

    Main-namespace pages only (others are counted in `counts.skipped`; a page without <ns>, as in
    old dumps, counts as main namespace). A page with <redirect title>
    (or, in old dumps, text "#REDIRECT [[X]]") is a `Redirect`; any other is a `Doc`: doc_id = <id>,
    title = normalised <title>, sentences and links of the lead section of its last revision (see
    `xh.wiki.mediawiki`; empty after clean-up -> quarantined "empty text").

    Pages are cut from the byte stream at <page>...</page> and parsed one by one (ElementTree), so a
    malformed page is quarantined ("invalid xml page: ...") and the next one is read: an iterparse
    over the whole file would stop at the first error. Links into the dump's namespaces (from its
    <siteinfo>) are not article links.
    """
    from xh.wiki.mediawiki import DEFAULT_NAMESPACES  # needs mwparserfromhell; hotpot/fever do not

    counts = ReadCounts() if counts is None else counts
    return _tallied(_read_mediawiki(stream, source, counts, DEFAULT_NAMESPACES), counts)


_NAMESPACE_RE = re.compile(rb'<namespace key="(-?\d+)"[^>]*>([^<]*)</namespace>')
_REDIRECT_TEXT_RE = re.compile(r"^\s*#REDIRECT\s*:?\s*\[\[([^\]|]*)", re.IGNORECASE)


def _read_mediawiki(stream: BinaryIO, source: str, counts: ReadCounts, namespaces: frozenset) -> Iterator[Record]:
    seen_ids: set[str] = set()
    ordinal = 0
    try:
        for kind, blob in _xml_blocks(_decompressed(stream)):
            if kind == "header":
                names = {html.unescape(name.decode("utf-8", "replace")).strip().lower()
                         for key, name in _NAMESPACE_RE.findall(blob) if key != b"0"}  # fmt: skip
                namespaces = namespaces | frozenset(name for name in names if name)
                continue
            ordinal += 1
            record = _page_record(blob, ordinal, source, namespaces, seen_ids)
            if record is None:
                counts.skipped += 1
                continue
            counts.records += 1
            yield record
    except _Truncated as truncated:
        counts.records += 1
        partial = truncated.partial.decode("utf-8", "replace")
        yield Quarantine(source, ordinal + 1, f"truncated bz2 stream: {truncated}", _raw(partial))


_PAGE_OPEN, _PAGE_CLOSE = b"<page>", b"</page>"
_HEADER_LIMIT = 1 << 26  # bytes before the first <page> kept for <siteinfo>; more means no dump


def _xml_blocks(chunks: Iterable[bytes]) -> Iterator[tuple[str, bytes]]:
    """("header", bytes before the first <page>), then ("page", b"<page>...</page>") for each page.

    A page's text escapes "<" as "&lt;", so "<page>" and "</page>" can only be the element's own
    tags: cutting there is exact. A last page without "</page>" comes as ("page", its bytes) and
    fails to parse (quarantined). On `_Truncated`, `partial` is the page being read.
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
    except _Truncated as truncated:
        start = buffer.find(_PAGE_OPEN, position)
        truncated.partial = bytes(buffer[start:]) if start >= 0 else b""
        raise
    start = buffer.find(_PAGE_OPEN, position)
    if start >= 0:
        yield "page", bytes(buffer[start:])


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def _page_record(
    blob: bytes, ordinal: int, source: str, namespaces: frozenset, seen_ids: set[str]
) -> Record | None:
    """The record of one <page>, or None for a page outside the main namespace (not a record)."""
    try:
        text = blob.decode("utf-8")
    except UnicodeDecodeError as error:
        reason = f"non-utf8 bytes: {error.reason} at byte {error.start}"
        return Quarantine(source, ordinal, reason, _raw(blob.decode("utf-8", "replace")))
    try:
        page = ET.fromstring(text)
    except ET.ParseError as error:
        return Quarantine(source, ordinal, f"invalid xml page: {error}", _raw(text))
    fields = {_local(child.tag): child for child in page}  # a later <revision> wins: the newest
    namespace = fields.get("ns")
    if namespace is not None and (namespace.text or "").strip() not in ("", "0"):
        return None
    try:
        record = _page_content(fields, source, namespaces)
    except _Bad as bad:
        return Quarantine(source, ordinal, str(bad), _raw(text))
    page_id = (fields["id"].text or "").strip()
    if page_id in seen_ids:
        return Quarantine(source, ordinal, f"duplicate id: {page_id}", _raw(text))
    seen_ids.add(page_id)
    return record


def _page_content(fields: dict, source: str, namespaces: frozenset) -> Doc | Redirect:
    from xh.wiki.mediawiki import article_lead

    title_element = fields.get("title")
    title = _title(title_element.text or "") if title_element is not None else ""
    if not title:
        raise _Bad("missing title")
    if "id" not in fields or not (fields["id"].text or "").strip():
        raise _Bad("missing id")
    page_id = fields["id"].text.strip()
    wikitext = _last_revision_text(fields)
    redirect = fields.get("redirect")
    if redirect is not None or _REDIRECT_TEXT_RE.match(wikitext):
        raw_target = redirect.get("title", "") if redirect is not None else ""
        if not raw_target:
            match = _REDIRECT_TEXT_RE.match(wikitext)
            raw_target = match.group(1) if match else ""
        target = _title(raw_target)
        if not target:
            raise _Bad("missing redirect target")
        return Redirect(title, target, source)
    try:
        lead = article_lead(wikitext, namespaces)
    except Exception as error:  # a parser failure on one page (deep nesting...) must not end the file
        raise _Bad(f"unreadable wikitext: {type(error).__name__}: {error}") from None
    if not _has_text(lead.sentences):
        raise _Bad("empty text")
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


# --- one entry point -----------------------------------------------------------------------------


def _tallied(records: Iterator[Record], counts: ReadCounts) -> Iterator[Record]:
    for record in records:
        counts.add(record)
        yield record


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
