"""The main path without Ray: question files -> questions (bad records quarantined with the reason)
-> retrieval -> evidence graphs -> predictions, on the generated world (`synth_tables`) with a tiny
untrained XH model (`tiny_backbone`): what is tested is the plumbing, not answer quality."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from xh import schemas
from xh.config import ConfigError, load_config
from xh.graph.hotpot import NO_NODES
from xh.inputs.questions import parse_question_file
from xh.pipeline import Pipeline, prediction_row, question_type_of, settings_of
from xh.registry.versions import parse_model_uri

PROVENANCE = {"model_name", "model_version", "run_id", "corpus_snapshot", "scored_at", "pipeline_drift"}


def test_json_lines_records_are_questions_or_quarantined_with_their_line_and_reason():
    lines = [
        json.dumps({"qid": "a", "question": " Who? ", "type": "bridge"}),
        "",
        "{not json",
        json.dumps(["not", "an", "object"]),
        json.dumps({"question": "Whose id?"}),
        json.dumps({"qid": "b", "question": "  "}),
        json.dumps({"qid": "a", "question": "Again?"}),
        json.dumps({"_id": "c", "question": "Which?"}),
    ]
    rows, quarantined = parse_question_file("in.jsonl", "\n".join(lines).encode())
    assert [(r["qid"], r["question"], r["type"]) for r in rows] == [("a", "Who?", "bridge"), ("c", "Which?", None)]
    assert [(q["position"], q["reason"]) for q in quarantined] == [
        (3, "not JSON: Expecting property name enclosed in double quotes"),
        (4, "invalid record: not an object"),
        (5, "missing id"),
        (6, "empty question"),
        (7, "duplicate id"),
    ]
    assert {q["source"] for q in quarantined} == {"in.jsonl"} and quarantined[0]["raw"] == "{not json"


def test_json_arrays_and_parquet_files_are_read_by_the_same_rules():
    rows, quarantined = parse_question_file("in.json", json.dumps([{"_id": "x", "question": "Q?"}, 5]).encode())
    assert [r["qid"] for r in rows] == ["x"] and [(q["position"], q["reason"]) for q in quarantined] == [
        (2, "invalid record: not an object")
    ]

    sink = pa.BufferOutputStream()
    pq.write_table(pa.table({"qid": ["p1", "p2"], "question": ["Q1?", ""], "type": ["comparison", None]}), sink)
    rows, quarantined = parse_question_file("in.parquet", sink.getvalue().to_pybytes())
    assert [(r["qid"], r["type"]) for r in rows] == [("p1", "comparison")]
    assert [(q["position"], q["reason"]) for q in quarantined] == [(2, "empty question")]

    rows, quarantined = parse_question_file("broken.parquet", b"not parquet")
    assert rows == [] and len(quarantined) == 1
    assert quarantined[0]["position"] == -1 and quarantined[0]["reason"].startswith("unreadable Parquet file")


def test_model_uris_name_an_alias_or_a_version():
    assert parse_model_uri("models:/xh-hotpot@champion") == ("xh-hotpot", "champion", None)
    assert parse_model_uri("models:/xh-hotpot/3") == ("xh-hotpot", None, "3")
    for bad in ("xh-hotpot@champion", "models:/xh-hotpot", "models:/@champion"):
        with pytest.raises(ConfigError, match="models:/NAME@ALIAS"):
            parse_model_uri(bad)


@pytest.fixture(scope="module")
def pipeline(synth_tables, tiny_backbone, tmp_path_factory) -> Pipeline:
    """Both halves: a one-shard BM25 index of the world with its linker and link graph; a saved XH model."""
    from tests.helpers import tables_retriever
    from xh.model.xh import XHModel

    tables, _ = synth_tables
    cfg = load_config(None, [f"model.backbone={tiny_backbone}", "model.max_node_tokens=64"])
    retrieval, graph = settings_of(cfg)
    retriever = tables_retriever(tables, retrieval)

    folder = tmp_path_factory.mktemp("xh-model")
    XHModel.from_backbone(cfg.model).save_pretrained(folder)
    model_half = Pipeline.load(model=str(folder), batch_graphs=3)
    assert model_half.retriever is None  # only what was asked for is loaded
    return Pipeline(
        retriever, str(tables), graph, model=model_half.model, tokenizer=model_half.tokenizer, batch_graphs=3
    )


def test_settings_for_new_questions_come_from_the_config_and_require_no_answer():
    cfg = load_config(None, ["retrieve.ir_candidates=7", "retrieve.expansion_keep=4", "graphs.edge_mode=full"])
    retrieval, graph = settings_of(cfg)
    assert (retrieval.ir_candidates, retrieval.expansion_keep) == (7, 4) and retrieval.ir_keep == cfg.retrieve.ir_keep
    assert (graph.edge_mode, graph.require_answer) == ("full", False)


def test_questions_become_graphs_and_predictions_and_a_question_without_documents_is_quarantined(
    pipeline, synth_tables
):
    _, world_questions = synth_tables
    questions = [{"qid": q["_id"], "question": q["question"], "type": q["type"]} for q in world_questions[:4]]
    questions.insert(2, {"qid": "nothing", "question": "Zqxv wvut ptqz?", "type": None})

    graphs, quarantined = pipeline.graphs(questions)
    assert [g["qid"] for g in graphs] == [q["_id"] for q in world_questions[:4]]
    assert all(g["nodes"] and g["question"] == q["question"] for g, q in zip(graphs, world_questions))
    assert quarantined == [
        {
            "source": "graphs",
            "position": -1,
            "reason": NO_NODES,
            "raw": json.dumps({"qid": "nothing", "question": "Zqxv wvut ptqz?"}),
        }
    ]

    predictions = pipeline.predict(graphs)
    assert [p["qid"] for p in predictions] == [g["qid"] for g in graphs]
    for graph, p in zip(graphs, predictions):
        assert p["answer_doc_id"] in {node["doc_id"] for node in graph["nodes"]}
        assert isinstance(p["answer"], str) and 0.0 <= p["node_score"] <= 1.0

    rows = [prediction_row(g["question"], p) | question_type_of(g) for g, p in zip(graphs, predictions)]
    assert set(rows[0]) == set(schemas.PREDICTIONS.names) - PROVENANCE
    assert rows[0]["supporting_facts"] == [{"title": t, "sent": s} for t, s in predictions[0]["supporting_facts"]]
    assert rows[0]["score"] == predictions[0]["node_score"] and rows[0]["answer"] == predictions[0]["answer"]

    # both halves at once: the same predictions, the same quarantine
    assert pipeline(questions) == (predictions, quarantined)


def test_a_fever_prediction_becomes_a_row_with_the_label_as_answer():
    prediction = {
        "qid": "7",
        "label": "REFUTES",
        "label_probs": {"SUPPORTS": 0.1, "REFUTES": 0.7, "NOT ENOUGH INFO": 0.2},
        "evidence": [["Page", 3]],
    }
    row = prediction_row("Is it?", prediction)
    assert row == {
        "qid": "7",
        "question": "Is it?",
        "answer": "REFUTES",
        "answer_doc_id": None,
        "answer_title": None,
        "answer_type": None,
        "supporting_facts": [{"title": "Page", "sent": 3}],
        "score": 0.7,
    }


def test_doc_positions_find_each_id_in_its_shard_and_column_and_survive_pickling():
    import pickle
    from types import SimpleNamespace

    import numpy as np

    from xh.retrieval.candidates import DocPositions

    shards = [SimpleNamespace(doc_ids=np.array(ids, dtype=object)) for ids in (["10", "2", "33"], ["4", "5"])]
    positions = DocPositions(shards)
    for found in (positions, pickle.loads(pickle.dumps(positions))):
        where, cols = found.find(["5", "33", "missing", "10"])
        assert where.tolist() == [1, 0, -1, 0] and cols.tolist()[:2] == [1, 2] and cols[3] == 0
