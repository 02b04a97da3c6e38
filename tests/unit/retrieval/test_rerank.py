"""xh.retrieval.rerank: the cross-encoder, its training pairs and files; the candidates' `ranker` column."""

from __future__ import annotations

import json
import math
import random

import numpy as np
import pytest
import torch

from xh.config import RetrieveConfig
from xh.retrieval.candidates import Passages, Retriever
from xh.retrieval.rerank import (
    CONFIG_FILE,
    CrossEncoder,
    Example,
    epoch_batches,
    examples_from_candidates,
    examples_from_hotpot,
    group_softmax_loss,
    listwise_loss,
    pair_loss,
    passage_text,
    question_groups,
)

pytestmark = pytest.mark.unit


HOTPOT = [
    {
        "_id": "q1",
        "question": "Which city is the birthplace of the founder of Arden Works?",
        "supporting_facts": [["Arden Works", 0], ["Mara Quinn", 1]],
        "context": [
            ["Arden Works", ["Arden Works is a firm.", " It was founded by Mara Quinn."]],
            ["Mara Quinn", ["Mara Quinn is a designer.", " She was born in Lake Melholm."]],
            ["Lake Melholm", ["Lake Melholm is a city."]],
            ["East Ebbridge", ["East Ebbridge is a town."]],
            ["Empty", []],
        ],
    },
    {"_id": "q2", "question": "No supporting facts here?", "context": [["A", ["a"]]]},
]


def test_hotpot_pairs_take_supporting_paragraphs_as_positives():
    examples = examples_from_hotpot(HOTPOT, negatives_per_positive=1, seed=0)
    positives = [e for e in examples if e.label == 1.0]
    negatives = [e for e in examples if e.label == 0.0]
    assert {e.passage for e in positives} == {
        "Arden Works. Arden Works is a firm. It was founded by Mara Quinn.",
        "Mara Quinn. Mara Quinn is a designer. She was born in Lake Melholm.",
    }
    assert len(negatives) == 2 and {e.passage.split(".")[0] for e in negatives} == {"Lake Melholm", "East Ebbridge"}
    assert {e.qid for e in examples} == {"q1"}  # no positive, no pairs
    assert examples_from_hotpot(HOTPOT, 1, seed=0) == examples  # seeded


def test_hotpot_pairs_can_take_bm25_hard_negatives_from_every_records_paragraphs():
    other = {
        "_id": "q3",
        "question": "Who wrote Tide?",
        "supporting_facts": [["Tide", 0]],
        "context": [
            ["Tide", ["Tide is a novel."]],
            ["Arden Works museum", ["The Arden Works museum is the birthplace of the founder."]],
        ],
    }
    examples = examples_from_hotpot([HOTPOT[0], other], 3, seed=0, negatives="bm25", bm25_pool=2)
    q1 = {e.passage.split(".")[0]: e.label for e in examples if e.qid == "q1"}
    # BM25's top 2 for q1 over every record's paragraphs: gold "Arden Works" and q3's "Arden Works museum";
    # the gold one is a positive, never a negative
    assert q1 == {"Arden Works": 1.0, "Mara Quinn": 1.0, "Arden Works museum": 0.0}
    assert [e.label for e in examples if e.qid == "q3"] == [1.0]  # BM25 finds nothing else for "Tide"


def test_group_softmax_loss_matches_a_hand_computation():
    # question 1: positives 2.0 and 1.0, negatives 0.0 and -1.0; question 2: one positive, one negative, equal
    logits = torch.tensor([2.0, 0.0, 1.0, -1.0, 0.5, 0.5])
    labels = torch.tensor([1.0, 0.0, 1.0, 0.0, 1.0, 0.0])
    n = math.exp(0.0) + math.exp(-1.0)
    expected = (
        -math.log(math.exp(2.0) / (math.exp(2.0) + n)) - math.log(math.exp(1.0) / (math.exp(1.0) + n)) + math.log(2.0)
    ) / 3
    assert group_softmax_loss(logits, labels, [4, 2]).item() == pytest.approx(expected, rel=1e-6)
    # a question without negatives adds nothing to learn
    assert group_softmax_loss(torch.tensor([3.0]), torch.tensor([1.0]), [1]).item() == 0.0


def test_question_groups_keep_each_questions_pairs_together():
    examples = [Example(q, q, p, label) for q, p, label in [("a", "1", 1.0), ("b", "2", 0.0), ("a", "3", 0.0)]]
    examples.append(Example("b", "b", "4", 1.0))
    examples.append(Example("c", "c", "5", 0.0))  # no positive: nothing to rank against
    groups = question_groups(examples)
    assert [[e.passage for e in g] for g in groups] == [["1", "3"], ["2", "4"]]
    assert all(len(batch) == 1 for batch in epoch_batches(groups, 1, seed=0, epoch=0))


def test_listwise_training_lowers_the_loss_on_a_separable_toy_set(make_tiny_backbone):
    """A tiny random BERT learns that the paragraph saying "gold" is the one asked for (mean pooling)."""
    encoder = CrossEncoder.from_backbone(make_tiny_backbone(layers=2), max_length=16, seed=0, pooling="mean")
    words = "apple river castle violin tiger garden pencil rocket".split()
    groups = [
        [Example(w, f"where is the {w}?", f"the {w} is gold.", 1.0)]
        + [Example(w, f"where is the {w}?", f"the {v} is lead.", 0.0) for v in words if v != w][:3]
        for w in words
    ]
    optimizer = torch.optim.AdamW(encoder.parameters(), lr=3e-3)
    losses = []
    for epoch in range(6):
        for batch in epoch_batches(groups, 4, seed=0, epoch=epoch):
            loss = listwise_loss(encoder, encoder, batch)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    assert losses[0] == pytest.approx(math.log(4), abs=0.3)  # about chance among 4 paragraphs at the start
    assert np.mean(losses[-3:]) < 0.3 * np.mean(losses[:3])


def test_mean_pooling_is_saved_with_the_reranker(tiny_backbone, tmp_path):
    encoder = CrossEncoder.from_backbone(tiny_backbone, max_length=64, seed=1, pooling="mean")
    passages = ["Mara Quinn was born in Lake Melholm.", "x"]
    before = encoder.score("Where was Mara Quinn born?", passages)
    encoder.save(str(tmp_path / "reranker"))
    loaded = CrossEncoder.load(str(tmp_path / "reranker"))
    assert loaded.pooling == "mean"
    np.testing.assert_array_equal(loaded.score("Where was Mara Quinn born?", passages), before)
    # padding does not move a pair's mean: scored alone or beside a longer pair, the same logit
    alone = encoder.score("Where was Mara Quinn born?", passages[1:])
    assert alone[0] == pytest.approx(before[1], abs=1e-5)


def test_retrieval_pairs_take_bm25_candidates_as_hard_negatives():
    docs = {
        "1": ("Arden Works", "Arden Works is a firm."),
        "2": ("Mara Quinn", "Born in Lake Melholm."),
        "3": ("Lake Melholm", "A city."),
        "4": ("East Ebbridge", "A town."),
        "5": ("Other", "x"),
    }
    questions = [{"qid": "q1", "question": "Where?", "supporting_facts": [{"title": "Mara Quinn", "sent": 0}]}]
    candidates = [{"qid": "q1", "doc_id": d, "source": "ir", "rank": k} for k, d in enumerate(["4", "2", "3", "5"])]
    candidates.append({"qid": "q1", "doc_id": "1", "source": "el", "rank": 0})
    examples = examples_from_candidates(questions, candidates, docs, negatives_per_positive=2)
    assert [(e.passage.split(".")[0], e.label) for e in examples] == [
        ("Mara Quinn", 1.0),
        ("East Ebbridge", 0.0),
        ("Lake Melholm", 0.0),
    ]


def test_epoch_batches_are_full_and_reshuffled_per_epoch():
    examples = [Example("q", "q", str(i), 0.0) for i in range(10)]
    first, second = epoch_batches(examples, 3, seed=1, epoch=0), epoch_batches(examples, 3, seed=1, epoch=1)
    assert [len(b) for b in first] == [3, 3, 3] and first != second
    assert len({e.passage for b in first for e in b}) == 9


def test_long_questions_are_cut_so_the_paragraph_keeps_room(tiny_backbone):
    encoder = CrossEncoder.from_backbone(tiny_backbone, max_length=32)
    batch = encoder.encode(["why " * 200], ["the paragraph " * 50])
    assert batch["input_ids"].shape == (1, 32)
    # the question keeps 16 tokens (+ [CLS] and [SEP]); the paragraph the other 13 (+ [SEP])
    assert (batch["token_type_ids"][0] == 0).sum() == 16 + 2 and (batch["token_type_ids"][0] == 1).sum() == 14


def test_save_then_load_gives_identical_scores(tiny_backbone, tmp_path):
    encoder = CrossEncoder.from_backbone(tiny_backbone, max_length=64, seed=1)
    passages = ["Mara Quinn was born in Lake Melholm.", "East Ebbridge is a town.", "x"]
    before = encoder.score("Where was Mara Quinn born?", passages)
    encoder.save(str(tmp_path / "reranker"))
    assert json.loads((tmp_path / "reranker" / CONFIG_FILE).read_text())["max_length"] == 64
    assert not list(tmp_path.rglob("*.bin")) and not list(tmp_path.rglob("*.pt"))  # safetensors only
    loaded = CrossEncoder.load(str(tmp_path / "reranker"))
    np.testing.assert_array_equal(loaded.score("Where was Mara Quinn born?", passages), before)
    with pytest.raises(FileNotFoundError, match="is not a saved re-ranker"):
        CrossEncoder.load(str(tmp_path / "nothing"))


def test_a_reranker_folder_without_its_weights_is_refused_in_one_line(tmp_path):
    folder = tmp_path / "old"
    folder.mkdir()
    config = {"format": "xh-cross-encoder", "version": 1, "max_length": 64, "hidden_size": 32, "started_from": ""}
    (folder / CONFIG_FILE).write_text(json.dumps(config))
    with pytest.raises(FileNotFoundError, match=r"is not a saved re-ranker \(no model.safetensors\)$"):
        CrossEncoder.load(str(folder))


@pytest.mark.slow  # fine-tunes the real MiniLM for 20 steps: ~15 s on two idle cores
def test_training_on_a_toy_task_ranks_positives_first(minilm_path):
    """Which paragraph names the thing asked about? Trained on ten words, tested on five others."""
    torch.manual_seed(0)
    encoder = CrossEncoder.from_backbone(minilm_path, max_length=32, seed=0)
    words = "apple river castle violin tiger garden pencil rocket mirror candle island forest bottle dragon ladder"
    words = words.split()
    seen, unseen = words[:10], words[10:]
    rng = random.Random(0)

    def pairs(word: str) -> list[Example]:
        other = rng.choice([w for w in seen if w != word])
        question = f"where is the {word}?"
        return [
            Example("q", question, f"the {word} is in the box.", 1.0),
            Example("q", question, f"the {other} is in the box.", 0.0),
        ]

    def top1(pool: list[str]) -> int:
        hits = 0
        for word in pool:
            passages = [f"the {w} is in the box." for w in [word, *(v for v in pool if v != word)]]
            scores = encoder.score(f"where is the {word}?", passages)
            hits += int(scores[0] > scores[1:].max())
        return hits

    untrained = top1(unseen)
    optimizer = torch.optim.AdamW(encoder.parameters(), lr=5e-5)
    examples = [e for _ in range(8) for word in seen for e in pairs(word)]
    losses = []
    for epoch in range(2):
        for batch in epoch_batches(examples, 16, seed=0, epoch=epoch):
            loss = pair_loss(encoder, encoder, batch)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    assert np.mean(losses[-5:]) < 0.5 * np.mean(losses[:5])
    assert top1(unseen) == len(unseen) > untrained


class _FirstWordReranker:
    """A stand-in scorer with a known order (a paragraph scores 1 when it holds the question's last word)."""

    def score(self, question: str, passages: list[str], batch_size: int = 32) -> np.ndarray:
        word = question.rstrip("?").split()[-1].lower()
        return np.array([float(word in p.lower()) for p in passages])


def _retrieval_parts(tables):
    """(docs table, [one BM25 shard over "Title. paragraph"], entity linker, link graph) of generated tables."""
    import pyarrow.parquet as pq

    from xh.retrieval.analyzer import Analyzer
    from xh.retrieval.bm25 import BM25Shard, CorpusStats
    from xh.retrieval.entity_linking import EntityLinker
    from xh.retrieval.expansion import LinkGraph

    docs = pq.read_table(tables / "docs", columns=["doc_id", "title", "text"])
    tokens = Analyzer().analyze_batch(
        [passage_text(t, x) for t, x in zip(*(docs[c].to_pylist() for c in ("title", "text")))]
    )
    shard = BM25Shard.build(docs["doc_id"].to_pylist(), tokens, CorpusStats.from_token_lists(tokens))
    return docs, ([shard], EntityLinker.load(str(tables)), LinkGraph.load(str(tables)))


def test_candidates_say_which_ranker_ordered_them(synth_tables, tiny_backbone, tmp_path):
    tables, questions = synth_tables
    docs, parts = _retrieval_parts(tables)
    bridge = [q for q in questions if q["type"] == "bridge"][:3]
    qids, texts = [q["_id"] for q in bridge], [q["question"] for q in bridge]

    plain = Retriever(*parts, RetrieveConfig(ir_candidates=20)).candidates(qids, texts)
    assert {(r["source"], r["ranker"]) for r in plain} == {("ir", "bm25"), ("el", "commonness"), ("exp", "bm25")}

    settings = RetrieveConfig(ir_candidates=20, el_rerank_candidates=3)
    reranked = Retriever(*parts, settings, _FirstWordReranker(), Passages(docs)).candidates(qids, texts)
    assert {r["ranker"] for r in reranked} == {"reranker"}
    for qid in qids:
        ir_plain = [r["doc_id"] for r in plain if r["qid"] == qid and r["source"] == "ir"]
        ir = [r for r in reranked if r["qid"] == qid and r["source"] == "ir"]
        assert sorted(r["doc_id"] for r in ir) == sorted(ir_plain)  # the same 20 documents, re-ordered
        scores = [r["score"] for r in ir]
        assert scores == sorted(scores, reverse=True) and [r["rank"] for r in ir] == list(range(len(ir)))
        el = [r for r in reranked if r["qid"] == qid and r["source"] == "el"]
        assert len({r["surface"] for r in el}) == len(el)  # still one entity per surface
        exp = [r for r in reranked if r["qid"] == qid and r["source"] == "exp"]
        assert len(exp) <= 15 and all(np.isfinite(r["score"]) for r in exp)

    # a real cross-encoder plugs in the same way and scores every row
    real = Retriever(*parts, settings, CrossEncoder.from_backbone(tiny_backbone, max_length=64), Passages(docs))
    rows = real.candidates(qids[:1], texts[:1])
    assert rows and {r["ranker"] for r in rows} == {"reranker"}
    assert passage_text("T", " x ") == "T. x"


class _KnownScores:
    """A stand-in re-ranker whose score of a paragraph is known in advance (a digest of its text)."""

    @staticmethod
    def of(passage: str) -> float:
        return float(int.from_bytes(passage.encode()[-6:], "little") % 1009)

    def score(self, question: str, passages: list[str], batch_size: int = 32) -> np.ndarray:
        return np.array([self.of(p) for p in passages])


def test_expansion_neighbours_are_ordered_by_the_reranker(synth_tables):
    tables, questions = synth_tables
    docs, parts = _retrieval_parts(tables)
    passages, graph = Passages(docs), parts[2]
    settings = RetrieveConfig(ir_candidates=20, expansion_keep=4, expansion_rerank_pool=500)
    retriever = Retriever(*parts, settings, _KnownScores(), passages)
    bridge = [q for q in questions if q["type"] == "bridge"][:3]
    rows = retriever.candidates([q["_id"] for q in bridge], [q["question"] for q in bridge])
    for q in bridge:
        mine = [r for r in rows if r["qid"] == q["_id"]]
        seeds = [r["doc_id"] for r in mine if r["source"] == "ir" and r["rank"] < settings.ir_keep]
        seeds += [r["doc_id"] for r in mine if r["source"] == "el"]
        neighbours = [n.doc_id for n in graph.neighbours(list(dict.fromkeys(seeds)))]
        known = sorted((_KnownScores.of(p) for p in passages(neighbours)), reverse=True)
        exp = sorted((r for r in mine if r["source"] == "exp"), key=lambda r: r["rank"])
        assert exp and all(r["ranker"] == "reranker" for r in exp)
        # the re-ranker's best neighbours, best first: not BM25's order
        assert [r["score"] for r in exp] == known[: settings.expansion_keep]
        assert [r["score"] for r in exp] == [_KnownScores.of(p) for p in passages([r["doc_id"] for r in exp])]


def test_the_demo_trains_its_reranker_on_questions_outside_the_dev_split_and_retrieves_with_it(tmp_path):
    from xh.config import load_config
    from xh.stages import demo
    from xh.storage.store import Store
    from xh.train.split import in_dev_split

    cfg = load_config("configs/demo.yaml", [f"storage.root={tmp_path}", "demo.train_reranker=true"])
    questions = [{"_id": f"q{i}", "question": f"question {i}?"} for i in range(40)]
    (tmp_path / "world" / "hotpot").mkdir(parents=True)
    (tmp_path / "world" / "hotpot" / "questions.json").write_text(json.dumps(questions))
    trained = json.loads(open(demo.reranker_config(cfg, Store.from_config(cfg)).rerank.questions).read())
    assert trained and [q["_id"] for q in trained] == [
        q["_id"] for q in questions if not in_dev_split(q["_id"], cfg.train.dev_fraction)
    ]
    assert len(trained) < len(questions)
    assert cfg.demo.train_path_scorer  # configs/demo.yaml trains one
    done = {"rerank": {"output": "runs/demo/models/reranker"}, "paths": {"output": "runs/demo/models/path-scorer"}}
    retrieve = demo.retrieve_config(demo.with_rankers(cfg, done)).retrieve
    assert retrieve.reranker == "runs/demo/models/reranker" and retrieve.questions.endswith("questions.json")
    assert retrieve.path_scorer == "runs/demo/models/path-scorer"
    assert demo.with_rankers(cfg, {}).retrieve.path_scorer is None  # none trained: none used
    untrained = load_config("configs/demo.yaml", ["demo.train_path_scorer=false"])
    assert demo.with_rankers(untrained, done).retrieve.path_scorer is None  # not the demo's to train: not used


# --- the path re-ranker: the question against two paragraphs -------------------------------------


def test_path_pairs_hold_the_gold_pair_both_ways_and_never_as_a_negative():
    from xh.retrieval.rerank import pair_text, path_examples_from_hotpot

    others = [[f"Founder {i}", [f"A founder of a firm in the city {i}."]] for i in range(4)]
    records = [HOTPOT[0] | {"context": HOTPOT[0]["context"] + others}, HOTPOT[1]]
    examples = path_examples_from_hotpot(records, negatives_per_question=4, seed=0, bm25_pool=10)
    arden = passage_text("Arden Works", "Arden Works is a firm. It was founded by Mara Quinn.")
    mara = passage_text("Mara Quinn", "Mara Quinn is a designer. She was born in Lake Melholm.")
    positives = [e.passage for e in examples if e.label == 1.0]
    assert positives == [pair_text(arden, mara), pair_text(mara, arden)]
    negatives = [e.passage.split(" [SEP] ") for e in examples if e.label == 0.0]
    assert len(negatives) == 4 and all(len(pair) == 2 for pair in negatives)
    gold = {arden, mara}
    assert not any(set(pair) <= gold for pair in negatives)  # a negative holds at most one gold paragraph
    assert sum(len(set(pair) & gold) == 1 for pair in negatives) == 2  # half of them one gold and one other
    assert {e.qid for e in examples} == {"q1"}  # q2 has no supporting pair
    assert path_examples_from_hotpot(records, 4, seed=0, bm25_pool=10) == examples  # seeded


class _PairScores:
    """A stand-in path re-ranker: a pair scores what `table` says of its two titles (0 otherwise)."""

    def __init__(self, table: dict[tuple[str, str], float]):
        self.table, self.calls = table, []

    def score(self, question: str, passages: list[str], batch_size: int = 32) -> np.ndarray:
        self.calls.append(len(passages))
        titles = [tuple(p.split(". ")[0] for p in pair.split(" [SEP] ")) for pair in passages]
        return np.array([self.table.get(t, 0.0) for t in titles])


def test_the_best_pair_of_the_first_top_goes_first_and_the_rest_keep_their_order():
    from xh.retrieval.rerank import best_path_first

    passages = [passage_text(t, "x") for t in "ABCDEF"]
    scorer = _PairScores({("B", "D"): 2.0, ("A", "F"): 9.0})  # A-F is past top=4: never scored
    assert best_path_first(scorer, "q", passages, top=4) == [1, 3, 0, 2, 4, 5]
    assert scorer.calls == [6]  # the 4 * 3 / 2 pairs of the first four, each once, in ranked order
    # with the paragraphs' own logits added, a pair of two strong paragraphs can win over the path's choice
    assert best_path_first(scorer, "q", passages, top=4, single_scores=[5, 0, 5, 0, 0, 0]) == [0, 2, 1, 3, 4, 5]
    assert best_path_first(scorer, "q", passages[:1], top=4) == [0]  # one paragraph: no pair


def test_path_training_needs_a_questions_file(tmp_path):
    from xh.config import ConfigError, RerankConfig
    from xh.retrieval.rerank import training_examples

    with pytest.raises(ConfigError, match="rerank.questions"):
        training_examples(RerankConfig(paths=True, retrieval=str(tmp_path)), str(tmp_path))
    questions = tmp_path / "hotpot.json"
    questions.write_text(json.dumps(HOTPOT))
    examples = training_examples(RerankConfig(paths=True, questions=str(questions), path_negatives=2), str(tmp_path))
    # q1 has one other paragraph in BM25's pool (Lake Melholm): one wrong pair with a gold paragraph, and no
    # pair of two others to make the second negative from
    assert all(" [SEP] " in e.passage for e in examples) and [e.label for e in examples] == [1, 1, 0]


def test_a_path_reranker_puts_its_best_pair_first_among_the_ir_candidates(synth_tables):
    tables, questions = synth_tables
    docs, parts = _retrieval_parts(tables)
    passages = Passages(docs)
    q = [q for q in questions if q["type"] == "bridge"][0]
    settings = RetrieveConfig(ir_candidates=20, path_top=6)
    plain = [r for r in Retriever(*parts, settings).candidates([q["_id"]], [q["question"]]) if r["source"] == "ir"]
    title = dict(zip(docs["doc_id"].to_pylist(), docs["title"].to_pylist()))
    third, fifth = title[plain[2]["doc_id"]], title[plain[4]["doc_id"]]
    scorer = _PairScores({(third, fifth): 1.0})
    retriever = Retriever(*parts, settings, passages=passages, path_reranker=scorer)
    rows = retriever.candidates([q["_id"]], [q["question"]])
    ir = sorted((r for r in rows if r["source"] == "ir"), key=lambda r: r["rank"])
    order = [2, 4, 0, 1, 3, *range(5, len(plain))]
    assert [r["doc_id"] for r in ir] == [plain[i]["doc_id"] for i in order]
    assert [r["score"] for r in ir] == [plain[i]["score"] for i in order]  # each keeps its BM25 score
    assert {r["ranker"] for r in ir} == {"paths"} and scorer.calls == [15]
    assert {r["ranker"] for r in rows if r["source"] != "ir"} == {"commonness", "bm25"}  # the others as before
