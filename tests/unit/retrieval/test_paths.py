"""The path scorer (`xh.retrieval.paths`): candidate pairs and their features, training, saving, and the
retriever putting the chosen pair first."""

import json

import numpy as np
import pytest

from xh.config import ConfigError, RetrieveConfig
from xh.retrieval.candidates import Passages, Retriever
from xh.retrieval.paths import (
    FEATURES,
    SCORER_FILE,
    PathCandidates,
    PathScorer,
    PathScorerFileError,
    path_candidates,
)

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


def _saved_scorer(folder) -> dict:
    """A small valid scorer saved under `folder`; its file's content."""
    rng = np.random.default_rng(1)
    n = len(FEATURES)
    scorer = PathScorer(
        mean=np.zeros(n, np.float32),
        std=np.ones(n, np.float32),
        w1=rng.normal(size=(n, 4)).astype(np.float32),
        b1=np.zeros(4, np.float32),
        w2=rng.normal(size=4).astype(np.float32),
        b2=0.5,
    )
    scorer.save(str(folder))
    return json.loads((folder / SCORER_FILE).read_text())


def _broken(content: dict, **changes) -> str:
    return json.dumps(content | changes)


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda text, c: text[: len(text) // 2], "not JSON"),
        (lambda text, c: "", "not JSON"),
        (lambda text, c: "<html>oops</html>", "not JSON"),
        (lambda text, c: "[1, 2]", "a JSON object expected"),
        (lambda text, c: _broken(c, w2=[float("nan")] * 4), "w2 holds non-finite values"),
        (lambda text, c: _broken(c, b2=float("inf")), "b2 holds non-finite values"),
        (lambda text, c: _broken(c, mean=[1e300] * len(FEATURES)), "mean holds non-finite values"),
        (lambda text, c: _broken(c, w1=c["w1"][:-1]), f"w1 has shape \\({len(FEATURES) - 1}, 4\\)"),
        (lambda text, c: _broken(c, w2=[1.0] * 3), "w2 has shape \\(3,\\), expected \\(4,\\)"),
        (lambda text, c: _broken(c, b1=[[0.0] * 4]), "b1 has shape"),
        (lambda text, c: _broken(c, w1=[["x"] * 4] * len(FEATURES)), "w1 is not an array of numbers"),
        (lambda text, c: _broken(c, std=[0.0] * len(FEATURES)), "std holds values <= 0"),
        (lambda text, c: _broken(c, features=c["features"][:-1]), "trained on other features"),
        (lambda text, c: json.dumps({k: v for k, v in c.items() if k != "b1"}), "no b1"),
    ],
)
def test_a_broken_path_scorer_file_is_refused_in_one_line_naming_it(tmp_path, damage, message):
    folder = tmp_path / "scorer"
    content = _saved_scorer(folder)
    assert PathScorer.load(str(folder)).b2 == 0.5  # the file as saved loads
    path = folder / SCORER_FILE
    path.write_text(damage(path.read_text(), content))
    with pytest.raises(PathScorerFileError, match=message) as error:
        PathScorer.load(str(folder))
    assert str(error.value).startswith(f"{path}: ") and "\n" not in str(error.value)


def test_a_scorer_with_nan_weights_is_not_saved(tmp_path):
    n = len(FEATURES)
    diverged = PathScorer(np.zeros(n), np.ones(n), np.full((n, 2), np.nan), np.zeros(2), np.ones(2), 0.0)
    with pytest.raises(ValueError, match="not saving the path scorer .* w1 holds non-finite"):
        diverged.save(str(tmp_path / "scorer"))
    assert not (tmp_path / "scorer" / SCORER_FILE).exists()


@pytest.mark.parametrize("stage", ["retrieve", "score"])
def test_a_broken_path_scorer_stops_retrieve_run_and_score_in_one_line_before_ray_starts(
    stage, tmp_path, capsys, monkeypatch
):
    import ray

    from tests.cli import xh
    from workflows import retrieve, score

    # the suite's session cluster may already be up: watch the drivers' own calls instead
    for module in (retrieve, score):
        monkeypatch.setattr(module, "init_ray", lambda cfg: pytest.fail("Ray started before the scorer was checked"))
    monkeypatch.setattr(ray, "init", lambda *a, **k: pytest.fail("Ray started before the scorer was checked"))
    content = _saved_scorer(tmp_path / "scorer")
    scorer_file = tmp_path / "scorer" / SCORER_FILE
    scorer_file.write_text(_broken(content, w2=[float("nan")] * 4))
    (tmp_path / "index" / "bm25").mkdir(parents=True)
    (tmp_path / "index" / "bm25" / "manifest.json").write_text("{}")
    (tmp_path / "q.jsonl").write_text(json.dumps({"qid": "a", "question": "Who directed it?"}) + "\n")
    argv = [f"storage.root={tmp_path}", f"retrieve.path_scorer={tmp_path / 'scorer'}"]
    argv += [f"mlflow.tracking_uri=sqlite:///{tmp_path}/m.db"]
    if stage == "retrieve":
        argv += [f"retrieve.questions={tmp_path / 'q.jsonl'}"]
    else:
        argv += [f"score.input={tmp_path / 'q.jsonl'}", "score.model=models:/xh@champion"]
    with pytest.raises(SystemExit) as exit_:
        xh(*{"retrieve": ["retrieve", "run"], "score": ["score"]}[stage], *[a for s in argv for a in ("--set", s)])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err == f"error: {scorer_file}: not a usable path scorer: w2 holds non-finite values (NaN or infinity)"
    assert not (tmp_path / "m.db").exists() and not (tmp_path / "retrieval").exists()
