"""The Transformer-XH model: hop attention, batching across graphs, heads and losses, save/load, decoding.

Most tests use a tiny random BERT (3 layers x 32, 4 heads; `make_tiny_backbone` of tests/conftest.py)
saved with the real uncased WordPiece vocabulary to a temporary folder, so that `XHModel.from_backbone`
loads it exactly as it loads a real checkpoint; one test loads the real all-MiniLM-L6-v2.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch
from transformers import AutoModel, BertTokenizerFast

from bench.reference import encode_node
from xh.config import ModelConfig
from xh.graph.encoded import EncodedGraph
from xh.model.batch import collate, pack_batches
from xh.model.decode import decode
from xh.model.hop import DotProductHopAttention, GATHopAttention, HopGraph, HopStep
from xh.model.scatter import segment_softmax
from xh.model.xh import XHModel

# --- fixtures and helpers -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def backbone(make_tiny_backbone) -> str:
    """The tiny BERT of tests/conftest.py with 4 heads (the hop-attention tests count them)."""
    return make_tiny_backbone(heads=4, max_positions=128)


@pytest.fixture(scope="module")
def tokenizer(backbone):
    return BertTokenizerFast.from_pretrained(backbone)


def make_model(backbone: str, seed: int = 0, **overrides) -> XHModel:
    torch.manual_seed(seed)
    return XHModel.from_backbone(ModelConfig(backbone=backbone, **overrides))


def token_span(node: dict, text: str) -> tuple[int, int]:
    """First and last paragraph token covering the first occurrence of `text` in the node's paragraph."""
    start = node["paragraph"].index(text)
    end = start + len(text)
    o = node["offsets"]
    hit = np.flatnonzero(node["paragraph_mask"] & (o[:, 0] < end) & (o[:, 1] > start))
    return int(hit.min()), int(hit.max())


def make_graph(
    tokenizer,
    qid: str,
    question: str,
    paragraphs: list[list[str]],
    edges: list[tuple[int, int]],
    *,
    task: str = "hotpot",
    answer: tuple[int, str] | None = None,
    relevance: list[int] | None = None,
    supporting: dict[int, list[int]] | None = None,
    answer_type: int = -1,
    question_type: int = -1,
    claim_label: int = -1,
) -> EncodedGraph:
    nodes = [encode_node(tokenizer, question, sentences) for sentences in paragraphs]
    n = len(nodes)
    spans = np.zeros((0, 3), np.int64)
    if answer is not None:
        spans = np.array([[answer[0], *token_span(nodes[answer[0]], answer[1])]], np.int64)
    sentence_labels = []
    if supporting is not None:
        for i, node in enumerate(nodes):
            labels = np.zeros(node["num_sentences"], np.int64)
            labels[supporting.get(i, [])] = 1
            sentence_labels.append(labels)
    return EncodedGraph(
        qid=qid,
        task=task,
        input_ids=[x["input_ids"] for x in nodes],
        token_type_ids=[x["token_type_ids"] for x in nodes],
        paragraph_mask=[x["paragraph_mask"] for x in nodes],
        offsets=[x["offsets"] for x in nodes],
        sentence_ids=[x["sentence_ids"] for x in nodes],
        edges=np.array(edges, np.int64).reshape(-1, 2),
        node_doc_ids=[f"{qid}-doc{i}" for i in range(n)],
        node_titles=[f"Title {i}" for i in range(n)],
        node_paragraphs=[x["paragraph"] for x in nodes],
        num_sentences=np.array([x["num_sentences"] for x in nodes], np.int64),
        node_lines=np.arange(n, dtype=np.int64) if task == "fever" else np.full(n, -1, np.int64),
        node_relevance=np.array(relevance if relevance is not None else [-1] * n, np.int64),
        node_has_answer=np.full(n, -1, np.int64),
        answer_spans=spans,
        answer_type=answer_type,
        question_type=question_type,
        claim_label=claim_label,
        sentence_labels=sentence_labels,
    )


EIFFEL = ["The Eiffel Tower stands in Paris, France.", " It opened in 1889 for the World's Fair."]
GUSTAVE = ["Gustave Eiffel was a French civil engineer.", " His company built the Eiffel Tower."]
STATUE = ["The Statue of Liberty was designed by Frédéric Bartholdi.", " Its frame was engineered by Eiffel."]


def hotpot_graphs(tokenizer) -> list[EncodedGraph]:
    """Three labelled graphs of different sizes and shapes (chain, star, single node)."""
    return [
        make_graph(
            tokenizer,
            "q1",
            "Where is the tower built by Gustave Eiffel's company?",
            [GUSTAVE, EIFFEL, STATUE],
            [(0, 1), (1, 0), (2, 0)],
            answer=(1, "Paris, France"),
            relevance=[1, 1, 0],
            supporting={0: [1], 1: [0]},
            answer_type=0,
            question_type=0,
        ),
        make_graph(
            tokenizer,
            "q2",
            "Were the tower and the statue engineered by the same man?",
            [STATUE, EIFFEL],
            [(0, 1), (1, 0)],
            relevance=[1, 1],
            supporting={0: [1], 1: [0]},
            answer_type=1,
            question_type=1,
        ),
        make_graph(
            tokenizer,
            "q3",
            "When did the tower open?",
            [EIFFEL],
            [],
            answer=(0, "1889"),
            relevance=[1],
            supporting={0: [1]},
            answer_type=0,
            question_type=0,
        ),
    ]


# --- hop attention --------------------------------------------------------------------------------------


def test_segment_softmax_matches_a_dense_masked_softmax():
    torch.manual_seed(1)
    dst = torch.tensor([0, 0, 0, 2, 2, 3])
    scores = torch.randn(6, 4) * 30  # large scores: the per-segment max shift must keep it finite
    weights = segment_softmax(scores, dst, num_segments=5)
    for node in range(5):
        rows = dst == node
        if rows.any():
            torch.testing.assert_close(weights[rows], torch.softmax(scores[rows], dim=0))
    assert torch.isfinite(weights).all()


@pytest.mark.parametrize("attention_class", [DotProductHopAttention, GATHopAttention])
def test_a_node_with_one_in_neighbour_attends_to_it_with_weight_one(attention_class):
    torch.manual_seed(2)
    attention = attention_class(hidden_size=16, heads=4).eval()
    hubs = torch.randn(4, 16)
    # 0 -> 1 (node 1's only in-neighbour), 0 -> 2 and 3 -> 2 (two in-neighbours), node 0 and 3 have none.
    graph = HopGraph.build(torch.tensor([[0, 0, 3], [1, 2, 2]]), num_nodes=4, isolated_nodes="zero")
    gathered, weights = attention(hubs, graph)
    single = graph.dst == 1
    torch.testing.assert_close(weights[single], torch.ones(1, 4))
    shared = graph.dst == 2
    torch.testing.assert_close(weights[shared].sum(0), torch.ones(4))
    assert (weights[shared] < 1).all()
    if attention_class is DotProductHopAttention:
        torch.testing.assert_close(gathered[1], attention.value(hubs[0]))
    # "zero": nodes without in-neighbours gather nothing (the GAT keeps its residual projection).
    if attention_class is DotProductHopAttention:
        assert torch.equal(gathered[0], torch.zeros(16))


def test_isolated_nodes_get_a_self_loop_only_when_they_have_no_in_neighbours():
    graph = HopGraph.build(torch.tensor([[0], [1]]), num_nodes=3, isolated_nodes="self_loop")
    assert sorted(zip(graph.src.tolist(), graph.dst.tolist())) == [(0, 0), (0, 1), (2, 2)]
    torch.manual_seed(3)
    attention = DotProductHopAttention(hidden_size=8, heads=2).eval()
    hubs = torch.randn(3, 8)
    gathered, _ = attention(hubs, graph)
    torch.testing.assert_close(gathered[2], attention.value(hubs[2]))  # its own value, weight 1


def test_hop_step_changes_the_hub_only():
    torch.manual_seed(4)
    step = HopStep(hidden_size=16, heads=4).eval()
    hidden = torch.randn(3, 5, 16)
    out = step(hidden, HopGraph.build(torch.tensor([[0, 1], [1, 2]]), num_nodes=3))
    assert torch.equal(out[:, 1:], hidden[:, 1:])
    assert not torch.allclose(out[:, 0], hidden[:, 0])


# --- batching -------------------------------------------------------------------------------------------


def test_collate_pads_to_the_longest_node_and_shifts_edges(tokenizer):
    graphs = hotpot_graphs(tokenizer)
    batch = collate(graphs)
    lengths = [len(ids) for g in graphs for ids in g.input_ids]
    assert batch.input_ids.shape == (6, max(lengths))
    assert batch.attention_mask.sum(1).tolist() == lengths
    assert batch.num_graphs == 3 and batch.num_real_tokens == sum(lengths)
    assert batch.node_graph.tolist() == [0, 0, 0, 1, 1, 2]
    assert batch.edges.T.tolist() == [[0, 1], [1, 0], [2, 0], [3, 4], [4, 3]]
    assert batch.answer_node.tolist() == [1, -1, 5]  # graph 0's node 1; graph 2's node 0 is row 5
    assert batch.answer_type.tolist() == [0, 1, 0]
    assert batch.sentence_labels.tolist()[:2] == [[0, 1], [1, 0]]
    start, end = int(batch.answer_start[0]), int(batch.answer_end[0])
    assert batch.paragraph_mask[1, start] and batch.paragraph_mask[1, end]


def test_collate_refuses_an_edge_outside_its_graph(tokenizer):
    graph = make_graph(tokenizer, "bad", "q?", [EIFFEL, GUSTAVE], [(0, 2)])
    with pytest.raises(ValueError, match="'bad': an edge points outside its 2 nodes"):
        collate([graph])


def test_pack_batches_keeps_every_graph_once_within_the_budget(tokenizer):
    graphs = hotpot_graphs(tokenizer) * 3
    budget = 200
    batches = pack_batches(graphs, max_padded_tokens=budget)
    assert sorted(k for b in batches for k in b) == list(range(len(graphs)))
    for indices in batches:
        padded = collate([graphs[k] for k in indices]).input_ids.numel()
        assert padded <= budget or len(indices) == 1


# --- the model -------------------------------------------------------------------------------------------


def test_k0_reproduces_the_backbone_hidden_states_exactly(backbone, tokenizer):
    batch = collate(hotpot_graphs(tokenizer))
    plain = AutoModel.from_pretrained(backbone).eval()
    expected = plain(
        input_ids=batch.input_ids, attention_mask=batch.attention_mask, token_type_ids=batch.token_type_ids
    ).last_hidden_state
    no_hop = make_model(backbone, hop_layers=0).eval()
    with_hop = make_model(backbone, hop_layers=3).eval()
    with torch.no_grad():
        assert torch.equal(no_hop.encode(batch), expected)
        hop_states = with_hop.encode(batch)
        # The hop layers change hubs (and, through later layers, the rest) ...
        assert not torch.allclose(hop_states[:, 0], expected[:, 0])
        # ... and only inside encode(): the backbone called alone stays the plain backbone.
        alone = with_hop.backbone(
            input_ids=batch.input_ids, attention_mask=batch.attention_mask, token_type_ids=batch.token_type_ids
        ).last_hidden_state
    assert torch.equal(alone, expected)


def test_hop_steps_that_keep_the_hub_reproduce_the_backbone(backbone, tokenizer):
    """Fusion [I, 0]: each hop step hands the hub back unchanged, so K=3 hop layers give the K=0 model."""
    batch = collate(hotpot_graphs(tokenizer))
    model = make_model(backbone, hop_layers=3).eval()
    with torch.no_grad():
        for step in model.hop_steps:
            hidden = step.fusion.out_features
            step.fusion.weight.zero_()
            step.fusion.weight[:, :hidden] = torch.eye(hidden)
            step.fusion.bias.zero_()
        torch.testing.assert_close(model.encode(batch), make_model(backbone, hop_layers=0).eval().encode(batch))


def test_a_hop_step_runs_right_after_its_encoder_layer(backbone, tokenizer):
    """K=1: the last layer's input is the plain backbone's, and the hop step reads the last layer's output."""
    batch = collate(hotpot_graphs(tokenizer))
    model = make_model(backbone, hop_layers=1).eval()
    inputs = dict(input_ids=batch.input_ids, attention_mask=batch.attention_mask, token_type_ids=batch.token_type_ids)
    with torch.no_grad():
        states = model.backbone(**inputs, output_hidden_states=True).hidden_states
        expected = model.backbone(**inputs).last_hidden_state  # the plain last layer's output ...
        graph = HopGraph.build(batch.edges, batch.num_nodes, "self_loop", batch.graph_offsets)
        expected = model.hop_steps[0](expected, graph)  # ... then the hop step
        torch.testing.assert_close(model.encode(batch), expected)
        assert not torch.allclose(states[-1][:, 0], expected[:, 0])


def test_perturbing_one_graph_never_changes_another(backbone, tokenizer):
    model = make_model(backbone, hop_layers=3).eval()
    graphs = hotpot_graphs(tokenizer)
    changed = make_graph(
        tokenizer, "q2", "Who designed the statue of liberty?", [STATUE, GUSTAVE], [(0, 1)], relevance=[1, 1]
    )
    with torch.no_grad():
        before = model(collate(graphs))
        after = model(collate([graphs[0], changed, graphs[2]]))
        alone = model(collate([graphs[2]]))
    rows = {0: slice(0, 3), 2: slice(5, 6)}  # graph 1 (rows 3-4) changed
    for g, r in rows.items():
        length = before.hidden_states.shape[1]
        common = min(length, after.hidden_states.shape[1])
        torch.testing.assert_close(after.hidden_states[r, :common], before.hidden_states[r, :common], atol=1e-5, rtol=0)
        torch.testing.assert_close(after.node_logits[r], before.node_logits[r], atol=1e-5, rtol=0)
        torch.testing.assert_close(after.answer_type_logits[g], before.answer_type_logits[g], atol=1e-5, rtol=0)
    assert not torch.allclose(after.node_logits[3:5], before.node_logits[3:5])
    # A graph batched with others gets what it gets alone (padding differs, hence the tolerance).
    n = alone.hidden_states.shape[1]
    torch.testing.assert_close(before.hidden_states[5, :n], alone.hidden_states[0], atol=1e-5, rtol=0)


def test_losses_are_present_for_labelled_batches_and_gradients_reach_hop_parameters(backbone, tokenizer):
    model = make_model(backbone, hop_layers=2).train()
    out = model(collate(hotpot_graphs(tokenizer)))
    assert set(out.losses) == {"node", "span", "answer_type", "sentence"}
    expected = sum(out.losses.values())  # default weights are all 1
    torch.testing.assert_close(out.loss, expected)
    out.loss.backward()
    hop = dict(model.hop_steps.named_parameters())
    assert len(hop) == 2 * 8
    for name, param in hop.items():
        assert param.grad is not None and param.grad.abs().sum() > 0, name
    for name, param in model.named_parameters():
        assert param.grad is not None, name  # DDP needs every parameter in the graph


def test_head_constants_made_on_the_host_equal_those_made_from_the_tensors(backbone, tokenizer):
    """`collate` makes the heads' batch constants on the host; a batch without them (made elsewhere) gets
    them from its tensors: the same outputs and losses either way."""
    model = make_model(backbone, hop_layers=2).eval()
    batch = collate(hotpot_graphs(tokenizer))
    assert batch.constants is not None
    bare = dataclasses.replace(batch, constants=None)
    with torch.no_grad():
        made, derived = model(batch), model(bare)
    torch.testing.assert_close(made.loss, derived.loss)
    for name in ("start_logits", "node_logits", "answer_type_logits", "sentence_logits"):
        torch.testing.assert_close(getattr(made, name), getattr(derived, name))
    for key, value in batch.constants.items():
        torch.testing.assert_close(value, bare.head_constants()[key])


def test_node_loss_also_ranks_the_answer_node_first_within_its_graph(backbone, tokenizer):
    """Both supporting pages of a bridge question are relevant; only the answer page holds the span, so
    the node loss adds the negative log-probability of the answer node among its graph's nodes."""
    import torch.nn.functional as F

    from xh.model.heads import HotpotHeads

    batch = collate(hotpot_graphs(tokenizer))
    model = make_model(backbone, hop_layers=2).eval()
    with torch.no_grad():
        out = model(batch)
    logits = out.node_logits
    known = batch.node_relevance >= 0
    bce = F.binary_cross_entropy_with_logits(logits[known], batch.node_relevance[known].float())
    rank_terms = []
    for g in range(batch.num_graphs):
        node = int(batch.answer_node[g])
        if node >= 0:
            lo, hi = int(batch.graph_offsets[g]), int(batch.graph_offsets[g + 1])
            rank_terms.append(-(logits[node] - torch.logsumexp(logits[lo:hi], 0)))
    assert len(rank_terms) == 2  # q1 and q3 have a span answer; q2 is yes/no
    torch.testing.assert_close(out.losses["node"], bce + torch.stack(rank_terms).mean())
    # raising the answer node's logit lowers the loss; raising its supporting neighbour's raises the rank term
    heads = {
        name: getattr(out, name)
        for name in (
            "node_logits",
            "start_logits",
            "end_logits",
            "answer_type_logits",
            "sentence_logits",
            "sentence_mask",
        )
    }
    answer = int(batch.answer_node[0])
    neighbour = 0 if answer != 0 else 1
    up = dict(heads, node_logits=logits.clone().index_put_((torch.tensor([answer]),), logits[answer] + 1.0))
    other = dict(heads, node_logits=logits.clone().index_put_((torch.tensor([neighbour]),), logits[neighbour] + 1.0))
    assert HotpotHeads.losses(up, batch)["node"] < out.losses["node"]
    rank_before = rank_terms[0]
    rank_after = -(other["node_logits"][answer] - torch.logsumexp(other["node_logits"][0:3], 0))
    assert rank_after > rank_before


def test_output_reports_hop_attention_per_layer(backbone, tokenizer):
    model = make_model(backbone, hop_layers=2).eval()
    batch = collate(hotpot_graphs(tokenizer))
    with torch.no_grad():
        out = model(batch)
    # the batch's 5 edges, plus a self-loop for q1's node 2 and q3's single node (no in-neighbours)
    assert out.hop_edges.T.tolist() == [[0, 1], [1, 0], [2, 0], [3, 4], [4, 3], [2, 2], [5, 5]]
    assert len(out.hop_attention) == 2
    for weights in out.hop_attention:
        assert weights.shape == (7, 4)  # edges x the backbone's 4 heads
        per_destination = torch.zeros(6, 4).index_add_(0, out.hop_edges[1], weights)
        torch.testing.assert_close(per_destination, torch.ones(6, 4))
        torch.testing.assert_close(weights[0], torch.ones(4))  # node 1 has one in-neighbour (node 0)


def test_loss_is_none_without_labels(backbone, tokenizer):
    model = make_model(backbone, hop_layers=1).eval()
    graph = make_graph(tokenizer, "new", "Where is the tower?", [EIFFEL, GUSTAVE], [(1, 0)])
    out = model(collate([graph]))
    assert out.loss is None and out.losses == {}
    assert out.start_logits.shape == out.end_logits.shape == collate([graph]).input_ids.shape


def test_span_logits_are_masked_to_paragraph_tokens(backbone, tokenizer):
    model = make_model(backbone, hop_layers=1).eval()
    batch = collate(hotpot_graphs(tokenizer))
    with torch.no_grad():
        out = model(batch)
    assert (out.start_logits[~batch.paragraph_mask] == -1e4).all()
    assert (out.end_logits[batch.paragraph_mask] > -1e3).all()


def test_bf16_autocast_runs_on_cpu(backbone, tokenizer):
    model = make_model(backbone, hop_layers=3, hop_dropout=0.0).eval()  # eval: no dropout, comparable runs
    batch = collate(hotpot_graphs(tokenizer))
    with torch.no_grad():
        full = model(batch)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(batch)
    # bf16 matmuls round: close to the float32 run, but not the same numbers.
    assert not torch.equal(out.hidden_states, full.hidden_states)
    torch.testing.assert_close(out.node_logits, full.node_logits, atol=0.1, rtol=0.1)
    assert out.loss.dtype == torch.float32 and torch.isfinite(out.loss)
    out.loss.backward()
    assert model.hop_steps[0].attention.query.weight.grad.abs().sum() > 0


def test_gat_variant_runs_and_trains(backbone, tokenizer):
    model = make_model(backbone, hop_layers=2, hop_variant="gat", hop_dropout=0.0).train()
    out = model(collate(hotpot_graphs(tokenizer)))
    out.loss.backward()
    attention = model.hop_steps[0].attention
    assert isinstance(attention, GATHopAttention)
    for param in (attention.fc.weight, attention.attn_src, attention.attn_dst, attention.res_fc.weight):
        assert param.grad is not None and param.grad.abs().sum() > 0


def test_hop_layers_beyond_the_encoder_are_refused(backbone):
    with pytest.raises(ValueError, match="hop_layers=4 but the encoder has only 3 layers"):
        make_model(backbone, hop_layers=4)


def test_save_then_load_gives_identical_outputs_without_pickle(backbone, tokenizer, tmp_path, monkeypatch):
    model = make_model(backbone, hop_layers=2, hop_variant="gat").eval()
    batch = collate(hotpot_graphs(tokenizer))
    with torch.no_grad():
        expected = model(batch)
    model.save_pretrained(tmp_path / "xh")
    saved = {p.name for p in (tmp_path / "xh").iterdir()}
    assert {"model.safetensors", "xh_config.json", "config.json", "tokenizer.json"} <= saved
    assert not any(name.endswith((".bin", ".pt", ".pkl")) for name in saved)

    def no_pickle(*args, **kwargs):
        raise AssertionError("torch.load must not be used to load an XH model")

    monkeypatch.setattr(torch, "load", no_pickle)
    loaded = XHModel.from_pretrained(tmp_path / "xh")
    assert loaded.cfg == model.cfg and not loaded.training
    with torch.no_grad():
        got = loaded(batch)
    for name in ("hidden_states", "node_logits", "start_logits", "end_logits", "answer_type_logits", "sentence_logits"):
        assert torch.equal(getattr(got, name), getattr(expected, name)), name
    assert loaded.tokenizer("Paris")["input_ids"] == tokenizer("Paris")["input_ids"]


def test_a_folder_without_an_xh_config_is_refused(backbone):
    with pytest.raises(ValueError, match="is not a saved XH model"):
        XHModel.from_pretrained(backbone)


# --- FEVER -----------------------------------------------------------------------------------------------


def fever_graphs(tokenizer) -> list[EncodedGraph]:
    claim1, claim2 = "The Eiffel Tower is in Paris.", "Gustave Eiffel designed the Statue of Liberty."
    full = lambda n: [(i, j) for i in range(n) for j in range(n) if i != j]  # noqa: E731
    return [
        make_graph(
            tokenizer,
            "c1",
            claim1,
            [EIFFEL[:1], EIFFEL[1:], GUSTAVE[:1]],
            full(3),
            task="fever",
            relevance=[1, 0, 0],
            claim_label=0,
        ),
        make_graph(
            tokenizer, "c2", claim2, [STATUE[:1], STATUE[1:]], full(2), task="fever", relevance=[0, 1], claim_label=1
        ),
    ]


def test_fever_claim_loss_is_the_nll_of_the_importance_mixture(backbone, tokenizer):
    model = make_model(backbone, task="fever", hop_layers=2).eval()
    batch = collate(fever_graphs(tokenizer))
    with torch.no_grad():
        out = model(batch)
    node_logits = out.node_logits.double().numpy()
    label_logits = out.label_logits.double().numpy()
    nlls = []
    for rows, gold in ((range(0, 3), 0), (range(3, 5), 1)):
        importance = np.exp(node_logits[rows]) / np.exp(node_logits[rows]).sum()
        p_label = np.exp(label_logits[rows]) / np.exp(label_logits[rows]).sum(1, keepdims=True)
        mixture = (importance[:, None] * p_label).sum(0)
        assert math.isclose(mixture.sum(), 1.0, rel_tol=1e-9)
        np.testing.assert_allclose(np.exp(out.claim_log_probs[len(nlls)].double().numpy()), mixture, rtol=1e-5)
        nlls.append(-math.log(mixture[gold]))
    assert math.isclose(float(out.losses["claim"]), sum(nlls) / 2, rel_tol=1e-5)
    # Not the release's cross-entropy over the probabilities (a second softmax):
    double_softmax = torch.nn.functional.cross_entropy(out.claim_log_probs.exp(), torch.tensor([0, 1]))
    assert not math.isclose(float(out.losses["claim"]), float(double_softmax), rel_tol=1e-3)
    assert set(out.losses) == {"claim", "evidence"}
    torch.testing.assert_close(out.importance[:3].sum(), torch.tensor(1.0))


def test_fever_decode_ranks_evidence_by_importance(backbone, tokenizer):
    model = make_model(backbone, task="fever", hop_layers=1).eval()
    graphs = fever_graphs(tokenizer)
    batch = collate(graphs)
    with torch.no_grad():
        out = model(batch)
    out.node_logits = torch.tensor([0.0, 3.0, 1.0, 2.0, -1.0])
    out.importance = torch.cat([torch.softmax(out.node_logits[:3], 0), torch.softmax(out.node_logits[3:], 0)])
    out.claim_log_probs = torch.log(torch.tensor([[0.2, 0.7, 0.1], [0.1, 0.1, 0.8]]))
    first, second = decode(graphs, batch, out, max_answer_tokens=30)
    assert first["label"] == "REFUTES" and second["label"] == "NOT ENOUGH INFO"
    # FEVER page ids (`fever_page_id` of the titles), as the gold evidence names pages
    assert first["evidence"] == [["Title_1", 1], ["Title_2", 2], ["Title_0", 0]]
    assert second["evidence"] == [["Title_0", 0], ["Title_1", 1]]
    assert math.isclose(sum(first["label_probs"].values()), 1.0, rel_tol=1e-6)


# --- HotpotQA decoding -----------------------------------------------------------------------------------


def test_decode_returns_the_exact_text_of_a_span_through_offsets(backbone, tokenizer):
    model = make_model(backbone, hop_layers=1).eval()
    graphs = hotpot_graphs(tokenizer)
    batch = collate(graphs)
    with torch.no_grad():
        out = model(batch)
    start, end = int(batch.answer_start[0]), int(batch.answer_end[0])  # "Paris, France" in graph 0, node 1
    out.node_logits = torch.tensor([1.0, 4.0, -2.0, 0.5, 0.0, 0.0])
    out.start_logits[1, start] = 50.0
    out.end_logits[1, end] = 50.0
    out.answer_type_logits = torch.tensor([[5.0, 0.0, 0.0], [0.0, 5.0, 0.0], [0.0, 0.0, 5.0]])
    # graph 0 node 1 (EIFFEL): sentence 0 passes; node 0 (GUSTAVE): none passes -> its best sentence (1)
    out.sentence_logits[1, :2] = torch.tensor([3.0, -3.0])
    out.sentence_logits[0, :2] = torch.tensor([-2.0, -1.0])
    first, second, third = decode(graphs, batch, out, max_answer_tokens=30)
    assert first["answer"] == "Paris, France"  # the paragraph's own casing: a slice, not joined word pieces
    assert tokenizer.decode(batch.input_ids[1, start : end + 1]) == "paris, france"
    assert (first["answer_node"], first["answer_doc_id"], first["answer_title"]) == (1, "q1-doc1", "Title 1")
    assert math.isclose(first["node_score"], 1 / (1 + math.exp(-4.0)), rel_tol=1e-6)
    assert first["answer_type"] == "span"
    assert first["supporting_facts"] == [["Title 1", 0], ["Title 0", 1]]
    assert second["answer"] == "yes" and second["answer_type"] == "yes"  # comparison question, yes/no head
    assert third["answer_type"] == "span"  # a bridge question never answers yes/no
    assert third["answer"] in graphs[2].node_paragraphs[0]


def test_decode_keeps_spans_within_max_answer_tokens(backbone, tokenizer):
    model = make_model(backbone, hop_layers=1).eval()
    graphs = hotpot_graphs(tokenizer)[2:]
    batch = collate(graphs)
    with torch.no_grad():
        out = model(batch)
    paragraph = torch.nonzero(batch.paragraph_mask[0]).flatten()
    first, last = int(paragraph[0]), int(paragraph[-1])
    out.start_logits[0, first] = 50.0
    out.end_logits[0, last] = 50.0
    out.answer_type_logits = torch.tensor([[5.0, 0.0, 0.0]])
    (whole,) = decode(graphs, batch, out, max_answer_tokens=last - first + 1)
    assert whole["answer"] == graphs[0].node_paragraphs[0].rstrip()
    (short,) = decode(graphs, batch, out, max_answer_tokens=3)
    assert 0 < len(tokenizer(short["answer"], add_special_tokens=False)["input_ids"]) <= 3


# --- the real pretrained backbone ------------------------------------------------------------------------


def test_real_minilm_loads_with_three_hop_layers_and_trains_a_step(minilm_path):
    torch.manual_seed(0)
    model = XHModel.from_backbone(ModelConfig(backbone=minilm_path, hop_layers=3)).train()
    assert len(model.hop_steps) == 3 and model.backbone.config.hidden_size == 384
    graphs = hotpot_graphs(model.tokenizer)[:2]
    out = model(collate(graphs))
    assert torch.isfinite(out.loss)
    out.loss.backward()
    assert all(p.grad is not None for p in model.parameters())
    assert model.hop_steps[2].attention.key.weight.grad.abs().sum() > 0


def test_rank_zero_progress_line_says_step_loss_speed_and_eta(caplog):
    import logging

    from xh.train.meters import log_progress

    with caplog.at_level(logging.INFO, logger="xh.train"):
        line = log_progress(30, 200, 2.13456, graphs=48, window_s=4.0, done_here=(20, 100.0))
    assert line == "step 30/200  loss 2.1346  12.0 graphs/s  ETA 14m10s"
    assert caplog.records[-1].getMessage() == line
