"""The path scorer (`xh.retrieval.paths`): candidate pairs and their features, training, saving, and the
retriever putting the chosen pair first."""

import numpy as np
import pytest

from xh.config import ConfigError, RetrieveConfig
from xh.retrieval.candidates import Passages, Retriever
from xh.retrieval.paths import FEATURES, PathCandidates, PathScorer, path_candidates

from .test_rerank import _retrieval_parts


def _feature(candidates: PathCandidates, pair: tuple[str, str], name: str) -> float:
    return float(candidates.features[candidates.pairs.index(pair), FEATURES.index(name)])


def test_pairs_join_the_first_ir_docs_with_each_other_and_with_their_linked_docs():
    ir = ["a", "b", "c", "z"]  # z is past `top`
    # two question terms; rows: terms, columns: the docs asked for, in order
    weights = {"a": [2.0, 0.0], "b": [1.0, 1.0], "c": [0.0, 0.0], "x": [0.0, 3.0], "y": [0.0, 0.5], "w": [0.1, 0.0]}
    links = {"a": {"x": "out", "y": "in", "w": "both"}, "b": {"a": "out"}, "c": {}}

    def term_weights(ids):
        return np.array([weights[d] for d in ids]).T

    found = path_candidates(ir, term_weights, lambda d: links[d], {"c"}, top=3, neighbours=2)
    assert found.features.shape == (len(found.pairs), len(FEATURES))
    # a pairs with b, c and its two linked docs of highest BM25 (x: 3.0, y: 0.5; w: 0.1 is cut)
    assert [b for a, b in found.pairs if a == "a"] == ["b", "c", "x", "y"]
    assert [b for a, b in found.pairs if a == "b"] == ["a", "c"]  # a is already a first doc
    assert not [p for p in found.pairs if "z" in p or p[0] in ("x", "y")]
    assert _feature(found, ("a", "x"), "a_links_b") == 1 and _feature(found, ("a", "x"), "b_links_a") == 0
    assert _feature(found, ("a", "y"), "b_links_a") == 1 and _feature(found, ("a", "y"), "a_links_b") == 0
    assert _feature(found, ("b", "a"), "a_links_b") == 1 and _feature(found, ("a", "b"), "b_links_a") == 0
    # per document: BM25 over BM25's first ir document's (a: 2.0), 1 / (1 + ir rank), in the first `top`, named
    assert _feature(found, ("a", "x"), "a_bm25") == pytest.approx(1.0)
    assert _feature(found, ("a", "x"), "b_bm25") == pytest.approx(1.5)
    assert _feature(found, ("a", "x"), "b_rank") == pytest.approx(1 / 5)  # not in the ir list: rank 4
    assert _feature(found, ("b", "c"), "b_rank") == pytest.approx(1 / 3)
    assert _feature(found, ("a", "x"), "b_top") == 0 and _feature(found, ("a", "c"), "b_top") == 1
    assert _feature(found, ("a", "c"), "b_named") == 1 and _feature(found, ("a", "c"), "a_named") == 0
    # shares of the question's terms: a has one of two, x the other, together both
    assert _feature(found, ("a", "x"), "a_terms") == 0.5 and _feature(found, ("a", "x"), "pair_terms") == 1.0
    assert _feature(found, ("a", "c"), "pair_terms") == 0.5
    assert path_candidates([], term_weights, lambda d: {}, set(), top=3, neighbours=2).pairs == []


def _groups(rng, n):
    """Questions whose gold pair is the one where the first links to the second; other pairs score
    higher on BM25, so a scorer that reads BM25 alone picks wrong."""
    groups, gold = [], []
    for q in range(n):
        pairs = [(f"{q}-{i}", f"{q}-{i + 1}") for i in range(12)]
        features = rng.random((12, len(FEATURES))).astype(np.float32)
        features[:, FEATURES.index("a_links_b")] = 0
        k = int(rng.integers(12))
        features[k, FEATURES.index("a_links_b")] = 1
        features[k, FEATURES.index("a_bm25")] = 0.1
        groups.append(PathCandidates(pairs, features))
        gold.append(set(pairs[k]))
    return groups, gold


def test_a_fitted_scorer_learns_what_marks_the_gold_pair_and_saves_exactly(tmp_path):
    rng = np.random.default_rng(0)
    train, train_gold = _groups(rng, 80)
    test, test_gold = _groups(rng, 40)
    # a question without its gold pair among the candidates is left out of training
    scorer = PathScorer.fit([*train, PathCandidates([("u", "v")], train[0].features[:1])], [*train_gold, {"p", "q"}])
    assert scorer.metrics["usable"] == 80 and scorer.metrics["questions"] == 81
    hits = [set(scorer.best_pair(g)) == gold for g, gold in zip(test, test_gold)]
    assert sum(hits) / len(hits) >= 0.95
    assert scorer.best_pair(PathCandidates([], np.zeros((0, len(FEATURES)), np.float32))) is None

    scorer.save(str(tmp_path / "scorer"))
    loaded = PathScorer.load(str(tmp_path / "scorer"))
    np.testing.assert_allclose(loaded.score(test[0].features), scorer.score(test[0].features), rtol=1e-5)
    with pytest.raises(FileNotFoundError, match="no path scorer at .*xh retrieve paths"):
        PathScorer.load(str(tmp_path / "nothing"))
    with pytest.raises(ValueError, match="nothing to learn"):
        PathScorer.fit(train[:2], [{"p", "q"}, {"r", "s"}])


def test_the_retriever_puts_the_chosen_pair_first_and_it_beats_bm25_on_bridge_questions(synth_tables):
    from xh.retrieval.evaluate import retrieval_report

    tables, questions = synth_tables
    docs, parts = _retrieval_parts(tables)
    by_title = dict(zip(docs["title"].to_pylist(), docs["doc_id"].to_pylist()))
    texts = {d: (t, x) for d, t, x in zip(*(docs[c].to_pylist() for c in ("doc_id", "title", "text")))}
    train, held_out = questions[:40], questions[40:]
    settings = RetrieveConfig(ir_candidates=20, path_top=6)
    plain = Retriever(*parts, settings)
    groups = plain.question_paths([q["question"] for q in train])
    scorer = PathScorer.fit(groups, [{by_title[t] for t, _ in q["supporting_facts"]} for q in train])

    scored = Retriever(*parts, settings, path_scorer=scorer)
    qids, asked = [q["_id"] for q in held_out], [q["question"] for q in held_out]
    rows = scored.candidates(qids, asked)
    for q, found in zip(held_out, scored.question_paths(asked)):
        ir = sorted((r for r in rows if r["qid"] == q["_id"] and r["source"] == "ir"), key=lambda r: r["rank"])
        if found.pairs:
            assert tuple(r["doc_id"] for r in ir[:2]) == scorer.best_pair(found)
            assert {r["ranker"] for r in ir} == {"paths"}
            assert len({r["doc_id"] for r in ir}) == len(ir)  # the pair is not listed twice

    # expansion neighbours: ranked by the path scorer (paired with the chosen pair), or by BM25 when told so
    exp = [r for r in rows if r["source"] == "exp"]
    assert exp and {r["ranker"] for r in exp} == {"paths"}
    for qid in qids[:5]:
        mine = sorted((r for r in exp if r["qid"] == qid), key=lambda r: r["rank"])
        assert [r["score"] for r in mine] == sorted((r["score"] for r in mine), reverse=True)
    by_bm25 = Retriever(*parts, settings.model_copy(update={"path_expansion": False}), path_scorer=scorer)
    assert {r["ranker"] for r in by_bm25.candidates(qids, asked) if r["source"] == "exp"} == {"bm25"}

    def recall(candidates):
        gold = [
            q | {"qid": q["_id"], "supporting_facts": [{"title": t} for t, _ in q["supporting_facts"]]}
            for q in held_out
        ]
        return retrieval_report(gold, candidates, texts)["all"]["supp_recall@2"]

    assert recall(rows) > recall(plain.candidates(qids, asked))


def test_a_path_reranker_and_a_path_scorer_are_alternatives(synth_tables):
    docs, parts = _retrieval_parts(synth_tables[0])
    with pytest.raises(ConfigError, match="alternatives"):
        Retriever(*parts, RetrieveConfig(), passages=Passages(docs), path_reranker=object(), path_scorer=object())
