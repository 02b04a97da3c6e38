"""Token packing (`xh.model.packing`): nodes laid end to end in fixed-length rows compute what `collate` computes.

The model is a tiny random BERT built here (3 layers x 32, vocabulary of 200), and graphs are random
token ids with every kind of label, so every loss term takes part. `PackedXHModel` is `XHModel` with
`_encode` as it reads once packing is wired in (see its docstring); the comparison runs in eval mode
(no dropout: the two layouts would draw different masks) and covers outputs, loss terms, hop attention
weights per edge and every parameter's gradient.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import BertConfig, BertModel, RobertaConfig, RobertaModel

from xh.config import ModelConfig
from xh.graph.encoded import EncodedGraph
from xh.model.batch import collate
from xh.model.packing import (
    PackedBatch,
    encoder_inputs,
    fill_rows,
    fill_rows_one_at_a_time,
    first_fit_decreasing,
    node_states,
    pack,
    round_up,
)
from xh.model.xh import XHModel

VOCAB, CLS, SEP = 200, 2, 3


def tiny_bert(attn_implementation: str = "sdpa") -> BertModel:
    config = BertConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=3,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=128,
        attn_implementation=attn_implementation,
    )
    torch.manual_seed(0)
    return BertModel(config)


def make_model(attn_implementation: str = "sdpa", **overrides) -> XHModel:
    cfg = ModelConfig(
        backbone="tiny", hop_layers=2, hop_dropout=0.0, attn_implementation=attn_implementation, **overrides
    )
    torch.manual_seed(1)
    return XHModel(cfg, tiny_bert(attn_implementation)).eval()


def random_graph(rng: np.random.Generator, qid: str, lengths: list[int], edges: list[tuple[int, int]]) -> EncodedGraph:
    """Nodes `[CLS] question [SEP] paragraph [SEP]` of random ids, 1-3 sentences each, an answer span in node 0."""
    nodes = []
    for length in lengths:
        ids = rng.integers(5, VOCAB, size=length)
        question = int(rng.integers(2, 6))
        ids[0], ids[question + 1], ids[-1] = CLS, SEP, SEP
        paragraph = np.zeros(length, bool)
        paragraph[question + 2 : length - 1] = True
        sentences = int(rng.integers(1, 4))
        sentence_ids = np.where(paragraph, (np.cumsum(paragraph) - 1) * sentences // max(1, paragraph.sum()), -1)
        nodes.append((ids, paragraph, sentence_ids, sentences))
    n = len(lengths)
    start = int(np.flatnonzero(nodes[0][1])[0])
    return EncodedGraph(
        qid=qid,
        task="hotpot",
        input_ids=[x[0].astype(np.int64) for x in nodes],
        token_type_ids=[x[1].astype(np.int64) for x in nodes],
        paragraph_mask=[x[1] for x in nodes],
        offsets=[np.full((len(x[0]), 2), -1, np.int64) for x in nodes],
        sentence_ids=[x[2].astype(np.int64) for x in nodes],
        edges=np.array(edges, np.int64).reshape(-1, 2),
        node_doc_ids=[str(i) for i in range(n)],
        node_titles=[str(i) for i in range(n)],
        node_paragraphs=[""] * n,
        num_sentences=np.array([x[3] for x in nodes], np.int64),
        node_lines=np.full(n, -1, np.int64),
        node_relevance=rng.integers(0, 2, n),
        node_has_answer=np.full(n, -1, np.int64),
        answer_spans=np.array([[0, start, start]], np.int64),
        answer_type=int(rng.integers(0, 3)),
        sentence_labels=[rng.integers(0, 2, x[3]) for x in nodes],
    )


def graphs(seed: int = 0) -> list[EncodedGraph]:
    """Four graphs of different sizes and lengths; isolated nodes in graphs 0 and 2, a single-node graph."""
    rng = np.random.default_rng(seed)
    return [
        random_graph(rng, "a", [40, 12, 25, 9], [(0, 1), (1, 0), (2, 0)]),  # node 3: no in-neighbour
        random_graph(rng, "b", [60, 33, 18], [(0, 1), (1, 2), (2, 0), (1, 0)]),
        random_graph(rng, "c", [21], []),
        random_graph(rng, "d", [8, 50, 31, 44, 16], [(i, j) for i in range(5) for j in range(5) if i != j][:11]),
    ]


def run(model: XHModel, batch) -> tuple[dict, dict[str, torch.Tensor]]:
    """Outputs (real positions only) and every parameter's gradient after backward of the loss."""
    model.zero_grad(set_to_none=True)
    out = model(batch)
    out.loss.backward()
    real = batch.attention_mask.bool()
    outputs = {
        "loss": out.loss,
        **{f"loss_{k}": v for k, v in out.losses.items()},
        "hidden": out.hidden_states[real],
        "node_logits": out.node_logits,
        "start_logits": out.start_logits[real],
        "end_logits": out.end_logits[real],
        "answer_type_logits": out.answer_type_logits,
        "sentence_logits": out.sentence_logits,
        "hop_edges": out.hop_edges,
        **{f"hop_attention_{i}": w for i, w in enumerate(out.hop_attention)},
    }
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    return outputs, grads


@pytest.mark.parametrize(
    "overrides",
    [
        {"attn_implementation": "sdpa"},
        {"attn_implementation": "eager"},
        {"attn_implementation": "sdpa", "hop_variant": "gat", "isolated_nodes": "zero"},
    ],
)
def test_a_packed_batch_gives_the_outputs_loss_and_gradients_of_the_collated_batch(overrides):
    model = make_model(**overrides)
    plain, packed = collate(graphs()), pack(graphs(), row_tokens=128, row_multiple=4)
    assert packed.encoder_shape[0] < plain.num_nodes  # several nodes share a row: this is packing
    expected, expected_grads = run(model, plain)
    outputs, grads = run(model, packed)
    assert outputs.keys() == expected.keys() and "loss_span" in outputs and "loss_sentence" in outputs
    for name, value in expected.items():
        torch.testing.assert_close(outputs[name], value, rtol=1e-4, atol=1e-5, msg=name)
    assert grads.keys() == expected_grads.keys()
    for name, grad in expected_grads.items():
        torch.testing.assert_close(grads[name], grad, rtol=1e-3, atol=1e-5, msg=name)


def test_a_token_never_sees_another_node_sharing_its_row():
    model = make_model()
    batch = pack(graphs(), row_tokens=128)
    row_of = batch.token_index[:, 0] // 128
    target = int(np.argmax([(row_of == row_of[n]).sum() for n in range(batch.num_nodes)]))
    neighbour = next(n for n in range(batch.num_nodes) if n != target and row_of[n] == row_of[target])
    changed = pack(graphs(), row_tokens=128)
    changed.row_input_ids.view(-1)[changed.token_index[neighbour, 1:5]] = 7  # same place: the layout is deterministic
    with torch.no_grad():
        before = model.backbone(**encoder_inputs(batch, model.backbone)).last_hidden_state
        after = model.backbone(**encoder_inputs(changed, model.backbone)).last_hidden_state
    length = int(batch.attention_mask[target].sum())
    states, changed_states = node_states(batch, before), node_states(changed, after)
    torch.testing.assert_close(changed_states[target, :length], states[target, :length])
    assert not torch.allclose(changed_states[neighbour, 1:5], states[neighbour, 1:5])


def test_roberta_style_positions_start_after_the_padding_index():
    config = RobertaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=140,
        pad_token_id=1,
        attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    backbone = RobertaModel(config).eval()
    plain, packed = collate(graphs()), pack(graphs(), row_tokens=128)
    plain.input_ids[plain.attention_mask == 0] = 1  # RoBERTa numbers positions from its own padding id
    with torch.no_grad():
        expected = backbone(**encoder_inputs(plain, backbone)).last_hidden_state
        got = node_states(packed, backbone(**encoder_inputs(packed, backbone)).last_hidden_state)
    real = plain.attention_mask.bool()
    torch.testing.assert_close(got[real], expected[real], rtol=1e-4, atol=1e-5)


def test_rows_hold_every_node_once_and_keep_to_row_multiple():
    batch = pack(graphs(), row_tokens=100, row_multiple=3)
    rows, length = batch.encoder_shape
    assert length == 100 and rows % 3 == 0
    lengths = batch.attention_mask.sum(1)
    placed = torch.cat([batch.token_index[n, : lengths[n]] for n in range(batch.num_nodes)])
    assert placed.unique().numel() == placed.numel() == batch.num_real_tokens  # no token placed twice
    assert torch.equal(batch.row_input_ids.view(-1)[placed], batch.input_ids[batch.attention_mask.bool()])
    assert (batch.row_position_ids.view(-1)[batch.token_index[:, 0]] == 0).all()  # hubs restart the numbering


def test_pack_refuses_a_node_longer_than_a_row():
    with pytest.raises(ValueError, match="a node of 60 tokens does not fit rows of row_tokens=50"):
        pack(graphs(), row_tokens=50)


def test_rows_are_exactly_as_asked_unless_the_nodes_need_more():
    needed = pack(graphs(), row_tokens=128).encoder_shape[0]
    assert pack(graphs(), row_tokens=128, rows=needed + 3).encoder_shape == (needed + 3, 128)
    assert pack(graphs(), row_tokens=128, rows=needed - 1, row_multiple=4).encoder_shape == (round_up(needed, 4), 128)


def test_first_fit_decreasing_fills_bins_longest_item_first():
    assert first_fit_decreasing([3, 7, 5, 2, 4], capacity=10) == [[1, 0], [2, 4], [3]]
    assert sorted(i for b in first_fit_decreasing([9, 1, 1, 8, 2, 5], 10) for i in b) == list(range(6))


def test_fill_rows_keeps_graphs_whole_and_each_batch_within_its_rows():
    rng = np.random.default_rng(3)
    stream = [random_graph(rng, f"g{k}", list(rng.integers(8, 100, size=rng.integers(1, 6))), []) for k in range(30)]
    batches = list(fill_rows(stream, rows=4, row_tokens=128, lookahead=2))
    assert sorted(g.qid for b in batches for g in b) == sorted(g.qid for g in stream)
    for group in batches:
        assert pack(group, row_tokens=128, rows=4).encoder_shape == (4, 128)
    order = [int(g.qid[1:]) for b in batches for g in b]
    assert order != sorted(order)  # the lookahead did move a later graph into a batch with room
    assert all(abs(position - k) <= 2 * 4 for position, k in enumerate(order))  # but never far


def test_to_and_pin_memory_keep_a_packed_batch_packed():
    batch = pack(graphs(), row_tokens=128)
    moved = batch.to("cpu")
    assert isinstance(moved, PackedBatch) and torch.equal(moved.token_index, batch.token_index)


@pytest.mark.gpu
def test_a_packed_batch_under_bf16_autocast_on_cuda_matches_float32():
    model = make_model().cuda()
    batch = pack(graphs(), row_tokens=128, row_multiple=4).pin_memory().to("cuda", non_blocking=True)
    with torch.no_grad():
        full = model(batch)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            half = model(batch)
    assert half.loss.dtype == torch.float32 and torch.isfinite(half.loss)
    torch.testing.assert_close(half.node_logits, full.node_logits, atol=0.1, rtol=0.1)
    plain = model(collate(graphs()).to("cuda"))
    torch.testing.assert_close(full.loss, plain.loss, rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("rows", [1, 3, 16, 128])
def test_fill_rows_gallops_to_the_batches_one_graph_at_a_time_would_make(rows, monkeypatch):
    rng = np.random.default_rng(rows)
    stream = [
        random_graph(rng, f"g{k}", [int(n) for n in rng.integers(12, 128, size=rng.integers(1, 12))], [])
        for k in range(300)
    ]
    stream.insert(7, random_graph(rng, "huge", [128] * (rows + 2), []))  # too large alone: a batch of its own
    expected = [[g.qid for g in b] for b in fill_rows_one_at_a_time(stream, rows, 128, lookahead=4)]

    import xh.model.packing as packing

    calls = []
    counted = packing.first_fit_decreasing
    monkeypatch.setattr(packing, "first_fit_decreasing", lambda *a: calls.append(1) or counted(*a))
    got = [[g.qid for g in b] for b in fill_rows(stream, rows=rows, row_tokens=128, lookahead=4)]
    assert got == expected
    assert ["huge"] in got
    # a few packings a batch, not one a graph (the quadratic cost that starved a GPU of batches)
    graphs_per_batch = len(stream) / len(got)
    if graphs_per_batch > 20:
        assert len(calls) / len(got) < graphs_per_batch / 2
