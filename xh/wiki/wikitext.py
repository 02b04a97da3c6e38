"""Wikitext of one article -> its lead paragraph as clean sentences, with the links in them.

The MediaWiki reader (`xh.wiki.mediawiki.read_mediawiki`) hands each article's wikitext here::

    >>> lead = article_lead("'''Paris''' is the [[capital city|capital]] of [[France]].<ref>x</ref>"
    ...                     " It lies on the [[Seine]].\\n== History ==\\n...")
    >>> lead.sentences
    ['Paris is the capital of France.', ' It lies on the Seine.']
    >>> [(link.target, link.anchor, link.sentence) for link in lead.links]
    [('Capital city', 'capital', 0), ('France', 'France', 0), ('Seine', 'Seine', 1)]

What is kept (mwparserfromhell parses the wikitext; regexes only tidy the plain text it leaves):

- the lead: everything before the first section heading (`== ... ==`);
- text, bold/italic contents, the display text of links and of labelled external links `[url label]`,
  HTML entities (decoded), the contents of inline tags (`<small>`, `<span>`...);
- a few templates that only wrap inline text (`{{nowrap|...}}`, `{{lang|fr|...}}`, `{{convert|5|km}}`
  -> "5 km", ...: see `_INLINE_TEMPLATES`). Every other template is dropped: infoboxes, hatnotes,
  citations, pronunciation and date templates (so "born {{birth date|...}}" loses the date);

What is dropped: templates (above), tables (`{| ... |}`), `<ref>`s, galleries, `<math>`, HTML comments,
files/images (with their captions), categories, interlanguage links, bare external links, magic words,
list markers; and the debris that leaves ("()", "( ; from Greek" -> "(from Greek", " ," -> ",").

Links: `[[Target|anchor]]` / `[[Target]]` (anchor = the displayed text, a trailing `[[bus]]es` included)
whose target is an article (not File:, Category:, another namespace, an interwiki or interlanguage
prefix, nor a same-page `#section`) become `Link(target=normalize_title(Target), anchor, sentence)`.

Sentences follow the HotpotQA convention: the whitespace between two sentences starts the next one,
so `"".join(sentences)` is the paragraph again. The splitter is rule-based (see `split_sentences`).
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterable
from typing import NamedTuple

import mwparserfromhell
from mwparserfromhell.nodes import (
    Comment,
    ExternalLink,
    Heading,
    HTMLEntity,
    Tag,
    Template,
    Text,
    Wikilink,
)

from xh.wiki.records import Link
from xh.wiki.titles import normalize_title

__all__ = ["Lead", "article_lead", "lead_wikitext", "split_sentences", "DEFAULT_NAMESPACES"]


class Lead(NamedTuple):
    sentences: list[str]
    links: list[Link]


# --- the lead section ----------------------------------------------------------------------------

# A section heading is a whole line "=...=" (a trailing comment allowed).
_HEADING_RE = re.compile(r"^=+[^=\n].*?=+[ \t]*(?:<!--.*?-->[ \t]*)*$", re.MULTILINE)


def lead_wikitext(wikitext: str) -> str:
    """The wikitext before the first section heading (all of it when there is none).

    Cutting before parsing keeps the parser's work to the lead (a tenth of a typical article). A
    heading-like line inside an HTML comment is not a heading, so such candidates are passed over.
    """
    for match in _HEADING_RE.finditer(wikitext):
        before = wikitext[: match.start()]
        if before.count("<!--") <= before.count("-->"):
            return before
    return wikitext


# --- namespaces and link targets -----------------------------------------------------------------

# English Wikipedia's namespace names and aliases; `read_mediawiki` adds the dump's own <siteinfo> list.
DEFAULT_NAMESPACES = frozenset(
    name.lower()
    for name in (
        "Media",
        "Special",
        "Talk",
        "User",
        "User talk",
        "Wikipedia",
        "Wikipedia talk",
        "WP",
        "WT",
        "Project",
        "Project talk",
        "File",
        "File talk",
        "Image",
        "Image talk",
        "MediaWiki",
        "MediaWiki talk",
        "Template",
        "Template talk",
        "Help",
        "Help talk",
        "Category",
        "Category talk",
        "Portal",
        "Portal talk",
        "Book",
        "Book talk",
        "Draft",
        "Draft talk",
        "Education Program",
        "Education Program talk",
        "TimedText",
        "TimedText talk",
        "Module",
        "Module talk",
        "Gadget",
        "Gadget talk",
        "Gadget definition",
        "Gadget definition talk",
        "Topic",
    )
)

# Links to these show nothing in the article text (an image, a category tag): dropped with their text.
_INVISIBLE_NAMESPACES = frozenset({"file", "image", "media", "category"})

# Interwiki prefixes (other wikis): the text stays, the link goes. Language codes are matched by shape.
_INTERWIKI = frozenset(
    {
        "wikt",
        "wiktionary",
        "w",
        "wikipedia",
        "commons",
        "c",
        "s",
        "wikisource",
        "q",
        "wikiquote",
        "b",
        "wikibooks",
        "n",
        "wikinews",
        "v",
        "wikiversity",
        "voy",
        "wikivoyage",
        "d",
        "wikidata",
        "m",
        "meta",
        "metawikimedia",
        "species",
        "wikispecies",
        "mw",
        "mediawikiwiki",
        "foundation",
        "wmf",
        "simple",
        "phab",
        "phabricator",
        "outreach",
        "incubator",
        "doi",
        "arxiv",
        "google",
        "imdbname",
        "imdbtitle",
    }
)
_LANGUAGE_CODE_RE = re.compile(r"^[a-z]{2,3}(?:-[a-z0-9]{2,8})*$")

# How a [[...]] link is treated, by what its target names.
_ARTICLE, _TEXT_ONLY, _INVISIBLE = "article", "text-only", "invisible"


def _link_kind(raw_target: str, namespaces: frozenset[str]) -> str:
    target = raw_target.strip()
    colon_first = target.startswith(":")
    target = target.lstrip(":").strip()
    if ":" not in target:
        return _ARTICLE
    prefix = target.split(":", 1)[0].strip()
    folded = prefix.replace("_", " ").lower()
    if folded in namespaces or folded in DEFAULT_NAMESPACES:
        if folded in _INVISIBLE_NAMESPACES and not (colon_first and folded == "category"):
            return _INVISIBLE
        return _TEXT_ONLY
    if prefix in _INTERWIKI or _LANGUAGE_CODE_RE.match(prefix):
        # "[[fr:Paris]]" is the sidebar's interlanguage link (invisible); "[[:fr:Paris]]" shows text.
        return _TEXT_ONLY if colon_first or prefix in _INTERWIKI else _INVISIBLE
    return _ARTICLE  # "Star Wars: Episode IV" is an article title with a colon in it


# --- rendering wikitext to plain text ------------------------------------------------------------

# Tags whose contents are not running text of the paragraph.
_DROPPED_TAGS = frozenset(
    {
        "ref",
        "references",
        "table",
        "gallery",
        "imagemap",
        "timeline",
        "math",
        "chem",
        "ce",
        "score",
        "syntaxhighlight",
        "source",
        "graph",
        "templatedata",
        "mapframe",
        "maplink",
        "categorytree",
        "inputbox",
        "includeonly",
        "noinclude",
        "hiero",
        "indicator",
    }
)
# Tags that break a line (the paragraph is one line in the end, but words must not run together).
_BREAK_TAGS = frozenset({"br", "li", "dt", "dd", "hr", "p", "div", "tr", "td", "th"})


def _positional(template: Template) -> list:
    return [param.value for param in template.params if not param.showkey]


def _first(template: Template) -> list:
    values = _positional(template)
    return values[:1]


def _last(template: Template) -> list:
    values = _positional(template)
    return values[-1:]


_RANGE_WORDS = frozenset({"to", "-", "–", "and", "or", "by", "x", "×", "+/-", "±"})


def _convert(template: Template) -> list:
    """{{convert|5|km}} -> "5 km"; {{convert|5|to|10|km}} -> "5 to 10 km" (no conversion shown)."""
    values = _positional(template)
    if len(values) >= 4 and str(values[1]).strip() in _RANGE_WORDS:
        return [values[0], " ", values[1], " ", values[2], " ", values[3]]
    if len(values) >= 2:
        return [values[0], " ", values[1]]
    return values[:1]


# Templates that only wrap inline text: name (lower case) -> the pieces to render in its place.
_INLINE_TEMPLATES = {
    "nowrap": _first,
    "nobr": _first,
    "nobold": _first,
    "noitalic": _first,
    "small": _first,
    "smaller": _first,
    "big": _first,
    "larger": _first,
    "abbr": _first,
    "lang": _last,
    "transl": _last,
    "ill": _first,
    "interlanguage link": _first,
    "convert": _convert,
    "cvt": _convert,
    "nbsp": lambda template: [" "],
    "snd": lambda template: [" – "],
    "spaced ndash": lambda template: [" – "],
    "ndash": lambda template: ["–"],
    "mdash": lambda template: ["—"],
}

# Marks where a link's anchor begins in the rendered text; a private-use character, removed at the end.
_MARK = "\ue000"


class _Renderer:
    """Walks mwparserfromhell nodes, appending plain text to `out` and links to `links` (in order)."""

    def __init__(self, namespaces: frozenset[str]):
        self.namespaces = namespaces
        self.out: list[str] = []
        self.links: list[list[str]] = []  # [target, anchor]; the k-th _MARK in `out` is links[k]

    def render(self, nodes: Iterable) -> None:
        trail_link = None  # a link just written, whose anchor a following "es" extends ([[bus]]es)
        for node in nodes:
            if isinstance(node, Text):
                text = str(node)
                if trail_link is not None:
                    trail = _LINK_TRAIL_RE.match(text)
                    if trail:
                        trail_link[1] += trail.group()
                trail_link = None
                self.out.append(text)
                continue
            trail_link = None
            if isinstance(node, Wikilink):
                trail_link = self._wikilink(node)
            elif isinstance(node, Tag):
                self._tag(node)
            elif isinstance(node, Template):
                self._template(node)
            elif isinstance(node, HTMLEntity):
                self.out.append(node.normalize())
            elif isinstance(node, ExternalLink):
                if node.title is not None:  # "[url label]" shows the label; a bare url shows nothing useful
                    self.render(node.title.nodes)
            elif isinstance(node, (Comment, Heading)):
                continue
            # Arguments ({{{1}}}) and anything else: not article text.

    def _wikilink(self, link: Wikilink):
        raw_target = str(link.title)
        kind = _link_kind(raw_target, self.namespaces)
        if kind == _INVISIBLE:
            return None
        display = self._display_text(link, raw_target)
        if not display:
            return None
        target = normalize_title(raw_target) if kind == _ARTICLE else ""
        if not target:  # another namespace, an interwiki or a "#section" of this page: text only
            self.out.append(display)
            return None
        entry = [target, display]
        self.links.append(entry)
        self.out.append(_MARK + display)
        return entry

    def _display_text(self, link: Wikilink, raw_target: str) -> str:
        if link.text is None:
            return _SPACES_RE.sub(" ", raw_target.lstrip().lstrip(":")).strip()
        inner = _Renderer(self.namespaces)  # links inside a link's text are not links
        inner.render(link.text.nodes)
        display = _SPACES_RE.sub(" ", "".join(inner.out).replace(_MARK, "")).strip()
        if not display and not str(link.text).strip():
            # The pipe trick "[[Paris (band)|]]" shows "Paris".
            display = re.sub(r"\s*\(.*\)\s*$", "", raw_target.split(":")[-1]).strip()
        return display

    def _tag(self, tag: Tag) -> None:
        name = str(tag.tag).strip().lower()
        if name in _DROPPED_TAGS:
            return
        if name in _BREAK_TAGS:
            self.out.append("\n")
        if tag.contents is not None and not tag.self_closing:
            self.render(tag.contents.nodes)

    def _template(self, template: Template) -> None:
        name = _SPACES_RE.sub(" ", str(template.name).replace("_", " ")).strip().lower()
        pieces = _INLINE_TEMPLATES.get(name)
        if pieces is None:
            return
        for piece in pieces(template):
            if isinstance(piece, str):
                self.out.append(piece)
            else:
                self.render(piece.nodes)


_LINK_TRAIL_RE = re.compile(r"[a-z]+")
_SPACES_RE = re.compile(r"\s+")

# Clean-up of what dropped markup leaves behind; none of these can remove a _MARK.
_CLEANUPS = [
    (re.compile(r"__[A-Z]+__"), ""),  # magic words (__NOTOC__)
    (re.compile(r"'{2,}"), ""),  # unbalanced bold/italic quotes the parser left as text
    (re.compile(r"\s+"), " "),
    (re.compile(r"\(\s*(?:[,;:–—-]\s*)*\)"), ""),  # "()" "( ; )" left by a dropped template
    (re.compile(r"\[\s*\]"), ""),
    (re.compile(r"\(\s*(?:[,;:]\s*)+"), "("),  # "( ; , from Greek" -> "(from Greek"
    (re.compile(r"(?:\s*[,;])+\s*\)"), ")"),
    (re.compile(r"\(\s+"), "("),
    (re.compile(r"\s+\)"), ")"),
    (re.compile(r"\s+([,.;:!?])(?=\s|$)"), r"\1"),  # "word ," -> "word,"
    (re.compile(r" {2,}"), " "),
]


def _clean(text: str) -> str:
    for pattern, replacement in _CLEANUPS:
        text = pattern.sub(replacement, text)
    return text.strip()


def _take_marks(text: str) -> tuple[str, list[int]]:
    """Remove the _MARKs, returning the clean text and where each mark stood in it."""
    pieces = text.split(_MARK)
    offsets = []
    position = len(pieces[0])
    for piece in pieces[1:]:
        offsets.append(position)
        position += len(piece)
    return "".join(pieces), offsets


def article_lead(wikitext: str, namespaces: frozenset[str] = DEFAULT_NAMESPACES) -> Lead:
    """The clean lead paragraph of an article's wikitext, split into sentences, with its links.

    `namespaces`: lower-case namespace names of the wiki (links into them are not article links).
    Returns an empty `Lead` when nothing readable is left.
    """
    if _MARK in wikitext:  # never in real text, but a stray one would shift every link after it
        wikitext = wikitext.replace(_MARK, "")
    renderer = _Renderer(namespaces)
    renderer.render(mwparserfromhell.parse(lead_wikitext(wikitext)).nodes)
    text, offsets = _take_marks(_clean("".join(renderer.out)))
    if not text:
        return Lead([], [])
    sentences = split_sentences(text)
    starts = []
    position = 0
    for sentence in sentences:
        starts.append(position)
        position += len(sentence)
    links = [
        Link(target, _SPACES_RE.sub(" ", anchor).strip(), bisect.bisect_right(starts, offset) - 1)
        for (target, anchor), offset in zip(renderer.links, offsets)
    ]
    return Lead(sentences, links)


# --- sentences -----------------------------------------------------------------------------------

# Words that end in a period without ending the sentence (compared lower case, without the period).
_ABBREVIATIONS = frozenset(
    {
        "mr",
        "mrs",
        "ms",
        "dr",
        "st",
        "ste",
        "jr",
        "sr",
        "prof",
        "gen",
        "col",
        "lt",
        "maj",
        "sgt",
        "capt",
        "cmdr",
        "adm",
        "gov",
        "sen",
        "rep",
        "rev",
        "hon",
        "pres",
        "mt",
        "ft",
        "ave",
        "blvd",
        "rd",
        "no",
        "nos",
        "vol",
        "vols",
        "pp",
        "p",
        "ed",
        "eds",
        "fig",
        "figs",
        "inc",
        "ltd",
        "co",
        "corp",
        "bros",
        "vs",
        "v",
        "e.g",
        "i.e",
        "cf",
        "ca",
        "c",
        "approx",
        "est",
        "jan",
        "feb",
        "mar",
        "apr",
        "jun",
        "jul",
        "aug",
        "sep",
        "sept",
        "oct",
        "nov",
        "dec",
        "al",
        "op",
        "lit",
        "b",
        "d",
        "fl",
        "r",
        "a.k.a",
        "ph.d",
        "n.b",
        "viz",
        "sq",
        "ch",
        "sec",
        "dept",
        "univ",
    }
)

# A candidate end: ".", "!" or "?" (repeated), closing quotes/brackets, then whitespace.
_END_RE = re.compile(r"[.!?]+[\"'”’)\]]*(?=\s)")
_LAST_WORD_RE = re.compile(r"(\S+)$")
_DOTTED_RE = re.compile(r"^(?:[A-Za-z]\.)+[A-Za-z]$")  # "U.S" "J.R.R" (the final "." already cut)
_OPENERS = "\"'“‘(["


def _ends_sentence(text: str, end: re.Match) -> bool:
    after = end.end()
    while after < len(text) and text[after].isspace():
        after += 1
    if after < len(text) and text[after] in _OPENERS:
        after += 1
    if after >= len(text) or not (text[after].isupper() or text[after].isdigit()):
        return False  # the next word starts lower case (or nothing follows): not a new sentence
    if text[end.start()] != "." or end.group().startswith(".."):
        return True  # "!", "?" and "..." end a sentence when a capital follows
    word = _LAST_WORD_RE.search(text, max(0, end.start() - 40), end.start())
    if word is None:
        return True
    token = word.group(1).lstrip(_OPENERS)
    if len(token) == 1 and token.isalpha():
        return False  # an initial: "J. R. R. Tolkien"
    return token.lower() not in _ABBREVIATIONS and not _DOTTED_RE.match(token)


def split_sentences(text: str) -> list[str]:
    """Split a paragraph into sentences; the whitespace between two sentences starts the second.

    A sentence ends at ".", "!" or "?" (plus closing quotes/brackets) followed by whitespace and an
    upper-case letter or a digit. A period does not end a sentence after a known abbreviation ("St.",
    "Dr.", "c.", "Jan."...), an initial ("J."), or a dotted acronym ("U.S.", "J.R.R.").

    Limits (a rule-based splitter): a sentence that really ends in an abbreviation or acronym ("...in
    the U.S. The next") is not split; one that starts lower case ("...ends. iPhone sales") is not
    split; a period inside a title or a number followed by a capital ("Vol. 2. Part") may be split.
    """
    sentences = []
    start = 0
    for end in _END_RE.finditer(text):
        if _ends_sentence(text, end):
            sentences.append(text[start : end.end()])
            start = end.end()
    if start < len(text):
        sentences.append(text[start:])
    return sentences
