"""The text analyzer of BM25 retrieval: one function from text to terms, shared by index and queries.

A document and a question must be cut into terms the same way, or a question's terms never meet
the index's. So there is one `Analyzer`, its settings are recorded in every index it builds (as a
short `fingerprint()`), and an index refuses queries from an analyzer with another fingerprint.

The steps, in order:

    1. Unicode NFKC normalisation   ("ﬁlm" -> "film", full-width digits -> ASCII digits)
    2. lower-casing
    3. tokens = runs of word characters (`\\w+`: letters, digits, underscore; Unicode-aware),
       so "Andrew's 1990s" -> "andrew", "s", "1990s"
    4. English stop words dropped (`ENGLISH_STOP_WORDS`, checked before stemming)
    5. Snowball English (Porter2) stemming by PyStemmer, a C library: "studied" -> "studi"

Usage:

    from xh.retrieval.analyzer import Analyzer
    analyzer = Analyzer()
    analyzer.analyze("Which college did the Romanian singer study at?")
    # ['colleg', 'romanian', 'singer', 'studi']
    analyzer.analyze_batch(paragraphs)             # list of term lists
    terms, reason = analyzer.analyze_with_reason("the of")   # [], ONLY_STOP_WORDS
    analyzer.fingerprint()                         # 'xh-analyzer/1:...' (recorded by indexes)

Speed: stemming is the costly step, so the stem of every distinct token is cached (stop words are
cached as ""), and a token seen before costs one dict look-up. The cache is bounded
(`cache_size`) and simply cleared when full, which keeps memory flat on a corpus with millions of
distinct tokens. An `Analyzer` is cheap to pickle (Ray ships it to workers): only its settings
travel, the stemmer and the cache are rebuilt on the other side.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass, field

import Stemmer  # PyStemmer: the Snowball stemmers compiled to C

__all__ = ["Analyzer", "ENGLISH_STOP_WORDS", "EMPTY_TEXT", "ONLY_STOP_WORDS", "AnalyzerMismatchError"]

# Why a query has no terms (reasons callers can show; `xh.retrieval.bm25` adds its own).
EMPTY_TEXT = "empty query: no words in the text"
ONLY_STOP_WORDS = "only stop words in the query"

# NLTK's English stop-word list, in the form `\w+` tokenisation sees it: contractions arrive as
# fragments ("don't" -> "don", "t"), so the apostrophe forms are left out, and so are the
# fragments that are also ordinary words or names ("won", "don", "haven", "ma", "ain", "shan"),
# since a question like "which film won ..." needs them.
ENGLISH_STOP_WORDS = frozenset(
    """
    i me my myself we our ours ourselves you your yours yourself yourselves he him his himself
    she her hers herself it its itself they them their theirs themselves what which who whom
    this that these those am is are was were be been being have has had having do does did doing
    a an the and but if or because as until while of at by for with about against between into
    through during before after above below to from up down in out on off over under again
    further then once here there when where why how all any both each few more most other some
    such no nor not only own same so than too very s t can will just should now d ll m o re ve y
    aren couldn didn doesn hadn hasn isn mightn mustn needn shouldn wasn weren wouldn
    """.split()
)

ANALYZER_NAME = "xh-analyzer"
ANALYZER_VERSION = 1  # bump when a step changes in a way settings do not show


class AnalyzerMismatchError(ValueError):
    """An index was built with one analyzer and is asked to use another."""


@dataclass(frozen=True)
class Analyzer:
    """Text -> list of terms (see the module docstring for the steps).

    The settings are fields, so two analyzers with equal settings are equal and have the same
    `fingerprint()`. `cache_size` only bounds memory and is not part of the fingerprint.
    """

    language: str = "english"  # the Snowball algorithm (`Stemmer.algorithms()` lists them)
    stop_words: frozenset[str] = ENGLISH_STOP_WORDS
    normalization: str = "NFKC"
    lowercase: bool = True
    token_pattern: str = r"\w+"
    cache_size: int = field(default=2_000_000, compare=False)

    # Built in __post_init__, never compared, never pickled.
    _regex: re.Pattern = field(init=False, repr=False, compare=False)
    _stemmer: Stemmer.Stemmer = field(init=False, repr=False, compare=False)
    _stems: dict = field(init=False, repr=False, compare=False)
    _lock: threading.Lock = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.normalization not in ("NFC", "NFKC", "NFD", "NFKD"):
            raise ValueError(f"normalization must be one of NFC, NFKC, NFD, NFKD, got {self.normalization!r}")
        if not isinstance(self.stop_words, frozenset):
            object.__setattr__(self, "stop_words", frozenset(self.stop_words))
        object.__setattr__(self, "_regex", re.compile(self.token_pattern))
        object.__setattr__(self, "_stemmer", Stemmer.Stemmer(self.language))  # KeyError-like for unknown languages
        # token -> stem, or "" for a stop word (falsy, so one look-up both filters and stems)
        object.__setattr__(self, "_stems", {w: "" for w in self.stop_words})
        # PyStemmer's stemmer objects are not safe to share between threads; the lock guards misses only.
        object.__setattr__(self, "_lock", threading.Lock())

    def __reduce__(self):
        return (
            Analyzer,
            (self.language, self.stop_words, self.normalization, self.lowercase, self.token_pattern, self.cache_size),
        )

    # -- settings ------------------------------------------------------------------------------

    def settings(self) -> dict:
        """Everything that decides the output, as plain JSON values (recorded in index manifests)."""
        return {
            "name": ANALYZER_NAME,
            "version": ANALYZER_VERSION,
            "normalization": self.normalization,
            "lowercase": self.lowercase,
            "token_pattern": self.token_pattern,
            "stop_words": sorted(self.stop_words),
            "stemmer": f"snowball:{self.language}",
            "stemmer_library": f"PyStemmer {Stemmer.version().split('.')[0]}.x",
        }

    def fingerprint(self) -> str:
        """A short stable string naming these settings, e.g. 'xh-analyzer/1:snowball-english:3f2a9c1d0b7e'."""
        digest = hashlib.sha256(json.dumps(self.settings(), sort_keys=True).encode()).hexdigest()[:12]
        return f"{ANALYZER_NAME}/{ANALYZER_VERSION}:snowball-{self.language}:{digest}"

    @classmethod
    def from_settings(cls, settings: dict) -> Analyzer:
        """Rebuild the analyzer `settings()` describes; refuses settings from another analyzer version."""
        if settings.get("name") != ANALYZER_NAME or settings.get("version") != ANALYZER_VERSION:
            raise AnalyzerMismatchError(
                f"analyzer settings are for {settings.get('name')}/{settings.get('version')}, "
                f"this code has {ANALYZER_NAME}/{ANALYZER_VERSION}"
            )
        analyzer = cls(
            language=settings["stemmer"].split(":", 1)[1],
            stop_words=frozenset(settings["stop_words"]),
            normalization=settings["normalization"],
            lowercase=settings["lowercase"],
            token_pattern=settings["token_pattern"],
        )
        if analyzer.settings() != settings:
            raise AnalyzerMismatchError(
                f"cannot rebuild the analyzer {settings} with this code "
                f"(installed: {analyzer.settings()['stemmer_library']})"
            )
        return analyzer

    def check_same(self, fingerprint: str, what: str = "the index") -> None:
        """Raise `AnalyzerMismatchError` unless `fingerprint` is this analyzer's."""
        if fingerprint != self.fingerprint():
            raise AnalyzerMismatchError(
                f"{what} was built with analyzer {fingerprint!r}, but the query analyzer is {self.fingerprint()!r}: "
                "queries must be analyzed exactly as the documents were (rebuild the index, or load it without "
                "passing an analyzer to use the one it records)"
            )

    # -- analysis ------------------------------------------------------------------------------

    def tokens(self, text: str) -> list[str]:
        """Steps 1-3: the raw word tokens, stop words included, not stemmed."""
        text = unicodedata.normalize(self.normalization, text)
        return self._regex.findall(text.lower() if self.lowercase else text)

    def analyze(self, text: str) -> list[str]:
        """The terms of a text: tokens without stop words, stemmed. Repeats are kept (they count in BM25)."""
        words = self.tokens(text)
        stems = self._stems
        try:
            return [s for s in map(stems.__getitem__, words) if s]
        except KeyError:  # some token not seen before: stem the new ones in one call
            known = self._learn(words)
            return [s for s in map(known.__getitem__, words) if s]

    def analyze_batch(self, texts: Iterable[str]) -> list[list[str]]:
        return [self.analyze(t) for t in texts]

    def analyze_with_reason(self, text: str) -> tuple[list[str], str | None]:
        """The terms, and why there are none when there are none (`EMPTY_TEXT` or `ONLY_STOP_WORDS`)."""
        terms = self.analyze(text)
        if terms:
            return terms, None
        return terms, (ONLY_STOP_WORDS if self.tokens(text) else EMPTY_TEXT)

    def _learn(self, words: list[str]) -> dict[str, str]:
        """Stem the words not in the cache (one PyStemmer call); return {word: stem or ""} for all of them."""
        distinct = set(words)
        stems = self._stems
        with self._lock:
            new = [w for w in distinct if w not in stems]
            if len(stems) + len(new) > self.cache_size:  # keep memory flat: start again from the stop words
                stems.clear()
                stems.update((w, "") for w in self.stop_words)
                new = [w for w in distinct if w not in stems]
            stems.update(zip(new, self._stemmer.stemWords(new)))
            return {w: stems[w] for w in distinct}
