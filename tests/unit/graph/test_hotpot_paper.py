"""HotpotQA as the paper runs it (issue 16): the supporting-fact chain, the no-node ablation's decoding,
per-type models routed by question type, the `gat` preset, Fig. 2's groups, and metrics that count
quarantined questions as misses and compare titles as the official script does."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from tests.unit.model.test_model import EIFFEL, GUSTAVE, STATUE, make_graph, make_model
from xh import schemas
from xh.config import GraphsConfig, ModelConfig, load_config
from xh.eval.hotpot import evaluate_hotpot
from xh.eval.official import hotpot_gold, hotpot_prediction_file
from xh.graph.hotpot import distractor_graphs, distractor_items
from xh.graph.store import qids_of_quarantine, quarantined_qids
from xh.inference import load_model, predict_graphs
from xh.model.batch import collate
from xh.model.decode import decode
from xh.model.routed import RoutedModel, save_routed

OTHER = ["Paris is the capital of France.", " It lies on the Seine."]


@pytest.fixture(scope="module")
def backbone(make_tiny_backbone) -> str:
    return make_tiny_backbone(heads=4, max_positions=128)  # test_model.py's size: the same folder


@pytest.fixture(scope="module")
def tokenizer(backbone):
    from transformers import BertTokenizerFast

    return BertTokenizerFast.from_pretrained(backbone)


def four_node_graph(tokenizer):
    """Node 1 holds the answer; node 2 links into it (its parent); node 0 links only into node 3."""
    return make_graph(
        tokenizer,
        "q1",
        "Where is the tower built by Gustave Eiffel's company?",
        [GUSTAVE, EIFFEL, STATUE, OTHER],
        [(2, 1), (0, 3)],
        answer=(1, "Paris, France"),
        answer_type=0,
        question_type=0,
    )


def forward(backbone, tokenizer, graphs, **overrides):
    model = make_model(backbone, hop_layers=1, **overrides).eval()
    batch = collate(graphs)
    with torch.no_grad():
        out = model(batch)
    out.answer_type_logits = torch.tensor([[5.0, 0.0, 0.0]] * len(graphs))
    return model, batch, out


def test_chain_supporting_facts_come_from_the_answer_node_and_its_parent(backbone, tokenizer):
    graphs = [four_node_graph(tokenizer)]
    _, batch, out = forward(backbone, tokenizer, graphs)
    out.node_logits = torch.tensor([3.0, 5.0, 1.0, -1.0])  # ranking 1, 0, 2, 3; node 2 is 1's only parent
    out.sentence_logits[:, :2] = torch.tensor([[4.0, -4.0], [-4.0, 4.0], [4.0, -4.0], [4.0, 4.0]])
    (joint,) = decode(graphs, batch, out, max_answer_tokens=30, sp_mode="joint")
    (chain,) = decode(graphs, batch, out, max_answer_tokens=30, sp_mode="chain")
    assert joint["supporting_facts"] == [["Title 1", 1], ["Title 0", 0]]  # the two most relevant nodes
    assert chain["supporting_facts"] == [["Title 1", 1], ["Title 2", 0]]  # the answer node and its parent
    assert chain["answer"] == joint["answer"]  # the mode changes supporting facts only


def test_chain_without_a_parent_falls_back_to_the_next_most_relevant_node(backbone, tokenizer):
    graphs = [four_node_graph(tokenizer)]
    _, batch, out = forward(backbone, tokenizer, graphs)
    out.node_logits = torch.tensor([5.0, 3.0, 1.0, -1.0])  # answer node 0 has no in-edge
    (chain,) = decode(graphs, batch, out, max_answer_tokens=30, sp_mode="chain")
    assert [title for title, _ in chain["supporting_facts"]][-1] == "Title 1"
    with pytest.raises(ValueError, match="sp_mode"):
        decode(graphs, batch, out, max_answer_tokens=30, sp_mode="nodes")


def test_no_node_prediction_decodes_the_best_span_over_all_nodes(backbone, tokenizer):
    graphs = [four_node_graph(tokenizer)]
    _, batch, out = forward(backbone, tokenizer, graphs)
    start, end = int(batch.answer_start[0]), int(batch.answer_end[0])  # "Paris, France" in node 1
    out.node_logits = torch.tensor([9.0, -9.0, 0.0, 0.0])  # an untrained node head pointing elsewhere
    out.start_logits[1, start] = 50.0
    out.end_logits[1, end] = 50.0
    (by_node,) = decode(graphs, batch, out, max_answer_tokens=30)
    (by_span,) = decode(graphs, batch, out, max_answer_tokens=30, by_span=True)
    assert by_node["answer_node"] == 0 and by_node["answer"] != "Paris, France"
    assert by_span["answer_node"] == 1 and by_span["answer"] == "Paris, France"
    assert by_span["node_score"] > 0.99  # softmax of the nodes' best span scores


def test_node_loss_weight_zero_makes_inference_rank_nodes_by_span(backbone, tokenizer, monkeypatch):
    assert ModelConfig(node_loss_weight=0.0).node_prediction is False
    assert ModelConfig().node_prediction and ModelConfig(task="fever", node_loss_weight=0.0).node_prediction
    seen = []
    import xh.model.predict

    real = xh.model.predict.decode
    monkeypatch.setattr(xh.model.predict, "decode", lambda *a, **k: seen.append(k) or real(*a, **k))
    model = make_model(backbone, hop_layers=1, node_loss_weight=0.0, sp_mode="chain")
    rows = distractor_rows()
    predict_graphs(model, model.tokenizer, rows, batch_graphs=8)
    assert seen == [{"sp_mode": "chain", "by_span": True}]
    predict_graphs(model, model.tokenizer, rows, sp_mode="joint")
    assert seen[-1] == {"sp_mode": "joint", "by_span": True}


# --- per-type models --------------------------------------------------------------------------------


def distractor_rows() -> list[dict]:
    """Three graph rows: bridge, comparison, and one of no known type."""
    context = [["Gustave Eiffel", GUSTAVE], ["Eiffel Tower", EIFFEL], ["Statue of Liberty", STATUE]]
    records = [
        {"_id": "b1", "question": "Where is the Eiffel Tower?", "answer": "Paris", "type": "bridge"},
        {"_id": "c1", "question": "Were both engineered by Eiffel?", "answer": "yes", "type": "comparison"},
        {"_id": "u1", "question": "When did the tower open?", "answer": "1889"},
    ]
    items, quarantined = distractor_items([r | {"context": context} for r in records], "test")
    assert not quarantined
    rows = [o.graph for o in distractor_graphs(items, GraphsConfig(setting="distractor", require_answer=False))]
    rows[2]["question_type"] = None  # as a graph of unknown type would arrive
    return rows


def test_a_routed_model_sends_each_question_to_the_model_of_its_type(backbone, tmp_path):
    bridge, comparison = make_model(backbone, seed=1, hop_layers=1), make_model(backbone, seed=2, hop_layers=1)
    folder = save_routed(
        tmp_path / "routed",
        {"bridge": bridge.save_pretrained(tmp_path / "b"), "comparison": comparison.save_pretrained(tmp_path / "c")},
    )
    routed, tokenizer = load_model(str(folder))
    assert isinstance(routed, RoutedModel) and tokenizer is None
    rows = distractor_rows()
    predictions = predict_graphs(routed, None, rows, batch_graphs=2)
    assert [p["qid"] for p in predictions] == ["b1", "c1", "u1"]  # the rows' order
    bridge, comparison = bridge.eval(), comparison.eval()
    alone_bridge = predict_graphs(bridge, bridge.tokenizer, [rows[0], rows[2]])
    alone_comparison = predict_graphs(comparison, comparison.tokenizer, [rows[1]])
    assert predictions == [alone_bridge[0], alone_comparison[0], alone_bridge[1]]  # unknown type: bridge model
    other = predict_graphs(comparison, comparison.tokenizer, [rows[0]])[0]
    assert other["node_score"] != predictions[0]["node_score"]  # the two models do differ

    # the registry's pyfunc loads the same folder and routes alike
    from xh.registry.pyfunc import XHPyfunc, graph_input

    pyfunc = XHPyfunc()
    pyfunc.load_context(SimpleNamespace(artifacts={"model": str(folder)}))
    frame = pyfunc.predict(None, graph_input(rows))
    assert frame["node_score"].tolist() == [p["node_score"] for p in predictions]
    # and batch scoring's model half (`xh.pipeline.Pipeline`, what its actors hold)
    from xh.pipeline import Pipeline

    assert Pipeline.load(model=str(folder), batch_graphs=3).predict(rows) == predictions


def test_separate_training_joins_a_model_per_type_and_weights_their_dev_metrics(backbone, tmp_path, monkeypatch):
    """`train.question_types=separate`: one fit per type (Ray Train's part is stood in for), one routed folder."""
    from xh.stages import train
    from xh.storage.store import Store

    fits = []

    def fake_fit(job):
        kind = job.cfg.train.question_types
        fits.append((kind, job.cfg.train.run_name))
        folder = make_model(backbone, seed=len(fits), hop_layers=1).save_pretrained(tmp_path / kind)
        dev = {"bridge": (3, 1, 0.5), "comparison": (1, 0, 1.0)}[kind]  # graphs, missed, em
        metrics = {"dev_graphs": dev[0], "dev_missed": dev[1], "dev_em": dev[2]}
        run_id = f"run-{kind}"
        return {
            "model_dir": str(folder),
            "metrics": metrics,
            "mlflow_run_id": run_id,
            "train_graphs": 5,
            "dev_graphs": 3,
        }

    monkeypatch.setattr(train, "fit", fake_fit)
    cfg = load_config(None, ["train.question_types=separate", "train.run_name=xh"])
    store = Store.from_config(cfg)
    outcome = train.fit_separate(train.Job(cfg, store, store.at("graphs"), None, store.at(str(tmp_path))))
    assert fits == [("bridge", "xh-bridge"), ("comparison", "xh-comparison")]
    assert outcome["metrics"] == {"dev_em": (4 * 0.5 + 1 * 1.0) / 5, "dev_graphs": 4, "dev_missed": 1}
    assert outcome["runs"] == {"bridge": "run-bridge", "comparison": "run-comparison"}
    routed, _ = load_model(outcome["model_dir"])
    assert isinstance(routed, RoutedModel) and sorted(routed.models) == ["bridge", "comparison"]


def test_a_routed_folder_needs_both_types(backbone, tmp_path):
    with pytest.raises(ValueError, match="comparison"):
        RoutedModel({"bridge": (make_model(backbone, hop_layers=0), None)})
    assert load_config(None, ["train.question_types=separate"]).train.question_types == "separate"


# --- the gat preset ----------------------------------------------------------------------------------


def test_the_gat_preset_is_the_release_and_explicit_settings_win():
    cfg = load_config(None, ["model.preset=gat"]).model
    assert (cfg.hop_variant, cfg.hop_dropout, cfg.isolated_nodes, cfg.hop_fusion_init) == ("gat", 0.0, "zero", "random")
    cfg = load_config(None, ["model.preset=gat", "model.hop_dropout=0.2"]).model
    assert cfg.hop_variant == "gat" and cfg.hop_dropout == 0.2
    assert ModelConfig.model_validate(cfg.model_dump()) == cfg  # a saved config loads back the same
    plain = ModelConfig()
    assert (plain.hop_variant, plain.hop_dropout, plain.isolated_nodes) == ("paper", 0.1, "self_loop")


# --- honest metrics ------------------------------------------------------------------------------------


def test_quarantined_questions_count_as_misses():
    rows = distractor_rows()[:1]
    perfect = {"qid": "b1", "answer": "Paris", "supporting_facts": []}
    alone = evaluate_hotpot(hotpot_gold(rows), hotpot_prediction_file([perfect]))
    honest = evaluate_hotpot(hotpot_gold(rows, ["lost1", "lost2", "b1"]), hotpot_prediction_file([perfect]))
    assert alone["em"] == 1.0 and honest["em"] == pytest.approx(1 / 3)  # b1 is not counted twice


def test_quarantine_ids_are_read_from_raw_records_even_truncated(tmp_path):
    raw = json.dumps({"qid": 'q"7', "question": "x" * 5000, "type": "comparison"})[:300]
    rows = [{"raw": raw}, {"raw": '{"_id": "a1", "type": "bridge"}'}, {"raw": "not json at all"}]
    rows.append({"raw": '{"qid": "c9", "type": "comparison"}'})
    assert qids_of_quarantine(rows) == ['q"7', "a1", "c9"]
    assert qids_of_quarantine(rows, kinds=("bridge",)) == ['q"7', "a1"]  # q"7's type was cut off: kept
    graphs, quarantine = tmp_path / "graphs", tmp_path / "quarantine"
    graphs.mkdir()
    quarantine.mkdir()
    (graphs / "_summary.json").write_text(json.dumps({"quarantine": str(quarantine)}))
    table = [{"source": "s", "position": i, "reason": "r", "raw": r["raw"]} for i, r in enumerate(rows)]
    pq.write_table(pa.Table.from_pylist(table, schema=schemas.QUARANTINE), quarantine / "part-00000.parquet")
    assert quarantined_qids(str(graphs)) == ['q"7', "a1", "c9"]
    assert quarantined_qids(str(tmp_path / "elsewhere")) == []

    # what the training driver hands its workers: the dev split's misses and the table's settings
    from xh.stages.train import Job
    from xh.storage.store import Store
    from xh.train.data import dev_source, graph_settings
    from xh.train.loop import log_graph_settings
    from xh.train.split import dev_missed, in_dev_split

    def job(cfg, folder):  # the job `Job.of` makes, less its checks of a complete graphs table
        store = Store.from_config(cfg)
        at = store.at(folder)
        return Job(cfg, store, at, dev_source(cfg, at), store.at(str(tmp_path / "train")))

    cfg = load_config(None, ["train.dev_fraction=0.5"])
    assert job(cfg, str(graphs)).dev is None  # HotpotQA without train.dev_graphs: a split
    assert dev_missed(job(cfg, str(graphs)).split()) == [q for q in ['q"7', "a1", "c9"] if in_dev_split(q, 0.5)]
    cfg = load_config(None, ["train.question_types=bridge", f"train.dev_graphs={graphs}"])
    assert job(cfg, "unused").dev.uri == str(graphs)
    assert dev_missed(job(cfg, "unused").split()) == ['q"7', "a1"]
    summary = {"quarantine": str(quarantine), "edge_mode": "full", "settings": {"ir_keep": 2, "seed": 13}}
    (graphs / "_summary.json").write_text(json.dumps(summary))
    settings = graph_settings(Store().at(str(graphs)))
    assert settings == {"edge_mode": "full", "ir_keep": 2, "seed": 13, "table": str(graphs)}
    logged = {}
    log_graph_settings(SimpleNamespace(log_params=logged.update), settings | {"flags": ["a"]})
    assert logged["graphs.edge_mode"] == "full" and logged["graphs.flags"] == '["a"]'


def test_supporting_fact_titles_meet_the_official_gold_as_written():
    """The gold keeps HTML entities ("Ben &amp; Jerry's"); the official script compares titles exactly."""
    context = [["Ben &amp; Jerry's", ["Ben & Jerry's makes ice cream.", " It is in Vermont."]], ["Vermont", OTHER]]
    record = {
        "_id": "bj",
        "question": "Where is Ben & Jerry's?",
        "answer": "Vermont",
        "type": "bridge",
        "supporting_facts": [["Ben &amp; Jerry's", 1]],
        "context": context,
    }
    items, _ = distractor_items([record], "test")
    (outcome,) = distractor_graphs(items, GraphsConfig(setting="distractor"))
    row = outcome.graph
    node = row["nodes"][0]
    assert node["title"] == "Ben &amp; Jerry's" and node["doc_id"] == "Ben & Jerry's"
    assert node["supporting_sentences"] == [1]  # labels still find the fact
    predicted = {"qid": "bj", "answer": "Vermont", "supporting_facts": [[node["title"], 1]]}
    official_gold = [{k: record[k] for k in ("_id", "answer", "type", "supporting_facts")}]
    for gold in (official_gold, hotpot_gold([row])):
        assert evaluate_hotpot(gold, hotpot_prediction_file([predicted]))["sp_em"] == 1.0


# --- Fig. 2 -----------------------------------------------------------------------------------------------


def test_fig2_groups_are_scaled_by_in_degree_and_single_in_edges_are_apart(backbone, tokenizer):
    from xh.train.figures import HopAttentionRecorder

    graph = make_graph(
        tokenizer,
        "q1",
        "Where is the tower?",
        [GUSTAVE, EIFFEL, STATUE, OTHER],
        [(0, 1), (2, 1), (3, 1), (1, 0)],  # node 1 (answer) has three in-edges, node 0 one
        answer=(1, "Paris, France"),
        relevance=[1, 1, 0, 0],
    )
    model = make_model(backbone, hop_layers=2).eval()
    batches = []
    with HopAttentionRecorder(model) as recorder, torch.no_grad():
        batch = collate([graph])
        batches.append(([graph], batch, model(batch)))
    weights = recorder.weights(batches)
    assert sorted(weights) == [0, 1]
    for e in weights.values():
        assert len(e["all"]) == 3 and len(e["all_to_answer"]) == 3 and len(e["supporting_to_answer"]) == 1
        assert np.allclose(e["single_in_edge"], 1.0)  # weight 1 x its one in-edge
        assert np.isclose(e["all_to_answer"].sum(), 3.0, atol=1e-4)  # one softmax over 3 in-edges, x 3 in-edges
    summary = recorder.summary(batches)
    assert (
        summary["hop1_attention_single_in_edge_edges"] == 1.0 and "hop2_attention_supporting_to_answer_mean" in summary
    )
    assert "hop2_attention_all_to_answer_mean" not in summary  # 1 by construction
