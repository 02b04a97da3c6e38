"""FEVER end to end, without Ray: the official prediction format from the model's decoding, the
scorer on it and on batch scoring's table, and evaluation graphs that no gold label shapes."""

from __future__ import annotations

import json
import random
from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from xh.config import GraphsConfig, ModelConfig
from xh.eval.fever import evaluate_fever, evaluate_fever_files, flat_metrics, official_predictions
from xh.eval.official import fever_gold, fever_prediction_file
from xh.graph.build import fever_plan
from xh.graph.fever import FeverGraphSettings, build_fever_graphs
from xh.inference import predict_graphs
from xh.inputs.claims import claim_split, read_fever_claims, write_claim_split
from xh.model.xh import XHModel, load_tokenizer
from xh.storage.store import Store
from xh.train.loop import fever_dev_metrics

pytestmark = pytest.mark.unit

PAGES = {
    "Soul_Food_-LRB-film-RRB-": [
        "Soul Food is a 1997 American comedy-drama film.",
        "It was produced by Kenneth Edmonds.",
        "It was released by Fox 2000 Pictures.",
    ],
    "Telemundo": ["Telemundo is a Spanish-language television network.", "It is owned by NBCUniversal."],
    "Kenneth_Edmonds": ["Kenneth Edmonds is an American singer and record producer.", "He was born in 1959."],
    "Fox_2000_Pictures": [
        "Fox 2000 Pictures was a film studio.",
        "It released films from 1994.",
        "Fox 2000 Pictures released Soul Food in 1997.",
        "Its films include Soul Food.",
    ],
}
CLAIMS = [
    ("1", "Soul Food was released by Fox 2000 Pictures.", "SUPPORTS", [[("Soul_Food_-LRB-film-RRB-", 2)]]),
    (
        "2",
        "Soul Food was produced by a singer born in 1959.",
        "SUPPORTS",
        [[("Soul_Food_-LRB-film-RRB-", 1), ("Kenneth_Edmonds", 1)]],
    ),
    ("3", "Telemundo is an English-language network.", "REFUTES", [[("Telemundo", 0)]]),
    ("4", "Kenneth Edmonds has a twin sibling.", "NOT ENOUGH INFO", []),
]


@pytest.fixture(scope="module")
def docs(fever_docs) -> pa.Table:
    return fever_docs(PAGES)


def claim_rows() -> list[dict]:
    return [
        {"qid": q, "claim": c, "label": label, "evidence": [[{"page": p, "line": n} for p, n in g] for g in groups]}
        for q, c, label, groups in CLAIMS
    ]


def test_predictions_name_fever_page_ids_and_at_most_five_sentences(docs, tiny_backbone):
    graphs, quarantined = build_fever_graphs(claim_rows(), docs, FeverGraphSettings(max_nodes=7))
    assert quarantined == [] and max(len(g["nodes"]) for g in graphs) == 7
    model = XHModel.from_backbone(ModelConfig(backbone=tiny_backbone, task="fever", max_node_tokens=64)).eval()
    predictions = predict_graphs(model, load_tokenizer(tiny_backbone), graphs, bf16=False)
    official = fever_prediction_file(predictions)

    for graph, record in zip(graphs, official):
        assert set(record) == {"id", "predicted_label", "predicted_evidence"} and record["id"] == graph["qid"]
        assert len(record["predicted_evidence"]) == min(5, len(graph["nodes"]))  # the scorer reads no more
        nodes = {(n["doc_id"], n["line"]) for n in graph["nodes"]}
        assert all(isinstance(line, int) and (page, line) in nodes for page, line in record["predicted_evidence"])
    # a page with brackets is named as FEVER's gold names it, not by its display title
    assert any(page == "Soul_Food_-LRB-film-RRB-" for r in official for page, _ in r["predicted_evidence"])

    gold = fever_gold(graphs)
    assert gold[1]["evidence"] == [[[None, None, "Soul_Food_-LRB-film-RRB-", 1], [None, None, "Kenneth_Edmonds", 1]]]
    assert gold[3]["evidence"] == [] and gold[3]["label"] == "NOT ENOUGH INFO"
    # the in-training metric is the official scorer on these two files, slices included
    expected = flat_metrics(evaluate_fever(gold, official, slices=True))
    metrics = fever_dev_metrics(graphs, predictions)
    assert metrics == {f"dev_{k}": v for k, v in expected.items()} | {"dev_graphs": 4, "dev_missed": 0}
    assert {"dev_fever_score", "dev_evidence_f1", "dev_single_evidence_fever_score"} <= set(metrics)
    assert {"dev_multi_evidence_evidence_recall", "dev_nei_label_accuracy", "dev_nei_claims"} <= set(metrics)


def test_batch_scoring_table_is_paired_with_gold_by_id(tmp_path):
    gold = [
        {"id": 11, "label": "SUPPORTS", "evidence": [[[1, 1, "A_-LRB-x-RRB-", 0]]]},
        {"id": 12, "label": "REFUTES", "evidence": [[[1, 1, "B", 2], [1, 2, "C", 0]]]},
        {"id": 13, "label": "NOT ENOUGH INFO", "evidence": [[[1, None, None, None]]]},
        {"id": 14, "label": "NOT ENOUGH INFO", "evidence": [[[1, None, None, None]]]},
    ]
    predicted = {
        "11": ("SUPPORTS", [("A_-LRB-x-RRB-", 0)]),
        "12": ("REFUTES", [("B", 2), ("D", 1)]),  # half a group: label right, FEVER score 0
        "13": ("NOT ENOUGH INFO", []),
    }  # 14 was quarantined on the way: no row, scored as wrong
    rows = [
        {"qid": q, "answer": label, "supporting_facts": [{"title": p, "sent": n} for p, n in evidence]}
        for q, (label, evidence) in reversed(predicted.items())  # table order is not gold order
    ]
    (tmp_path / "gold.jsonl").write_text("".join(json.dumps(g) + "\n" for g in gold))
    table = tmp_path / "predictions"
    table.mkdir()
    pq.write_table(pa.Table.from_pylist(rows), table / "part-0.parquet")

    result = evaluate_fever_files(str(tmp_path / "gold.jsonl"), str(table))
    assert result["fever_score"] == pytest.approx(2 / 4) and result["label_accuracy"] == pytest.approx(3 / 4)
    assert result["evidence_recall"] == pytest.approx(1 / 2) and result["evidence_precision"] == pytest.approx(3 / 4)
    assert official_predictions(rows[-1:]) == [
        {"id": "11", "predicted_label": "SUPPORTS", "predicted_evidence": [["A_-LRB-x-RRB-", 0]]}
    ]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A generated world's FEVER pages as docs (the real wiki stage, in-process), and its claims file."""
    from xh import synth
    from xh.stages import wiki

    tmp = tmp_path_factory.mktemp("fever-split")
    synth.write_world(
        synth.WorldSpec(num_docs=300, seed=7),
        synth.output_under(str(tmp / "world")),
        docs_per_shard=300,
        num_questions=4,
        num_claims=80,
    )
    wiki.write_tables(
        Store().at(str(tmp / "tables")), [Store().at(str(tmp / "world" / "fever" / "wiki-pages"))], "fever", local=True
    )
    return tmp


def _build(world, claims_file, split: str) -> list[dict]:
    settings = GraphsConfig(
        task="fever", questions=str(claims_file), claims_split=split, dev_fraction=0.3, test_fraction=0.3
    )
    plan = fever_plan(settings, Store().at(str(world / "tables")))
    graphs, _, _ = plan.make_builder()(plan.items)
    return graphs


def _inputs(graphs: list[dict]) -> list:
    """What the model reads of a graph: its claim and its nodes, in order."""
    return [
        (
            g["qid"],
            g["question"],
            [(n["doc_id"], n["line"], n["sentences"], n["score"], n["source"]) for n in g["nodes"]],
        )
        for g in graphs
    ]


def test_evaluation_graphs_do_not_depend_on_gold_labels(world):
    claims_file = world / "world" / "fever" / "claims.jsonl"
    records = [json.loads(line) for line in claims_file.read_text().splitlines()]
    shuffled = [(r["label"], r["evidence"]) for r in records]
    random.Random(3).shuffle(shuffled)  # every claim gets another claim's label and evidence
    permuted, unlabelled = world / "permuted.jsonl", world / "unlabelled.jsonl"
    permuted.write_text(
        "".join(json.dumps(r | {"label": lab, "evidence": ev}) + "\n" for r, (lab, ev) in zip(records, shuffled))
    )
    unlabelled.write_text("".join(json.dumps({"id": r["id"], "claim": r["claim"]}) + "\n" for r in records))

    for split in ("dev", "test"):
        honest = _build(world, claims_file, split)
        assert len(honest) > 10 and all(n["source"] == "retrieved" for g in honest for n in g["nodes"])
        assert _inputs(_build(world, permuted, split)) == _inputs(honest)
        assert _inputs(_build(world, unlabelled, split)) == _inputs(honest)

    # the training split keeps gold first, so its graphs do move with the labels (the check above can fail)
    train = _build(world, claims_file, "train")
    assert any(n["source"] == "evidence" for g in train for n in g["nodes"])
    assert _inputs(_build(world, unlabelled, "train")) != _inputs(train)
    splits = [{g["qid"] for g in _build(world, claims_file, s)} for s in ("train", "dev", "test")]
    assert not (splits[0] & splits[1] or splits[0] & splits[2] or splits[1] & splits[2])
    assert all(claim_split(q, 0.3, 0.3) == "dev" for q in splits[1])


@pytest.mark.shared_data
def test_real_claims_through_splits_and_the_batch_scoring_table(shared_data, tmp_path):
    """The claims reader and the scorer on real FEVER claims: the splits partition them, and the
    baseline's predictions handed over as a predictions table (any order) score as the official scorer."""
    folder = shared_data / "fever"
    gold_path = str(folder / "paper_dev_first3000.jsonl")
    rows, quarantined = read_fever_claims(gold_path)
    counts = Counter(claim_split(r["qid"], 0.2, 0.2) for r in rows)
    assert quarantined == [] and len(rows) == 3000 and min(counts.values()) > 400
    assert write_claim_split(gold_path, "dev", str(tmp_path / "dev.jsonl"), 0.2, 0.2) == counts["dev"]
    dev, _ = read_fever_claims(str(tmp_path / "dev.jsonl"))  # a split file reads back as the same claims
    assert dev == [r for r in rows if claim_split(r["qid"], 0.2, 0.2) == "dev"]
    write_claim_split(gold_path, "test", str(tmp_path / "new.jsonl"), 0.2, 0.2, labels=False)
    new, _ = read_fever_claims(str(tmp_path / "new.jsonl"))
    assert len(new) == counts["test"] and all(r["label"] is None and r["evidence"] is None for r in new)

    predictions = [json.loads(line) for line in (folder / "predictions_first3000.jsonl").read_text().splitlines()]
    table = [
        {
            "qid": str(g["qid"]),
            "answer": p["predicted_label"],
            "supporting_facts": [{"title": page, "sent": line} for page, line in p["predicted_evidence"]],
        }
        for g, p in zip(rows, predictions)
    ]
    random.Random(1).shuffle(table)
    (tmp_path / "predictions").mkdir()
    pq.write_table(pa.Table.from_pylist(table), tmp_path / "predictions" / "part-0.parquet")
    official = json.loads((folder / "predictions_first3000.official_metrics.json").read_text())
    result = evaluate_fever_files(gold_path, str(tmp_path / "predictions"))
    for key, value in official.items():
        assert result[key] == pytest.approx(value, abs=1e-9), key


def test_sentence_reranker_pairs_and_reordering(docs, tiny_backbone, tmp_path):
    from xh.graph.fever import FeverGraphBuilder
    from xh.retrieval.rerank import CrossEncoder
    from xh.retrieval.sentences import rerank_sentences, sentence_examples

    builder = FeverGraphBuilder(docs, FeverGraphSettings())
    examples = sentence_examples(claim_rows(), builder, negatives_per_positive=2, seed=1)
    by_claim = {}
    for e in examples:
        by_claim.setdefault(e.qid, []).append(e)
    assert set(by_claim) == {"1", "2", "3"}  # the NOT ENOUGH INFO claim has no gold to learn from
    positives = {e.passage for e in by_claim["2"] if e.label == 1.0}
    assert positives == {
        "Soul Food (film). It was produced by Kenneth Edmonds.",
        "Kenneth Edmonds. He was born in 1959.",
    }
    assert 0 < sum(e.label == 0.0 for e in by_claim["2"]) <= 4 and all(
        e.passage not in positives for e in by_claim["2"] if not e.label
    )

    encoder = CrossEncoder.from_backbone(tiny_backbone, max_length=64, seed=0)
    claim = CLAIMS[0][1]
    ranked = builder.rank_sentences(claim, builder.candidate_pages([claim])[0][0])
    reordered = rerank_sentences(encoder, claim, ranked, pool=4)
    assert reordered[4:] == ranked[4:]
    assert {(s.doc_id, s.line) for s in reordered[:4]} == {(s.doc_id, s.line) for s in ranked[:4]}
    scores = [s.score for s in reordered[:4]]
    assert scores == sorted(scores, reverse=True)
    assert scores == pytest.approx(
        sorted(encoder.score(claim, [f"{s.title}. {s.sentence}" for s in ranked[:4]]), reverse=True)
    )

    encoder.save(str(tmp_path / "reranker"))  # graph building loads it from a folder
    graphs, _ = build_fever_graphs(
        claim_rows()[:1], docs, FeverGraphSettings(reranker=str(tmp_path / "reranker"), rerank_pool=4)
    )
    assert [(n["doc_id"], n["line"]) for n in graphs[0]["nodes"]] == [(s.doc_id, s.line) for s in reordered[:5]]
