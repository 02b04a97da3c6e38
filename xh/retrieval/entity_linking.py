"""Commonness (CMNS) entity linking: the documents a question names, from Wikipedia's own anchors.

Transformer-XH's HotpotQA graphs take D_el = "entities linked in the question, top 1 per surface
form" (TagMe + CMNS). Here a *surface form* is a lower-cased piece of text that Wikipedia uses as a
link anchor (the `anchors` table: surface -> doc -> count) or that equals a page title, and the
*commonness* of a doc for a surface is the share of the surface's links that point to it::

    commonness(s, d) = count(s -> d) / sum over d' of count(s -> d')

Usage::

    linker = EntityLinker.load("runs/demo/tables")          # reads <root>/anchors and <root>/docs
    linker.link("Where was the director of The Hour of Armore born?")
    # [EntityLink(surface='The Hour of Armore', doc_id='413', score=1.0, start=26, end=44)]
    linker.link_batch(questions)                              # one list of links per question
    linker.lookup("east ebbridge")          # [('2', 0.996, 124.0), ('308', 0.004, 0.5)]: doc, commonness, count

or, from tables already in memory, `EntityLinker.from_tables(anchors, docs_titles)`.

The rules, in the order they apply:

1. Tokens: runs of word characters, kept whole across inner `' ’ . - / & +` ("AC/DC", "O'Brien",
   "U.S", "Jean-Paul"). A candidate is any run of 1..`max_ngram` tokens; its surface is the question
   text from the first token's start to the last token's end (so "St. Louis" keeps its dot), lower-
   cased, with `’` read as `'` and whitespace collapsed (`normalize_surface`, applied to anchors too).
   Two variants are also tried: with a following "." ("Washington D.C." -> "d.c."; "(born 1972)" gets
   its ")" the same way) and without a final possessive "'s" ("Pajari's" -> "pajari").
2. Skipped surfaces: those shorter than 2 characters, those made only of stop words (`STOP_WORDS`:
   "the", "which", "of the", ... so "The Who" is never linked either), and, by default, those made
   only of digits and punctuation (years are linked so often in Wikipedia that their commonness
   says nothing about the question) and those written without any upper-case letter in the
   question (`require_capital`). The last one stands in for TagMe's link probability, which needs
   counts of unlinked text that these tables do not have: "film" or "country" are anchors whose
   top commonness is high, yet a question almost never means the page. In 500 real HotpotQA train
   questions, 532 supporting-fact titles occur in the question and 1 of them ("fast fashion") is
   written all in lower case.
3. Titles are surfaces too: every doc's title gets a pseudo-count of `title_count` (default 1) for
   its lower-cased title, and `stripped_title_count` (default 0.5) for the title without a trailing
   parenthetical disambiguator ("Mara Quinn (born 1972)" -> "mara quinn"). They add to the anchor
   counts (and to the denominator), so a page nobody links to can still be found by its name, and a
   plain title beats a disambiguated one when neither has links.
4. Entities kept per surface: the `per_surface` (default 1) highest-commonness docs among those
   with count >= `min_count` (default 0: all; pseudo-counts included) and commonness >=
   `min_commonness` (default 0). A surface with no doc left is not a candidate. Ties: lower doc id.
5. Overlaps, TagMe-like "longest match wins": candidates are taken longest first (most tokens, then
   most characters, then leftmost) and one that overlaps an already taken span is dropped. So "Mount
   Linstone State University" hides "Mount Linstone", and "the University of X" matches the title
   "University of X" (the longer "the university of x" is not a surface).

Memory. The index holds no Python object per surface: each surface is a 64-bit blake2b key in a
sorted array (a batch's lookups are one `numpy.searchsorted`), its entries are CSR slices of an
int32 doc index and a float32 count (16 bytes per surface, 8 per (surface, doc) entry), and doc ids
are one Arrow string array, so a Wikipedia-sized table (~10M anchor rows, 5M titles) fits a query
actor, where a dict of Python strings would not (measured size and speed: docs/results.md). Two
surfaces sharing a 64-bit key (odds ~1e-6 at 10M surfaces) would share entities; that risk is accepted.

No Ray here: a Ray driver builds one `EntityLinker` per actor (`load` once, then `link_batch`).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Sequence
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from xh import schemas
from xh.retrieval.arrays import sorted_codes
from xh.storage.store import Location, located

__all__ = [
    "EntityLink",
    "EntityLinker",
    "STOP_WORDS",
    "normalize_surface",
    "strip_disambiguator",
    "surface_key",
    "tokenize",
]

# A small English stop-word list: question words, articles, pronouns, auxiliaries, prepositions.
STOP_WORDS = frozenset(
    """
    a about above after again against all also am an and any are as at be because been before being
    below between both but by can could did do does doing down during each few for from further had
    has have having he her here hers herself him himself his how i if in into is it its itself just
    me more most my myself no nor not now of off on once only or other our ours ourselves out over
    own same she should so some such than that the their theirs them themselves then there these
    they this those through to too under until up very was we were what when where which while who
    whom whose why will with would you your yours yourself yourselves
    """.split()
)

# Word characters, kept together across one inner joiner: "AC/DC", "O'Brien", "U.S", "Jean-Paul".
TOKEN_RE = re.compile(r"\w+(?:['’./\-&+]\w+)*")
# A trailing parenthetical disambiguator: "Mara Quinn (born 1972)", "Mercury (planet)".
DISAMBIGUATOR_RE = re.compile(r"\s*\([^()]*\)\s*$")
_NUMERIC_RE = re.compile(r"^[\d\W_]+$")
_POSSESSIVES = ("'s", "’s")


class EntityLink(NamedTuple):
    """One linked entity: the question text `question[start:end]` (`surface`) names doc `doc_id`."""

    surface: str  # as written in the question; its lookup key is normalize_surface(surface)
    doc_id: str
    score: float  # commonness of doc_id for the surface
    start: int
    end: int


def normalize_surface(text: str) -> str:
    """The lookup key of a surface form: lower-cased, `’` as `'`, whitespace collapsed and trimmed."""
    return " ".join(text.lower().replace("’", "'").split())


def strip_disambiguator(title: str) -> str:
    """A title without its trailing parenthetical: "Mara Quinn (born 1972)" -> "Mara Quinn"."""
    return DISAMBIGUATOR_RE.sub("", title)


def tokenize(text: str) -> list[tuple[int, int]]:
    """(start, end) character offsets of the tokens of `text` (see rule 1 in the module docstring)."""
    return [m.span() for m in TOKEN_RE.finditer(text)]


def surface_key(surface: str) -> int:
    """The 64-bit key of an already normalised surface: stable across processes (unlike `hash`)."""
    return int.from_bytes(hashlib.blake2b(surface.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "little")


def _keys_of(surfaces: Iterable[str], count: int) -> np.ndarray:
    """Normalise and key many raw surfaces at once (about 0.5 µs each)."""
    digests = (
        hashlib.blake2b(normalize_surface(s).encode("utf-8", "surrogatepass"), digest_size=8).digest() for s in surfaces
    )
    return np.fromiter(digests, dtype="S8", count=count).view("<u8")


class _Candidate(NamedTuple):
    start: int
    end: int
    tokens: int
    row: int  # the surface's row in the index


class EntityLinker:
    """A commonness entity linker over an in-memory surface index (see the module docstring).

    Build it with `from_tables` or `load`; the keyword arguments of both are the linking rules:

    - `max_ngram` (6): longest candidate, in tokens.
    - `per_surface` (1): docs kept per matched surface (the paper keeps the top 1).
    - `min_commonness` (0.0), `min_count` (0): an entity needs both to be kept.
    - `skip_numeric` (True): never link surfaces of only digits and punctuation.
    - `require_capital` (True): never link surfaces written without an upper-case letter.
    - `stop_words` (`STOP_WORDS`): surfaces made only of these are never linked.
    - `title_count` (1.0), `stripped_title_count` (0.5): pseudo-counts of title matches (build time).

    The query-time rules are plain attributes and may be changed after building.
    """

    def __init__(
        self,
        keys: np.ndarray,
        offsets: np.ndarray,
        entry_docs: np.ndarray,
        entry_counts: np.ndarray,
        doc_ids: pa.Array,
        *,
        max_ngram: int = 6,
        per_surface: int = 1,
        min_commonness: float = 0.0,
        min_count: float = 0.0,
        skip_numeric: bool = True,
        require_capital: bool = True,
        stop_words: Iterable[str] = STOP_WORDS,
    ) -> None:
        # Surface row r: key keys[r]; its entries are offsets[r]:offsets[r+1], by count descending.
        self.keys, self.offsets = keys, offsets
        self.entry_docs, self.entry_counts = entry_docs, entry_counts
        self.doc_ids = doc_ids  # doc index -> doc id (sorted, so ties break by doc id)
        if max_ngram < 1 or per_surface < 1:
            raise ValueError("max_ngram and per_surface must be >= 1")
        self.max_ngram, self.per_surface = max_ngram, per_surface
        self.min_commonness, self.min_count = min_commonness, min_count
        self.skip_numeric, self.require_capital = skip_numeric, require_capital
        self.stop_words = frozenset(w.lower() for w in stop_words)

    # --- building ----------------------------------------------------------------------------

    @classmethod
    def from_tables(
        cls,
        anchors: pa.Table,
        docs_titles: pa.Table | None = None,
        *,
        title_count: float = 1.0,
        stripped_title_count: float = 0.5,
        **rules,
    ) -> EntityLinker:
        """Index an `anchors` table (surface, doc_id, count) and a docs table (doc_id, title).

        Anchor surfaces are normalised again (`normalize_surface`), so rows that differ only in
        case or spacing add up. Titles are added as pseudo-counts (rule 3); pass `docs_titles=None`
        or zero counts to link from anchors alone.
        """
        parts_keys, parts_docs, parts_counts = [], [], []

        # Anchors: normalise and key each distinct raw surface once, then spread to the rows.
        raw = pc.dictionary_encode(anchors["surface"].combine_chunks())
        unique_keys = _keys_of(raw.dictionary.to_pylist(), len(raw.dictionary))
        parts_keys.append(unique_keys[raw.indices.to_numpy(zero_copy_only=False)])
        parts_docs.append(anchors["doc_id"].combine_chunks())
        parts_counts.append(anchors["count"].to_numpy().astype(np.float64))

        if docs_titles is not None and docs_titles.num_rows:
            titles = docs_titles["title"].to_pylist()
            doc_column = docs_titles["doc_id"].combine_chunks()
            if title_count > 0:
                parts_keys.append(_keys_of(titles, len(titles)))
                parts_docs.append(doc_column)
                parts_counts.append(np.full(len(titles), title_count, np.float64))
            if stripped_title_count > 0:
                stripped = [strip_disambiguator(t) for t in titles]
                differs = np.fromiter((s != t and s.strip() != "" for s, t in zip(stripped, titles)), bool, len(titles))
                kept = [s for s, d in zip(stripped, differs) if d]
                parts_keys.append(_keys_of(kept, len(kept)))
                parts_docs.append(doc_column.filter(pa.array(differs)))
                parts_counts.append(np.full(len(kept), stripped_title_count, np.float64))

        keys = np.concatenate(parts_keys) if parts_keys else np.empty(0, np.uint64)
        counts = np.concatenate(parts_counts) if parts_counts else np.empty(0, np.float64)
        doc_index, doc_ids = sorted_codes(pa.chunked_array(parts_docs, pa.string()))
        return cls._from_arrays(keys, doc_index, counts, doc_ids, rules)

    @classmethod
    def _from_arrays(cls, keys, doc_index, counts, doc_ids, rules) -> EntityLinker:
        """Sum counts per (key, doc), order each surface's docs by count, and lay them out as CSR."""
        keep = counts > 0
        keys, doc_index, counts = keys[keep], doc_index[keep], counts[keep]
        order = np.lexsort((doc_index, keys))
        keys, doc_index, counts = keys[order], doc_index[order], counts[order]
        if len(keys):
            new_pair = np.ones(len(keys), bool)
            new_pair[1:] = (keys[1:] != keys[:-1]) | (doc_index[1:] != doc_index[:-1])
            starts = np.flatnonzero(new_pair)
            keys, doc_index, counts = keys[starts], doc_index[starts], np.add.reduceat(counts, starts)
        # Within a surface: highest count first, then the lower doc index (= lower doc id).
        order = np.lexsort((doc_index, -counts, keys))
        keys, doc_index, counts = keys[order], doc_index[order], counts[order]
        surface_keys, first = np.unique(keys, return_index=True)
        offsets = np.append(first, len(keys)).astype(np.int64)
        return cls(surface_keys, offsets, doc_index.astype(np.int32), counts.astype(np.float32), doc_ids, **rules)

    @classmethod
    def load(cls, tables: Location | str, **options) -> EntityLinker:
        """Read `<tables>/anchors` and the `doc_id, title` columns of `<tables>/docs` (local or s3://)."""
        fs, root = located(tables).fs_path()
        anchors = pq.read_table(f"{root}/anchors", filesystem=fs, schema=schemas.ANCHORS)
        docs = pq.read_table(f"{root}/docs", filesystem=fs, schema=schemas.DOCS, columns=["doc_id", "title"])
        return cls.from_tables(anchors, docs, **options)

    # --- size --------------------------------------------------------------------------------

    @property
    def num_surfaces(self) -> int:
        return len(self.keys)

    @property
    def num_entries(self) -> int:
        return len(self.entry_docs)

    @property
    def nbytes(self) -> int:
        """Memory held by the index's arrays."""
        arrays = (self.keys, self.offsets, self.entry_docs, self.entry_counts)
        return sum(a.nbytes for a in arrays) + self.doc_ids.nbytes

    # --- lookups -----------------------------------------------------------------------------

    def lookup(self, surface: str) -> list[tuple[str, float, float]]:
        """Every doc of a surface form as (doc_id, commonness, count), best first; no rules applied."""
        row = self._rows(np.array([surface_key(normalize_surface(surface))], np.uint64))[0]
        if row < 0:
            return []
        lo, hi = self.offsets[row], self.offsets[row + 1]
        counts = self.entry_counts[lo:hi].astype(np.float64)
        total = counts.sum()
        docs = self.entry_docs[lo:hi]
        return [(self.doc_ids[int(d)].as_py(), float(c / total), float(c)) for d, c in zip(docs, counts)]

    def link(self, question: str) -> list[EntityLink]:
        return self.link_batch([question])[0]

    def link_batch(self, questions: Sequence[str]) -> list[list[EntityLink]]:
        """The entity links of each question, ordered by position (then score)."""
        spans = [self._spans(q) for q in questions]
        # One vectorised lookup for every candidate of the batch.
        keys = np.fromiter((key for per_q in spans for (_, _, _, key) in per_q), np.uint64)
        rows = self._rows(keys)
        results, at = [], 0
        entities_of: dict[int, list[tuple[int, float]]] = {}  # row -> kept (doc index, commonness)
        for question, per_q in zip(questions, spans):
            candidates = []
            for (start, end, tokens, _), row in zip(per_q, rows[at : at + len(per_q)]):
                if row < 0:
                    continue
                row = int(row)
                if row not in entities_of:
                    entities_of[row] = self._kept_entities(row)
                if entities_of[row]:
                    candidates.append(_Candidate(start, end, tokens, row))
            at += len(per_q)
            links = []
            for c in _longest_first(candidates):
                surface = question[c.start : c.end]
                for doc, score in entities_of[c.row]:
                    links.append(EntityLink(surface, self.doc_ids[doc].as_py(), score, c.start, c.end))
            links.sort(key=lambda link: (link.start, -link.score, link.doc_id))
            results.append(links)
        return results

    def _rows(self, keys: np.ndarray) -> np.ndarray:
        """The index row of each key, or -1."""
        if not len(self.keys) or not len(keys):
            return np.full(len(keys), -1, np.int64)
        pos = np.searchsorted(self.keys, keys)
        pos_clipped = np.minimum(pos, len(self.keys) - 1)
        return np.where(self.keys[pos_clipped] == keys, pos_clipped, -1)

    def _kept_entities(self, row: int) -> list[tuple[int, float]]:
        """Rule 4: the top `per_surface` (doc index, commonness) of a surface that pass the minimums."""
        lo, hi = self.offsets[row], self.offsets[row + 1]
        counts = self.entry_counts[lo:hi].astype(np.float64)
        commonness = counts / counts.sum()
        ok = (counts >= self.min_count) & (commonness >= self.min_commonness)
        return [(int(d), float(s)) for d, s in zip(self.entry_docs[lo:hi][ok], commonness[ok])][: self.per_surface]

    def _spans(self, question: str) -> list[tuple[int, int, int, int]]:
        """Rules 1-2: every (start, end, tokens, key) worth looking up in a question."""
        tokens = tokenize(question)
        words = [question[s:e].lower() for s, e in tokens]
        out, seen = [], set()
        for i in range(len(tokens)):
            all_stop = True
            for j in range(i, min(i + self.max_ngram, len(tokens))):
                all_stop = all_stop and words[j] in self.stop_words
                if all_stop:  # rule 2
                    continue
                start, end = tokens[i][0], tokens[j][1]
                ends = [end]
                if question[end : end + 1] == "." or (question[end : end + 1] == ")" and "(" in question[start:end]):
                    ends.append(end + 1)
                if words[j].endswith(_POSSESSIVES) and end - 2 > start:
                    ends.append(end - 2)
                for e in ends:
                    text = question[start:e]
                    if self.require_capital and text.islower():  # islower: cased letters, none upper
                        continue
                    surface = normalize_surface(text)
                    if len(surface) < 2 or (self.skip_numeric and _NUMERIC_RE.match(surface)):
                        continue
                    if (start, e) not in seen:
                        seen.add((start, e))
                        out.append((start, e, j - i + 1, surface_key(surface)))
        return out


def _longest_first(candidates: list[_Candidate]) -> list[_Candidate]:
    """Rule 5: keep the longest candidates, dropping any that overlaps one already kept."""
    kept: list[_Candidate] = []
    for c in sorted(candidates, key=lambda c: (-c.tokens, -(c.end - c.start), c.start)):
        if all(c.end <= k.start or c.start >= k.end for k in kept):
            kept.append(c)
    return kept
