"""A page as a record of the public formats: HotpotQA's processed Wikipedia, FEVER's wiki-pages, true links.

from xh.synth import WorldSpec, page, hotpot_record, fever_page_record
p = page(WorldSpec(num_docs=2000), 0)
hotpot_record(p)["text_with_links"][1]  # ' She was born in <a href="Valham%20Bay">Valham Bay</a>.'
fever_page_record(p)["id"]              # 'Mina_Kessler' (xh.wiki.titles.fever_page_id of the title)
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from xh.synth.layout import WorldSpec
from xh.synth.pages import Page, iter_pages
from xh.wiki.titles import fever_page_id

# A tag counts as one token, as in the HotpotQA dump (CoreNLP kept tags whole).
_TOKEN = re.compile(r'<a href="[^"]*">|</a>|\w+|[^\w\s]')
_TAG = re.compile(r"</?a[^>]*>")


def _char_offsets(sentences: tuple[str, ...]) -> list[list[tuple[int, int]]]:
    """Token [start, end) offsets per sentence, counted from the start of the paragraph.

    (Pairs are tuples: JSON writes them as the [start, end] lists of the HotpotQA dump.)
    """
    paragraph = "".join(sentences)
    tokens, span = _TOKEN.finditer, re.Match.span
    out = []
    start = 0
    for sentence in sentences:
        end = start + len(sentence)
        out.append(list(map(span, tokens(paragraph, start, end))))
        start = end
    return out


def strip_links(sentence: str) -> str:
    """Remove the <a> tags of a linked sentence: gives the plain sentence back."""
    return _TAG.sub("", sentence)


def hotpot_record(p: Page) -> dict:
    """The page as one line of the HotpotQA processed-Wikipedia (abstracts) dump.

    Offsets are [start, end) character positions in the page's paragraph ("".join of its
    sentences, with or without links); the pairs are tuples, which JSON writes as arrays.
    """
    return {
        "id": p.doc_id,
        "url": f"https://en.wikipedia.org/wiki?curid={p.doc_id}",
        "title": p.title,
        "text": list(p.sentences),
        "charoffset": _char_offsets(p.sentences),
        "text_with_links": list(p.sentences_with_links),
        "charoffset_with_links": _char_offsets(p.sentences_with_links),
    }


def fever_page_record(p: Page) -> dict:
    """The page as one line of FEVER's wiki-pages: lines are 'i<TAB>sentence[<TAB>anchor<TAB>target]...'."""
    by_sentence: dict[int, list[str]] = {}
    for link in p.links:
        by_sentence.setdefault(link.sentence_index, []).extend((link.anchor, link.target_title))
    lines = []
    for k, sentence in enumerate(p.sentences):
        lines.append("\t".join([str(k), sentence.lstrip(), *by_sentence.get(k, ())]))
    return {"id": fever_page_id(p.title), "text": p.text, "lines": "\n".join(lines)}


def link_rows(p: Page) -> list[dict]:
    """Ground truth for the hyperlinks of a page (one row per link, as in truth/links.jsonl.bz2)."""
    return [
        {"source": p.title, "target": link.target_title, "anchor": link.anchor, "sentence": link.sentence_index}
        for link in p.links
    ]


def iter_link_rows(spec: WorldSpec, start: int = 0, stop: int | None = None) -> Iterator[dict]:
    """Ground-truth hyperlinks of pages start .. stop-1, in page order (for tests and checks)."""
    for p in iter_pages(spec, start, stop):
        yield from link_rows(p)
