"""FEVER's wiki-pages -> docs whose sentence numbers are FEVER's line numbers.

    with open("wiki-001.jsonl", "rb") as stream:
        for record in read_fever(stream, source="wiki-pages/wiki-001.jsonl"):
            ...  # a Doc, or a Quarantine (a line that cannot be read)

The dump is JSON lines (plain or bz2) with "id" (the FEVER page id) and "lines"
("0<TAB>sentence<TAB>anchor<TAB>target...<NEWLINE>1<TAB>..."). FEVER's claims are `xh.inputs.claims`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import BinaryIO

from xh.wiki.records import Doc, Link, ReadCounts, Record, Unreadable, has_text
from xh.wiki.streams import id_of, read_json_lines
from xh.wiki.titles import cached_normalize_title

__all__ = ["read_fever"]


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
    return counts.tally(read_json_lines(stream, source, counts, _fever_doc))


def _fever_doc(obj: dict, source: str) -> Doc:
    page_id = id_of(obj)
    title = cached_normalize_title(page_id)
    if not title:
        raise Unreadable("missing title")
    lines = obj.get("lines")
    if lines is not None and not isinstance(lines, str):
        raise Unreadable("invalid record: lines is not a string")
    sentences, links = _fever_lines(lines or "")
    if not has_text(sentences):
        raise Unreadable("empty text")
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
            raise Unreadable(f"invalid record: bad line number {fields[0][:20]!r}") from None
        if number < 0 or number > len(lines):
            raise Unreadable(f"invalid record: bad line number {number}")
        if number in by_number:
            raise Unreadable(f"invalid record: line {number} given twice")
        by_number[number] = fields[1] if len(fields) > 1 else ""
        extra = fields[2:]
        for i in range(0, len(extra), 2):
            anchor = extra[i].strip()
            target = cached_normalize_title(extra[i + 1] if i + 1 < len(extra) else extra[i])
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
