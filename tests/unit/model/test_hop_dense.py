"""Dense hop attention (one [N, N] mask, one masked softmax or fused kernel) equals the per-edge form it replaced.

The reference below is the edge-list computation `xh.model.hop` used before: gathers per edge, a
softmax per destination node (`segment_softmax`) and a sum per destination (`segment_sum`). Both
variants are compared on a batch of several graphs with nodes that have no in-neighbours, for both
`isolated_nodes` rules: outputs, the weights per edge (in the order of `graph.src`/`graph.dst`) and
the gradients of the attention's parameters.
"""

from __future__ import annotations

import math

import pytest
import torch

from bench.reference import count_ops
from xh.model.hop import DotProductHopAttention, GATHopAttention, HopGraph, HopStep, HubExchange, TakeHubs
from xh.model.scatter import segment_softmax, segment_sum


def edge_list_paper(attention: DotProductHopAttention, hubs: torch.Tensor, graph: HopGraph):
    n = hubs.shape[0]
    projections = (attention.query, attention.key, attention.value)
    q, k, v = (p(hubs).view(n, attention.heads, attention.head_size) for p in projections)
    scores = (q[graph.dst] * k[graph.src]).sum(-1) / math.sqrt(attention.head_size)
    weights = segment_softmax(scores, graph.dst, n)
    return segment_sum(weights.unsqueeze(-1) * v[graph.src], graph.dst, n).reshape(n, -1), weights


def edge_list_gat(attention: GATHopAttention, hubs: torch.Tensor, graph: HopGraph):
    n = hubs.shape[0]
    per_head = hubs.view(n, attention.heads, attention.head_size)
    features = attention.fc(per_head)
    score_src = (features * attention.attn_src).sum(-1)
    score_dst = (features * attention.attn_dst).sum(-1)
    weights = segment_softmax(attention.leaky_relu(score_src[graph.src] + score_dst[graph.dst]), graph.dst, n)
    gathered = segment_sum(weights.unsqueeze(-1) * features[graph.src], graph.dst, n)
    return torch.relu(gathered + attention.res_fc(per_head)).reshape(n, -1), weights


# Three graphs of 4, 1 and 5 nodes (batch-global indices); nodes 3, 4 and 9 have no in-neighbours.
EDGES = torch.tensor([[0, 1, 2, 5, 6, 7, 8, 5], [1, 0, 0, 6, 7, 8, 5, 7]])
OFFSETS = torch.tensor([0, 4, 5, 10])


@pytest.mark.parametrize("isolated_nodes", ["self_loop", "zero"])
@pytest.mark.parametrize(
    "attention_class, reference", [(DotProductHopAttention, edge_list_paper), (GATHopAttention, edge_list_gat)]
)
def test_dense_hop_attention_equals_the_edge_list_form(attention_class, reference, isolated_nodes):
    torch.manual_seed(0)
    attention = attention_class(hidden_size=16, heads=4).eval()
    hubs = torch.randn(10, 16, requires_grad=True)
    graph = HopGraph.build(EDGES, num_nodes=10, isolated_nodes=isolated_nodes, graph_offsets=OFFSETS)
    assert graph.allowed.shape == (10, 10)  # one mask for the batch: no edge crosses graphs

    expected, expected_weights = reference(attention, hubs, graph)
    expected_grads = torch.autograd.grad(expected.square().sum(), [hubs, *attention.parameters()])
    out, weights = attention(hubs, graph)
    grads = torch.autograd.grad(out.square().sum(), [hubs, *attention.parameters()])

    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(weights, expected_weights)
    for grad, expected_grad in zip(grads, expected_grads):
        torch.testing.assert_close(grad, expected_grad)
    lonely = [3, 4, 9]
    if isolated_nodes == "zero" and attention_class is DotProductHopAttention:
        assert torch.equal(out[lonely], torch.zeros(3, 16))
    if isolated_nodes == "self_loop":
        assert (graph.src[-3:] == torch.tensor(lonely)).all() and (weights[-3:] == 1).all()


def test_one_block_for_all_nodes_gives_the_same_as_one_block_per_graph():
    torch.manual_seed(1)
    attention = DotProductHopAttention(hidden_size=16, heads=4).eval()
    hubs = torch.randn(10, 16)
    per_graph = attention(hubs, HopGraph.build(EDGES, 10, graph_offsets=OFFSETS))
    one_block = attention(hubs, HopGraph.build(EDGES, 10))
    for a, b in zip(per_graph, one_block):
        torch.testing.assert_close(a, b)


def test_no_hub_attends_across_graphs():
    torch.manual_seed(2)
    step = HopStep(hidden_size=16, heads=4).eval()
    hidden = torch.randn(10, 3, 16)
    graph = HopGraph.build(EDGES, 10, graph_offsets=OFFSETS)
    changed = hidden.clone()
    changed[5:] += 1.0  # the third graph only
    out, out_changed = step(hidden, graph), step(changed, HopGraph.build(EDGES, 10, graph_offsets=OFFSETS))
    torch.testing.assert_close(out[:5], out_changed[:5])
    assert not torch.allclose(out[5:, 0], out_changed[5:, 0])


def test_hubs_at_given_positions_are_the_only_tokens_changed():
    torch.manual_seed(3)
    step = HopStep(hidden_size=16, heads=4).eval()
    rows = torch.randn(2, 6, 16)  # nodes 0, 1 in row 0 (at 0 and 4), node 2 in row 1 (at 6 + 2)
    hubs = torch.tensor([0, 4, 8])
    edges = torch.tensor([[0, 1, 2], [1, 2, 0]])
    out = step(rows, HopGraph.build(edges, 3, hubs=hubs))
    expected = step(rows.view(12, 1, 16)[hubs], HopGraph.build(edges, 3))  # the hubs as rows of their own
    torch.testing.assert_close(out.view(12, 16)[hubs], expected[:, 0])
    untouched = torch.ones(12, dtype=torch.bool).index_fill_(0, hubs, False)
    assert torch.equal(out.view(12, 16)[untouched], rows.view(12, 16)[untouched])


def test_dense_hop_attention_runs_fewer_ops_than_the_edge_list_form():
    torch.manual_seed(4)
    attention = DotProductHopAttention(hidden_size=16, heads=4).train()
    hubs = torch.randn(10, 16, requires_grad=True)
    graph = HopGraph.build(EDGES, 10, graph_offsets=OFFSETS)
    graph.keep_attention = False  # as in training
    dense = count_ops(lambda: attention(hubs, graph)[0].sum().backward())
    edge_list = count_ops(lambda: edge_list_paper(attention, hubs, graph)[0].sum().backward())
    assert dense < 0.5 * edge_list  # forward and backward: 17 against 73 when written


@pytest.mark.parametrize("isolated_nodes", ["self_loop", "zero"])
def test_training_attention_kernel_equals_the_explicit_weights_of_eval(isolated_nodes):
    """Training runs `scaled_dot_product_attention` and keeps no weights; eval computes them explicitly:
    the same outputs and gradients (dropout off)."""
    torch.manual_seed(5)
    attention = DotProductHopAttention(hidden_size=16, heads=4, dropout=0.0).train()
    hubs = torch.randn(10, 16, requires_grad=True)
    results = []
    for keep in (True, False):
        graph = HopGraph.build(EDGES, 10, isolated_nodes=isolated_nodes)
        graph.keep_attention = keep
        out, weights = attention(hubs, graph)
        assert (weights is None) != keep
        results.append((out, torch.autograd.grad(out.square().sum(), [hubs, *attention.parameters()])))
    (explicit, explicit_grads), (fused, fused_grads) = results
    torch.testing.assert_close(fused, explicit)
    for grad, expected in zip(fused_grads, explicit_grads):
        torch.testing.assert_close(grad, expected)
    if isolated_nodes == "zero":
        assert torch.equal(fused[[3, 4, 9]], torch.zeros(3, 16))


def paper_hop_by_loops(step: HopStep, hubs: torch.Tensor, edges: list[tuple[int, int]], isolated_nodes: str):
    """Eq. 7-8 written plainly for one graph's hubs [n, H]: for each node and head, a softmax over the node's
    in-neighbours (its own self-loop when it has none: its own value, or ĥ = 0 under `zero`), then the fusion."""
    attention = step.attention
    n, d = hubs.shape[0], attention.head_size
    q, k, v = (p(hubs).view(n, attention.heads, d) for p in (attention.query, attention.key, attention.value))
    gathered = []
    for node in range(n):
        sources = sorted({s for s, t in edges if t == node})
        if not sources and isolated_nodes == "zero":
            gathered.append(torch.zeros(attention.heads * d))
            continue
        sources = sources or [node]
        heads = []
        for h in range(attention.heads):
            scores = torch.stack([q[node, h] @ k[s, h] for s in sources]) / math.sqrt(d)
            heads.append(sum(w * v[s, h] for w, s in zip(scores.softmax(0), sources)))
        gathered.append(torch.cat(heads))
    return step.fusion(torch.cat([hubs, torch.stack(gathered)], -1))


# Three graphs packed in one batch (local edges): an explicit self-loop with other in-edges (node 0 of the
# first), a node whose only in-edge is its self-loop (node 2 of the first), nodes without in-edges, and a
# one-node graph.
GRAPHS = [
    (4, [(0, 0), (1, 0), (2, 2), (0, 1), (3, 1)]),
    (1, []),
    (5, [(0, 1), (1, 2), (2, 0), (4, 2)]),
]


@pytest.mark.parametrize("isolated_nodes", ["self_loop", "zero"])
@pytest.mark.parametrize("training", [True, False])
def test_hop_step_over_packed_graphs_equals_eq_7_per_graph_written_with_loops(isolated_nodes, training):
    """The hop step on graphs packed several per batch, hubs scattered over rows with padding tokens and
    a row of padding only, equals Eq. 7-8 computed graph by graph: no attention crosses graphs, padding
    tokens keep their states, a self-loop given as an edge is an ordinary edge."""
    torch.manual_seed(6)
    step = HopStep(hidden_size=16, heads=4, dropout=0.0, fusion_init="random").train(training)
    sizes = [n for n, _ in GRAPHS]
    offsets = [sum(sizes[:g]) for g in range(len(GRAPHS))]
    edges = torch.tensor([(s + o, t + o) for (_, local), o in zip(GRAPHS, offsets) for s, t in local]).T
    # rows of 8 tokens: 4 rows, the last all padding; each node's hub somewhere in a row, in no particular order
    hubs = torch.tensor([9, 0, 13, 5, 2, 16, 11, 7, 20, 18])
    rows = torch.randn(4, 8, 16)
    graph = HopGraph.build(edges, num_nodes=10, isolated_nodes=isolated_nodes, hubs=hubs)
    graph.keep_attention = not training
    out = step(rows, graph).view(32, 16)
    flat = rows.view(32, 16)
    for (n, local), offset in zip(GRAPHS, offsets):
        mine = hubs[offset : offset + n]
        torch.testing.assert_close(out[mine], paper_hop_by_loops(step, flat[mine], local, isolated_nodes))
    untouched = torch.ones(32, dtype=torch.bool).index_fill_(0, hubs, False)
    assert torch.equal(out[untouched], flat[untouched])  # padding and other tokens, the padding row included


def hop_step_by_autograd(step: HopStep, rows: torch.Tensor, graph: HopGraph) -> torch.Tensor:
    """The hop step as written before its operators were cut (#39): autograd's gather and scatter of the
    hubs, the attention's own forward, the fusion Linear on the concatenation [h ; ĥ]."""
    tokens = rows.reshape(-1, rows.shape[-1])
    hub = tokens.index_select(0, graph.hubs)
    gathered, weights = step.attention(hub, graph)
    if weights is not None:
        graph.attention.append(weights.detach())
    return tokens.index_copy(0, graph.hubs, step.fusion(torch.cat([hub, gathered], -1))).view_as(rows)


@pytest.mark.parametrize("variant", ["paper", "gat"])
@pytest.mark.parametrize("training", [True, False])
def test_the_hop_step_gives_the_outputs_and_gradients_of_autograd_s_own_gather_scatter_and_fusion(variant, training):
    """`TakeHubs`/`PutHubs` (one gradient operator each) and the fusion's hub half in the q/k/v product give
    what autograd's index_select / index_copy and Linear([h ; ĥ]) give: outputs and the gradients of the
    tokens (which also reach the loss another way here) and of every parameter, up to summation order."""
    torch.manual_seed(7)
    step = HopStep(hidden_size=16, heads=4, variant=variant, dropout=0.0, fusion_init="random").train(training)
    edges = torch.tensor([(s, t) for s, t in [(0, 1), (1, 2), (2, 0), (4, 2), (5, 6), (6, 5), (3, 3)]]).T
    hubs = torch.tensor([9, 0, 13, 5, 2, 16, 11, 7, 20, 18])
    rows, target = torch.randn(4, 8, 16, requires_grad=True), torch.randn(4, 8, 16)
    results = []
    for run in (step, lambda hidden, graph: hop_step_by_autograd(step, hidden, graph)):
        graph = HopGraph.build(edges, num_nodes=10, hubs=hubs)
        graph.keep_attention = not training
        hidden = rows * 2.0  # a non-leaf, as a layer's output; its second use below reaches the loss too
        out = run(hidden, graph)
        loss = (out * target).sum() + hidden[:2].square().sum()
        results.append((out, graph.attention, torch.autograd.grad(loss, [rows, *step.parameters()])))
    (out, weights, grads), (expected, expected_weights, expected_grads) = results
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(weights, expected_weights)
    for grad, expected_grad in zip(grads, expected_grads):
        torch.testing.assert_close(grad, expected_grad)


def test_the_hop_step_runs_fewer_operators_than_autograd_s_own_gather_scatter_and_fusion():
    torch.manual_seed(8)
    step = HopStep(hidden_size=16, heads=4, dropout=0.0).train()
    rows = torch.randn(4, 8, 16, requires_grad=True)
    graph = HopGraph.build(torch.tensor([[0, 1, 2], [1, 2, 0]]), num_nodes=10, hubs=torch.arange(0, 30, 3))
    graph.keep_attention = False
    parameters = [rows, *step.parameters()]
    ops = count_ops(lambda: torch.autograd.grad(step(rows * 1.0, graph).sum(), parameters))
    plain = count_ops(lambda: torch.autograd.grad(hop_step_by_autograd(step, rows * 1.0, graph).sum(), parameters))
    assert ops <= plain - 4  # forward and backward, with the stacking of the q/k/v weights: 23 against 27 when written


def test_taken_hubs_that_are_not_put_back_give_the_tokens_their_gradient_alone():
    tokens = torch.randn(6, 3, requires_grad=True)
    hubs = torch.tensor([4, 1])
    (grad,) = torch.autograd.grad(TakeHubs.apply(tokens * 1.0, hubs, HubExchange()).sum(), [tokens])
    assert torch.equal(grad, torch.zeros(6, 3).index_fill_(0, hubs, 1.0))
