"""GESA and DocHopper as variants of the project's model: config keys, the typed edge mode, the same
batches, saved format, inference path and registry flavour as XH (`xh.model.variants`)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest
import torch

from xh import schemas
from xh.config import GraphsConfig, ModelConfig, load_config
from xh.graph.encode import encode_graph
from xh.graph.hotpot import distractor_graphs, distractor_items
from xh.graph.typed import EDGE_TYPES
from xh.inference import load_model, predict_graphs
from xh.model.batch import collate
from xh.model.decode import decode
from xh.model.dochopper.corpus import CorpusCache
from xh.model.dochopper.model import DocHopper
from xh.model.gesa import GESAHopStep
from xh.model.routed import save_routed
from xh.model.variants import architecture, architecture_of, load_saved, new_model, training_batch
from xh.model.xh import XHModel
from xh.registry.register import model_flavour

RECORDS = [
    {
        "_id": "b1",
        "type": "bridge",
        "question": "Which city is the capital of the country where Alpha was born?",
        "answer": "Paris",
        "supporting_facts": [["Alpha", 0], ["France", 1]],
        "context": [
            ["Gamma", ["Gamma is a river.", " It is long."]],
            ["Alpha", ["Alpha was born in France.", " Alpha sings."]],
            ["France", ["France is a country.", " Its capital is Paris.", " Paris is large."]],
        ],
    },
    {
        "_id": "c1",
        "type": "comparison",
        "question": "Are Alpha and Beta both singers?",
        "answer": "yes",
        "supporting_facts": [["Alpha", 1], ["Beta", 0]],
        "context": [
            ["Alpha", ["Alpha was born in France.", " Alpha sings."]],
            ["Beta", ["Beta sings too.", " Beta was born in Spain."]],
        ],
    },
]


def graph_rows(edge_mode: str) -> list[dict]:
    items, quarantined = distractor_items(RECORDS, "test")
    assert not quarantined
    outcomes = distractor_graphs(items, GraphsConfig(setting="distractor", edge_mode=edge_mode))
    return [o.graph for o in outcomes]


# --- config and the typed edge mode -------------------------------------------------------------------


def test_config_keys_of_the_variants():
    cfg = load_config(
        None,
        [
            "model.hop_variant=gesa",
            "model.hub_relations=true",
            "model.architecture=dochopper",
            "model.dochopper_hops=[paragraph, sentence]",
            "graphs.edge_mode=typed",
        ],
    )
    assert (cfg.model.hop_variant, cfg.model.hub_relations, cfg.model.architecture) == ("gesa", True, "dochopper")
    assert cfg.model.dochopper_hops == ["paragraph", "sentence"] and cfg.graphs.edge_mode == "typed"


def test_typed_edge_mode_writes_each_edges_type_beside_it():
    bridge, comparison = graph_rows("typed")
    assert bridge["edge_mode"] == comparison["edge_mode"] == "typed"
    typed = {(e["src"], e["dst"]): t for e, t in zip(bridge["edges"], bridge["edge_types"])}
    # Alpha (1) mentions France (2): hyperlink 1 -> 2 and its reverse; all three came with the question
    assert typed[(1, 2)] == "hyperlink" and typed[(2, 1)] == "reverse_hyperlink"
    assert typed[(0, 1)] == "co_retrieved" and all(typed[(i, i)] == "self" for i in range(3))
    assert set(comparison["edge_types"]) == {"comparison", "self"}
    # the other modes keep their edges and write no types
    plain = graph_rows("hyperlink")[0]
    assert plain["edge_types"] is None and plain["edges"] == [{"src": 1, "dst": 2}]


def test_graphs_tables_without_the_edge_types_column_still_read(tmp_path):
    rows = graph_rows("typed")
    pq.write_table(pa.Table.from_pylist(rows, schema=schemas.GRAPHS), tmp_path / "new.parquet")
    old_schema = pa.schema([f for f in schemas.GRAPHS if f.name != "edge_types"])
    old_rows = [{k: v for k, v in r.items() if k != "edge_types"} for r in graph_rows("hyperlink")]
    pq.write_table(pa.Table.from_pylist(old_rows, schema=old_schema), tmp_path / "old.parquet")
    read = {r["qid"] + r["edge_mode"]: r for r in pads.dataset(tmp_path, schema=schemas.GRAPHS).to_table().to_pylist()}
    assert read["b1typed"]["edge_types"] == rows[0]["edge_types"]
    assert read["b1hyperlink"]["edge_types"] is None


# --- GESA inside XHModel --------------------------------------------------------------------------------


def test_gesa_with_zero_type_vectors_is_xh_on_the_same_edges_and_survives_save_and_load(tiny_backbone, tmp_path):
    cfg = ModelConfig(backbone=tiny_backbone, hop_layers=2, hop_variant="gesa", hop_dropout=0.0, max_node_tokens=48)
    torch.manual_seed(0)
    gesa = XHModel.from_backbone(cfg).eval()
    assert all(isinstance(step, GESAHopStep) for step in gesa.hop_steps)
    plain = XHModel.from_backbone(cfg.model_copy(update={"hop_variant": "paper"})).eval()
    missing, unexpected = plain.load_state_dict(gesa.state_dict(), strict=False)
    assert not missing and all(k.endswith("attention.relation") for k in unexpected)

    graphs = [encode_graph(r, gesa.tokenizer, 48) for r in graph_rows("typed")]
    batch = collate(graphs)
    assert batch.edge_types.tolist() == [EDGE_TYPES.index(t) for r in graph_rows("typed") for t in r["edge_types"]]
    with torch.no_grad():
        base = plain(batch)
        torch.testing.assert_close(gesa(batch).hidden_states, base.hidden_states)
        gesa.hop_steps[0].attention.relation[EDGE_TYPES.index("hyperlink")] += 1.0
        changed = gesa(batch)
    # a hyperlink's type vector moves the weights of its destination's in-edges, and only those
    into = batch.edges[1, batch.edge_types == EDGE_TYPES.index("hyperlink")]
    moved = ~torch.isclose(changed.hop_attention[0], base.hop_attention[0]).all(-1)
    assert moved.any() and bool(torch.isin(batch.edges[1, moved], into).all())

    loaded = load_saved(gesa.save_pretrained(tmp_path / "gesa"))
    with torch.no_grad():
        torch.testing.assert_close(loaded(batch).hidden_states, changed.hidden_states)
    assert model_flavour(loaded) == {"architecture": "xh", "hop_variant": "gesa"}


def test_gesa_refuses_graphs_without_edge_types_in_one_line(tiny_backbone):
    model = XHModel.from_backbone(ModelConfig(backbone=tiny_backbone, hop_layers=1, hop_variant="gesa"))
    batch = collate([encode_graph(r, model.tokenizer, 48) for r in graph_rows("hyperlink")])
    with pytest.raises(ValueError, match="graphs.edge_mode=typed"):
        model(batch)


def test_gesa_hub_relations_at_zero_change_nothing_and_get_gradients(tiny_backbone):
    cfg = ModelConfig(backbone=tiny_backbone, hop_layers=2, hop_variant="gesa", hop_dropout=0.0, max_node_tokens=48)
    torch.manual_seed(0)
    base = XHModel.from_backbone(cfg).eval()
    torch.manual_seed(0)
    relations = XHModel.from_backbone(cfg.model_copy(update={"hub_relations": True})).eval()
    relations.load_state_dict(base.state_dict(), strict=False)
    batch = collate([encode_graph(r, base.tokenizer, 48) for r in graph_rows("typed")])
    with torch.no_grad():
        torch.testing.assert_close(relations(batch).hidden_states, base(batch).hidden_states, atol=1e-5, rtol=1e-5)
    relations.train()
    relations(batch).loss.backward()
    assert relations.hub_relations.vectors.grad.abs().sum() > 0


# --- DocHopper through the same paths -------------------------------------------------------------------


def test_dochopper_trains_saves_and_predicts_through_the_xh_paths(tiny_backbone, tmp_path):
    cfg = ModelConfig(backbone=tiny_backbone, architecture="dochopper", max_node_tokens=48)
    torch.manual_seed(0)
    model = new_model(cfg)
    assert isinstance(model, DocHopper) and architecture_of(model) == "dochopper"
    rows = graph_rows("hyperlink")
    batch = training_batch(model, rows, model.tokenizer, cfg.max_node_tokens)
    assert batch.num_graphs == 2 and batch.num_real_tokens > 0
    out = model(batch)
    out.loss.backward()
    assert torch.isfinite(out.loss)

    loaded, tokenizer = load_model(str(model.save_pretrained(tmp_path / "dochopper")))
    assert isinstance(loaded, DocHopper) and model_flavour(loaded) == {"architecture": "dochopper"}
    predictions = predict_graphs(loaded, tokenizer, rows, batch_graphs=2)
    xh = XHModel.from_backbone(ModelConfig(backbone=tiny_backbone, hop_layers=1))
    graphs = [encode_graph(r, xh.tokenizer, 48) for r in rows]
    with torch.no_grad():
        expected_keys = set(decode(graphs, collate(graphs), xh(collate(graphs)), 30)[0])
    assert [p["qid"] for p in predictions] == ["b1", "c1"]
    assert all(set(p) == expected_keys for p in predictions)


def test_the_corpus_cache_encodes_a_paragraph_once_and_persists_per_folder(tiny_backbone, tmp_path):
    torch.manual_seed(0)
    model = new_model(ModelConfig(backbone=tiny_backbone, architecture="dochopper", max_node_tokens=48)).eval()
    rows = graph_rows("hyperlink")
    model.corpus_cache = CorpusCache(str(tmp_path / "cache"))
    first = model.predict_rows(rows)
    assert model.corpus_cache.encoded == 4  # Gamma, Alpha, France, Beta (Alpha's paragraph is in both graphs)
    assert model.predict_rows(rows) == first
    assert (model.corpus_cache.encoded, model.corpus_cache.hits) == (4, 4)

    reopened = CorpusCache(str(tmp_path / "cache"))  # another actor or run on the same snapshot
    assert len(reopened) == 4
    model.corpus_cache = reopened
    model.predict_rows(rows)
    assert reopened.encoded == 0
    model.train()  # the weights may change from here: nothing stale is kept in memory
    assert len(model.corpus_cache) == 0
    model.predict_rows(rows)  # as training's dev evaluation calls it: in train mode, cache emptied after
    assert model.training and len(model.corpus_cache) == 0


def test_each_architecture_is_found_by_its_name_and_its_saved_folder(tiny_backbone, tmp_path):
    torch.manual_seed(0)
    xh = new_model(ModelConfig(backbone=tiny_backbone, hop_layers=1, max_node_tokens=48))
    hopper = new_model(ModelConfig(backbone=tiny_backbone, architecture="dochopper", max_node_tokens=48))
    assert (architecture(xh).name, architecture(hopper).name) == ("xh", "dochopper")
    assert architecture(xh).encodes_graphs and not architecture(hopper).encodes_graphs

    folder = xh.save_pretrained(tmp_path / "xh")
    routed = load_saved(save_routed(tmp_path / "routed", {"bridge": folder, "comparison": folder}))
    assert architecture(routed).name == "routed" and sorted(routed.models) == ["bridge", "comparison"]
    assert architecture_of(routed) == "xh" and model_flavour(routed) == {"architecture": "xh", "hop_variant": "paper"}
    with pytest.raises(ValueError, match="train each question type"):
        training_batch(routed, graph_rows("hyperlink"), xh.tokenizer, 48)

    # batch scoring hands every model its shared cache folder: DocHopper uses it, XH has nothing to cache
    architecture(hopper).use_corpus_cache(hopper, str(tmp_path / "cache"))
    assert hopper.corpus_cache.folder.uri == str(tmp_path / "cache")
    architecture(xh).use_corpus_cache(xh, str(tmp_path / "cache"))
    assert not hasattr(xh, "corpus_cache")
