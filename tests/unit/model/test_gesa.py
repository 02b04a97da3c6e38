"""GESA-style typed hop attention (xh.model.gesa) and typed edges (xh.graph.typed): typed scores, the reduction
to XH, edge types, relation labels."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import BertConfig, BertModel
from transformers.models.bert.modeling_bert import eager_attention_forward

from xh.graph.typed import EDGE_TYPES, edge_type_ids, typed_edges
from xh.model.encoder import embed, run_layer
from xh.model.gesa import (
    TOKEN_RELATIONS,
    GESAHopStep,
    HubRelations,
    TypedHopAttention,
    TypedHopGraph,
    hub_label_matrix,
    hub_relation_labels,
    relation_attention,
    self_attention_projections,
    use_hub_relations,
)
from xh.model.hop import HopGraph, HopStep, find_encoder_layers

T = {name: i for i, name in enumerate(EDGE_TYPES)}


def identity_attention(hidden: int, heads: int) -> TypedHopAttention:
    attention = TypedHopAttention(hidden, heads)
    with torch.no_grad():
        for proj in (attention.query, attention.key, attention.value):
            proj.weight.copy_(torch.eye(hidden))
            proj.bias.zero_()
    return attention


def typed_graph(pairs: list[tuple[int, int, str]], num_nodes: int, isolated: str = "self_loop") -> TypedHopGraph:
    edges = torch.tensor([[s for s, _, _ in pairs], [d for _, d, _ in pairs]], dtype=torch.long)
    types = torch.tensor([T[t] for _, _, t in pairs], dtype=torch.long)
    return TypedHopGraph.build(edges, types, num_nodes, isolated)


# --- the typed score -------------------------------------------------------------------------------


def test_typed_score_adds_the_edge_types_vector_to_the_key_on_a_three_node_graph():
    # hubs h0 = (1, 0), h1 = (0, 1), h2 = (1, 1); q = k = v = h (identity projections), one head, d = 2.
    attention = identity_attention(2, 1)
    with torch.no_grad():
        attention.relation[T["hyperlink"]] = torch.tensor([1.0, 0.0])
        attention.relation[T["reverse_hyperlink"]] = torch.tensor([0.0, -1.0])
    hubs = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    # into 2: from 0 (hyperlink), from 1 (reverse hyperlink), from itself (self); into 0: from 2 (hyperlink);
    # node 1 has no in-edge: it gets a self loop.
    graph = typed_graph([(0, 2, "hyperlink"), (1, 2, "reverse_hyperlink"), (2, 2, "self"), (2, 0, "hyperlink")], 3)
    gathered, weights = attention(hubs, graph)

    # scores into 2: q2·(k0 + r_hyp) = (1,1)·(2,0) = 2; q2·(k1 + r_rev) = (1,1)·(0,0) = 0; q2·k2 = 2; all / √2
    s = 2 / math.sqrt(2)
    z = 2 * math.exp(s) + 1
    a, b = math.exp(s) / z, 1 / z
    assert weights[:3, 0].tolist() == pytest.approx([a, b, a], abs=1e-6)
    assert weights[3:, 0].tolist() == pytest.approx([1.0, 1.0])  # 2 -> 0, and node 1's added self loop
    assert gathered[2].tolist() == pytest.approx([a * 1 + b * 0 + a * 1, a * 0 + b * 1 + a * 1], abs=1e-6)
    assert gathered[0].tolist() == pytest.approx([1.0, 1.0])  # v2
    assert gathered[1].tolist() == pytest.approx([0.0, 1.0])  # v1, through its self loop
    assert graph.edge_type.tolist() == [T["hyperlink"], T["reverse_hyperlink"], T["self"], T["hyperlink"], T["self"]]


def test_type_vectors_are_split_over_heads_like_the_keys():
    # two heads of size 1: head 0 reads coordinate 0, head 1 coordinate 1 of the relation vector
    attention = identity_attention(2, 2)
    with torch.no_grad():
        attention.relation[T["co_retrieved"]] = torch.tensor([5.0, 0.0])
    hubs = torch.tensor([[1.0, 1.0], [1.0, 1.0], [1.0, 1.0]])
    graph = typed_graph([(0, 2, "co_retrieved"), (1, 2, "self")], 3, isolated="zero")
    _, weights = attention(hubs, graph)
    # head 0: scores (1·(1+5), 1·1) -> softmax(6, 1); head 1: (1, 1) -> one half each
    assert weights[:, 0].tolist() == pytest.approx([1 / (1 + math.exp(-5)), 1 / (1 + math.exp(5))], abs=1e-6)
    assert weights[:, 1].tolist() == pytest.approx([0.5, 0.5])


def test_with_zero_type_vectors_and_xh_weights_the_step_equals_hop_step_paper():
    torch.manual_seed(0)
    xh_step = HopStep(16, 4, variant="paper", dropout=0.0).eval()
    gesa_step = GESAHopStep(16, 4, dropout=0.0).eval()
    missing, unexpected = gesa_step.load_state_dict(xh_step.state_dict(), strict=False)
    assert missing == ["attention.relation"] and unexpected == []
    assert torch.count_nonzero(gesa_step.attention.relation) == 0
    hidden = torch.randn(5, 7, 16)
    edges = torch.tensor([[0, 1, 2, 3, 0, 4], [1, 2, 0, 0, 3, 3]])
    types = torch.tensor(
        [T["hyperlink"], T["reverse_hyperlink"], T["co_retrieved"], T["comparison"], T["self"], T["hyperlink"]]
    )
    expected = xh_step(hidden, HopGraph.build(edges, 5))
    got = gesa_step(hidden, TypedHopGraph.build(edges, types, 5))
    torch.testing.assert_close(got, expected)
    assert torch.equal(got[:, 1:], hidden[:, 1:])  # Eq. 9: only the hub changes


def test_a_type_vector_changes_only_the_hubs_with_an_in_edge_of_that_type():
    torch.manual_seed(1)
    step = GESAHopStep(8, 2, dropout=0.0).eval()
    hidden = torch.randn(4, 3, 8)
    graph_edges = [(0, 1, "hyperlink"), (2, 1, "co_retrieved"), (1, 2, "co_retrieved"), (3, 3, "self"), (0, 0, "self")]
    before = step(hidden, typed_graph(graph_edges, 4))
    with torch.no_grad():
        step.attention.relation[T["hyperlink"]] = torch.randn(8)
    after = step(hidden, typed_graph(graph_edges, 4))
    changed = [not torch.allclose(before[i], after[i]) for i in range(4)]
    assert changed == [False, True, False, False]  # only node 1 has a hyperlink in-edge (and another one)


def test_the_hub_to_hub_projections_start_as_copies_of_a_pretrained_layer():
    config = BertConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=2, intermediate_size=64, vocab_size=50)
    torch.manual_seed(0)
    backbone = BertModel(config)
    layer = find_encoder_layers(backbone)[1]
    projections = self_attention_projections(layer)
    assert projections["query"] is layer.attention.self.query
    step = GESAHopStep(32, 2)
    step.copy_pretrained(query=projections["query"])
    assert torch.equal(step.attention.query.weight, layer.attention.self.query.weight)
    assert step.attention.query.weight.data_ptr() != layer.attention.self.query.weight.data_ptr()  # separate
    assert not torch.equal(step.attention.key.weight, layer.attention.self.key.weight)
    with pytest.raises(ValueError, match="pretrained projection"):
        GESAHopStep(16, 2).copy_pretrained(query=projections["query"])


def test_typed_steps_run_between_a_backbones_layers_and_the_type_vectors_get_gradients():
    config = BertConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=2, intermediate_size=64, vocab_size=50)
    torch.manual_seed(0)
    backbone = BertModel(config, add_pooling_layer=False)
    steps = torch.nn.ModuleList(GESAHopStep(32, 2) for _ in range(2))
    # node 1 weighs two in-edges (a single in-edge gets weight 1 whatever its score: no gradient)
    graph = typed_graph([(0, 1, "hyperlink"), (2, 1, "co_retrieved"), (1, 0, "reverse_hyperlink")], 3)
    x, mask = embed(backbone, torch.randint(1, 50, (3, 6)))
    for layer, step in zip(find_encoder_layers(backbone), steps):
        x = step(run_layer(layer, x, mask), graph)
    x[:, 0].sum().backward()
    assert len(graph.attention) == 2
    for step in steps:
        grad = step.attention.relation.grad
        assert grad is not None and grad[T["hyperlink"]].abs().sum() > 0
        assert grad[T["comparison"]].abs().sum() == 0  # no edge of that type


# --- edge types from a graph row -------------------------------------------------------------------


def test_typed_edges_of_a_bridge_graph():
    # nodes: 0 ir, 1 el, 2 exp, 3 exp; hyperlinks 0->2, 2->3, 3->2, 1->0
    sources = ["ir", "el", "exp", "exp"]
    edges = [{"src": 0, "dst": 2}, {"src": 2, "dst": 3}, {"src": 3, "dst": 2}, {"src": 1, "dst": 0}]
    typed = {(e["src"], e["dst"]): e["type"] for e in typed_edges(edges, sources, "bridge")}
    assert typed == {
        (0, 2): "hyperlink",
        (2, 0): "reverse_hyperlink",
        (2, 3): "hyperlink",
        (3, 2): "hyperlink",  # linked both ways: both are hyperlinks
        (1, 0): "hyperlink",
        (0, 1): "reverse_hyperlink",  # also co-retrieved, but the hyperlink wins
        (0, 0): "self",
        (1, 1): "self",
        (2, 2): "self",
        (3, 3): "self",
    }


def test_typed_edges_join_the_documents_the_question_retrieved_and_sort_the_rows():
    sources = ["context", "context", "context"]
    rows = typed_edges([(0, 1)], sources, "bridge")
    assert [(e["src"], e["dst"], e["type"]) for e in rows] == [
        (0, 0, "self"),
        (0, 1, "hyperlink"),
        (0, 2, "co_retrieved"),
        (1, 0, "reverse_hyperlink"),
        (1, 1, "self"),
        (1, 2, "co_retrieved"),
        (2, 0, "co_retrieved"),
        (2, 1, "co_retrieved"),
        (2, 2, "self"),
    ]
    assert edge_type_ids(rows).tolist() == [4, 0, 2, 1, 4, 2, 2, 2, 4]


def test_typed_edges_of_a_comparison_graph_are_comparison_pairs_whatever_the_links():
    rows = typed_edges([{"src": 0, "dst": 1}], ["ir", "el"], "comparison")
    assert [(e["src"], e["dst"], e["type"]) for e in rows] == [
        (0, 0, "self"),
        (0, 1, "comparison"),
        (1, 0, "comparison"),
        (1, 1, "self"),
    ]
    with pytest.raises(ValueError, match="outside"):
        typed_edges([(0, 5)], ["ir", "el"], "bridge")


# --- relation labels inside a node -----------------------------------------------------------------


def test_relation_attention_with_no_labels_is_the_backbones_eager_attention():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 5, 4) for _ in range(3))
    mask = torch.zeros(2, 1, 1, 5)
    mask[1, ..., 3:] = -1e4  # padding of the second sequence
    relations = torch.randn(len(TOKEN_RELATIONS), 3, 4)
    labels = torch.zeros(2, 5, 5, dtype=torch.long)
    out, weights = relation_attention(q, k, v, labels, relations, mask, scaling=0.5)
    module = torch.nn.Module().eval()
    expected_out, expected_weights = eager_attention_forward(module, q, k, v, mask, scaling=0.5)
    torch.testing.assert_close(out, expected_out)
    torch.testing.assert_close(weights, expected_weights)


def test_relation_attention_adds_q_dot_r_of_the_label_on_a_hand_case():
    # one head, d = 1, two tokens; q = (1, 2), k = (1, 0), v = (10, 20); label(0 -> 1) = 1 with r_1 = 3
    q = torch.tensor([1.0, 2.0]).view(1, 1, 2, 1)
    k = torch.tensor([1.0, 0.0]).view(1, 1, 2, 1)
    v = torch.tensor([10.0, 20.0]).view(1, 1, 2, 1)
    labels = torch.tensor([[[0, 1], [0, 0]]])
    relations = torch.tensor([[[100.0]], [[3.0]]])  # row 0 is never used
    out, weights = relation_attention(q, k, v, labels, relations, scaling=1.0)
    # row 0: scores (1·1, 1·(0 + 3)) = (1, 3); row 1: (2·1, 2·0) = (2, 0)
    w0 = [1 / (1 + math.exp(2)), math.exp(2) / (1 + math.exp(2))]
    w1 = [math.exp(2) / (1 + math.exp(2)), 1 / (1 + math.exp(2))]
    assert weights[0, 0].tolist() == [pytest.approx(w0), pytest.approx(w1)]
    assert out[0, :, 0, 0].tolist() == pytest.approx([10 * w0[0] + 20 * w0[1], 10 * w1[0] + 20 * w1[1]])


def test_hub_relation_labels_follow_the_node_layout():
    # [CLS] q q [SEP] anchor [SEP] p p [SEP] pad
    sep = 102
    input_ids = torch.tensor([[101, 7, 8, sep, 9, sep, 11, 12, sep, 0]])
    token_types = torch.tensor([[0, 0, 0, 0, 0, 0, 1, 1, 1, 0]])
    attention_mask = torch.tensor([[1, 1, 1, 1, 1, 1, 1, 1, 1, 0]])
    labels = hub_relation_labels(input_ids, token_types, attention_mask, sep)
    assert [TOKEN_RELATIONS[i] for i in labels[0]] == [
        "none",
        "question",
        "question",
        "none",
        "anchor",
        "none",
        "paragraph",
        "paragraph",
        "none",
        "none",
    ]
    matrix = hub_label_matrix(labels)
    assert torch.equal(matrix[0, 0], labels[0]) and torch.equal(matrix[0, :, 0], labels[0])
    assert matrix[0, 1:, 1:].abs().sum() == 0


def test_hub_relations_in_a_backbone_change_nothing_at_zero_and_only_what_the_labels_reach_otherwise():
    config = BertConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=2, intermediate_size=64, vocab_size=50)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    backbone = BertModel(config, add_pooling_layer=False).eval()
    input_ids = torch.tensor([[1, 7, 8, 2, 11, 12, 2, 0], [1, 9, 2, 13, 14, 15, 16, 2]])
    token_types = torch.tensor([[0, 0, 0, 0, 1, 1, 1, 0], [0, 0, 0, 1, 1, 1, 1, 1]])
    attention_mask = torch.tensor([[1, 1, 1, 1, 1, 1, 1, 0], [1] * 8])
    plain = backbone(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    relations = HubRelations(num_layers=1, heads=2, head_size=16)
    layers = find_encoder_layers(backbone)
    use_hub_relations(backbone, relations, [layers[1]])
    labels = hub_label_matrix(hub_relation_labels(input_ids, token_types, attention_mask, sep_token_id=2))
    at_zero = backbone(input_ids=input_ids, attention_mask=attention_mask, hub_relation_labels=labels).last_hidden_state
    torch.testing.assert_close(at_zero, plain)  # padding still masked: the mask function is registered too

    with torch.no_grad():
        relations.vectors[0, TOKEN_RELATIONS.index("paragraph")] = 3.0
    moved = backbone(input_ids=input_ids, attention_mask=attention_mask, hub_relation_labels=labels).last_hidden_state
    assert not torch.allclose(moved[:, 0], plain[:, 0])  # the hub attends to its paragraph differently
    # a call without labels: the plain backbone
    torch.testing.assert_close(backbone(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state, plain)
