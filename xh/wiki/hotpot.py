"""HotpotQA's processed Wikipedia -> docs with their links.

    with open("wiki_00.bz2", "rb") as stream:
        for record in read_hotpot(stream, source="wiki/AA/wiki_00.bz2"):
            ...  # a Doc, or a Quarantine (a bad line, or the "links dropped" of the doc before it)

The dump is JSON lines (plain or bz2) with "id", "title", "text" (sentences) and "text_with_links"
(the same sentences with <a href="Quoted%20Title">anchor</a>).
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from typing import BinaryIO

from xh.wiki.records import Doc, Link, ReadCounts, Record, Unreadable, has_text
from xh.wiki.streams import id_of, read_json_lines
from xh.wiki.titles import cached_normalize_title

__all__ = ["read_hotpot"]

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
    return counts.tally(read_json_lines(stream, source, counts, _hotpot_doc))


def _hotpot_doc(obj: dict, source: str) -> Doc:
    doc_id = id_of(obj)
    raw_title = obj.get("title")
    title = cached_normalize_title(raw_title) if isinstance(raw_title, str) else ""
    if not title:
        raise Unreadable("missing title")
    sentences = _hotpot_sentences(obj.get("text"), raw_title, "text")
    if not has_text(sentences):
        raise Unreadable("empty text")
    links, lost = _hotpot_doc_links(obj, raw_title, len(sentences))
    return Doc(doc_id, title, sentences, source, links, lost)


def _hotpot_sentences(value, raw_title: str, key: str) -> list[str]:
    """The flat list of sentences of "text" (or "text_with_links"), in either of the dumps' shapes."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise Unreadable(f"invalid record: {key} is not a list")
    if all(isinstance(item, str) for item in value):
        return value  # the abstracts dump: the sentences of the lead (a few are just the title: kept)
    if not all(isinstance(item, list) and all(isinstance(s, str) for s in item) for item in value):
        raise Unreadable(f"invalid record: {key} is neither a list of sentences nor of paragraphs")
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
    except Unreadable as unreadable:
        return [], f"links dropped: {str(unreadable).removeprefix('invalid record: ')}"
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
            target = cached_normalize_title(href)
            anchor = anchor.strip()
            if target and anchor:
                links.append(Link(target, anchor, index))
    return links
