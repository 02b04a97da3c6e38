"""One spelling of a Wikipedia title, shared by every reader, so that a link's target meets its page.

The same page is written many ways across the three dump formats:

    HotpotQA href        "political%20philosophy"        (URL-quoted, first letter as written)
    MediaWiki link       "[[political_philosophy#History]]"
    FEVER page id        "Gladiator_-LRB-2000_film-RRB-"  (PTB bracket tokens, underscores)

`normalize_title` maps all of them to the page's display title::

    >>> normalize_title("political%20philosophy")
    'Political philosophy'
    >>> normalize_title("Gladiator_-LRB-2000_film-RRB-")
    'Gladiator (2000 film)'
    >>> normalize_title("AT&amp;T#History")
    'AT&T'

and `fever_page_id` spells a title back the way FEVER's evidence refers to it::

    >>> fever_page_id("Gladiator (2000 film)")
    'Gladiator_-LRB-2000_film-RRB-'

Everything that compares titles (links to docs, redirects, supporting facts, FEVER evidence) should
go through `normalize_title`; it is idempotent: `normalize_title(normalize_title(t)) == normalize_title(t)`.
"""

from __future__ import annotations

import html
import re
from functools import lru_cache
from urllib.parse import unquote

__all__ = ["normalize_title", "cached_normalize_title", "fever_page_id", "FEVER_TOKENS"]

# FEVER (and the Penn Treebank tokenisation it inherits) writes brackets and colons as tokens.
FEVER_TOKENS = {
    "-LRB-": "(",
    "-RRB-": ")",
    "-LSB-": "[",
    "-RSB-": "]",
    "-LCB-": "{",
    "-RCB-": "}",
    "-COLON-": ":",
}

_FEVER_TOKEN_RE = re.compile("|".join(re.escape(token) for token in FEVER_TOKENS))
_TO_FEVER = str.maketrans({char: token for token, char in FEVER_TOKENS.items()} | {" ": "_"})
_SPACES_RE = re.compile(r"\s+")


def normalize_title(raw: str) -> str:
    """The canonical display title of the page that `raw` names (see the module docstring).

    Steps, in order: URL-unquote; FEVER tokens to brackets; HTML entities unescaped; underscores to
    spaces; drop a `#section` fragment; collapse whitespace; drop MediaWiki's leading colon
    (`[[:Category:X]]` names the page `Category:X`); upper-case the first letter (MediaWiki's
    "first-letter" case rule: the rest is kept as written). Returns "" when nothing is left
    (e.g. a same-page link `#History`).
    """
    title = raw
    if "%" in title:
        # MediaWiki forbids "%XX" in titles, so unquoting cannot damage a real title.
        title = unquote(title)
    if "-" in title:
        title = _FEVER_TOKEN_RE.sub(lambda m: FEVER_TOKENS[m.group()], title)
    if "&" in title:
        title = html.unescape(title)
    title = title.replace("_", " ")
    if "#" in title:
        title = title.split("#", 1)[0]
    title = _SPACES_RE.sub(" ", title).strip()
    if title.startswith(":"):
        title = title.lstrip(":").lstrip()
    return _upper_first(title)


# The readers' titles repeat a lot (link targets above all); normalising each distinct spelling once pays.
cached_normalize_title = lru_cache(maxsize=1 << 17)(normalize_title)


def _upper_first(title: str) -> str:
    if not title:
        return title
    first = title[0].upper()
    # A few letters upper-case to two characters ("ß" -> "SS"); MediaWiki keeps those as they are.
    return (first if len(first) == 1 else title[0]) + title[1:]


def fever_page_id(title: str) -> str:
    """The FEVER page id of a (normalised) title: spaces -> `_`, `(` -> `-LRB-`, `:` -> `-COLON-`, ...

    The inverse of `normalize_title` on FEVER ids: `normalize_title(fever_page_id(t)) == t` for
    every normalised title `t`.
    """
    return title.translate(_TO_FEVER)
