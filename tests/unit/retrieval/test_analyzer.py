"""The BM25 text analyzer (xh.retrieval.analyzer): its steps, its reasons, its fingerprint, its speed."""

from __future__ import annotations

import json
import pickle
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from xh.retrieval.analyzer import (
    EMPTY_TEXT,
    ENGLISH_STOP_WORDS,
    ONLY_STOP_WORDS,
    Analyzer,
    AnalyzerMismatchError,
)

pytestmark = pytest.mark.unit

# The default analyzer's fingerprint, written down: every saved index records it, so a change in
# what the analyzer does must show here. If you changed the analysis on purpose, bump
# ANALYZER_VERSION (indexes built before must be rebuilt) and update this string.
DEFAULT_FINGERPRINT = "xh-analyzer/1:snowball-english:bd4015db79f6"


def test_steps_normalise_lowercase_tokenise_drop_stop_words_and_stem():
    analyzer = Analyzer()
    question = "Which college did the Romanian singer study at?"
    assert analyzer.analyze(question) == ["colleg", "romanian", "singer", "studi"]
    # NFKC: the "ﬁ" ligature and full-width letters and digits become plain ones
    assert analyzer.analyze("ﬁlms of ＡＢＣ in １９９０") == ["film", "abc", "1990"]
    # digits are kept, alone or inside words; punctuation splits
    expected = ["apollo", "11", "1969", "1990s", "u2", "b", "52s"]
    assert analyzer.analyze("Apollo 11 (1969), the 1990s, U2's B-52s") == expected
    # stop words go before stemming; repeats stay (they count in BM25)
    assert analyzer.analyze("The film, the FILMS and the filming") == ["film", "film", "film"]
    # words that NLTK's list drops as contraction fragments but are real words are kept
    assert analyzer.analyze("Don won") == ["don", "won"]
    assert {"the", "which", "what", "s", "t"} <= ENGLISH_STOP_WORDS


def test_non_latin_scripts_are_tokenised_too():
    assert Analyzer().analyze("Zürich Москва 東京") == ["zürich", "москва", "東京"]


def test_reasons_for_no_terms():
    analyzer = Analyzer()
    assert analyzer.analyze_with_reason("") == ([], EMPTY_TEXT)
    assert analyzer.analyze_with_reason("  ?! -- ") == ([], EMPTY_TEXT)
    assert analyzer.analyze_with_reason("What is it that was there?") == ([], ONLY_STOP_WORDS)
    assert analyzer.analyze_with_reason("Who directed Alien?") == (["direct", "alien"], None)


def test_fingerprint_is_stable_and_follows_the_settings():
    assert Analyzer().fingerprint() == DEFAULT_FINGERPRINT
    assert Analyzer().fingerprint() == Analyzer(cache_size=10).fingerprint()  # the cache size decides nothing
    others = [
        Analyzer(stop_words=frozenset()),
        Analyzer(language="porter"),
        Analyzer(lowercase=False),
        Analyzer(normalization="NFC"),
        Analyzer(token_pattern=r"[a-z]+"),
    ]
    prints = {a.fingerprint() for a in others}
    assert len(prints) == len(others) and DEFAULT_FINGERPRINT not in prints
    json.dumps(Analyzer().settings())  # plain JSON, for manifests


def test_settings_round_trip_and_pickle():
    analyzer = Analyzer(stop_words=frozenset({"the"}), language="porter")
    rebuilt = Analyzer.from_settings(json.loads(json.dumps(analyzer.settings())))
    assert rebuilt == analyzer and rebuilt.fingerprint() == analyzer.fingerprint()
    analyzer.analyze("warm the cache with some words")
    copy = pickle.loads(pickle.dumps(analyzer))
    assert copy == analyzer and copy.analyze("the running dogs") == analyzer.analyze("the running dogs")


def test_settings_of_another_analyzer_are_refused():
    settings = Analyzer().settings()
    with pytest.raises(AnalyzerMismatchError, match="other-analyzer"):
        Analyzer.from_settings({**settings, "name": "other-analyzer"})
    with pytest.raises(AnalyzerMismatchError):
        Analyzer.from_settings({**settings, "stemmer_library": "PyStemmer 99.x"})
    with pytest.raises(AnalyzerMismatchError, match="query analyzer"):
        Analyzer().check_same(Analyzer(stop_words=frozenset()).fingerprint())


@pytest.mark.shared_data
def test_a_small_cache_gives_the_same_terms(hotpot_paragraphs):
    texts = hotpot_paragraphs[:300]
    assert Analyzer(cache_size=50).analyze_batch(texts) == Analyzer().analyze_batch(texts)


@pytest.mark.shared_data
def test_threads_share_one_analyzer(hotpot_paragraphs):
    texts = hotpot_paragraphs[:400]
    expected = Analyzer().analyze_batch(texts)
    shared = Analyzer(cache_size=500)  # small, so threads also race on clearing it
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda _: shared.analyze_batch(texts), range(4)))
    assert all(r == expected for r in results)


@pytest.mark.shared_data
def test_twenty_thousand_paragraphs_in_seconds(hotpot_paragraphs):
    texts = (hotpot_paragraphs * 5)[:20_000]
    analyzer = Analyzer()
    start = time.perf_counter()
    analyzer.analyze_batch(texts)
    elapsed = time.perf_counter() - start
    # ~0.5-1 s on one core; the bound leaves room for a loaded machine
    assert elapsed < 10, f"analyzing 20,000 paragraphs took {elapsed:.1f}s"


@pytest.fixture(scope="module")
def hotpot_paragraphs(shared_data) -> list[str]:
    records = json.loads((shared_data / "hotpotqa" / "hotpot_train_sample500.json").read_text())
    paragraphs = {}
    for record in records:
        for title, sentences in record["context"]:
            paragraphs.setdefault(title, title + " " + "".join(sentences))
    return list(paragraphs.values())
