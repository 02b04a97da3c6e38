"""Turn `XHOutput` back into answers: text through the tokenizer's offsets, nodes, supporting facts.

    out = model(batch)
    predictions = decode(graphs, batch, out, max_answer_tokens=cfg.max_answer_tokens)

HotpotQA, one dict per graph:
    {"qid", "answer", "answer_doc_id", "answer_title", "answer_node", "node_score", "answer_type",
     "supporting_facts": [[title, sentence_index], ...]}
- The answer node is the node of highest relevance (`node_score` = its sigmoid); the span is the
  (start, end) pair of paragraph tokens in it, start <= end < start + max_answer_tokens, of highest
  start + end logit. Its text is `node_paragraphs[node][offsets[start][0]:offsets[end][1]]`: a slice of
  the original paragraph, never word pieces joined back together.
- When the answer-type head says yes or no, the answer is "yes" / "no" (comparison questions),
  unless the graph is known to be a bridge question (question_type 0), which always takes the span.
- Supporting facts (`sp_mode`, `ModelConfig.sp_mode`): every sentence whose probability passes 0.5 in
  the chosen nodes, a chosen node where none passes contributing its best sentence. The nodes:
  `joint` (default): the two most relevant nodes (a HotpotQA answer rests on two paragraphs);
  `chain` (the paper's): the answer node and its most relevant parent in the graph (a node with an
  edge into it: the paragraph that leads to the answer), else the next most relevant node.
- No node prediction (`by_span`, what `node_loss_weight=0` trains): the node head is untrained, so the
  answer node is the node holding the best span over all nodes' paragraph tokens, nodes are ranked by
  their best span score, and `node_score` is the softmax of those scores over the graph.

FEVER, one dict per graph:
    {"qid", "label", "label_probs": {label: p}, "evidence": [[page_id, line], ...]}
- label = argmax of p(y) = Σ importance × p(y|node); evidence = nodes by importance, at most 5 (the
  FEVER scorer reads no more), nodes without a page line skipped. Pages are named by their FEVER page
  id (`xh.wiki.titles.fever_page_id` of the node's title), as FEVER's gold evidence names them.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from xh.graph.encoded import ANSWER_TYPES, CLAIM_LABELS, QUESTION_TYPES, EncodedGraph
from xh.model.batch import GraphBatch
from xh.model.xh import XHOutput
from xh.wiki.titles import fever_page_id

SUPPORTING_NODES = 2
SP_MODES = ("joint", "chain")
SENTENCE_THRESHOLD = 0.5
MAX_EVIDENCE = 5
_OUTPUTS = (
    "node_logits",
    "start_logits",
    "end_logits",
    "answer_type_logits",
    "sentence_logits",
    "sentence_mask",
    "importance",
    "claim_log_probs",
)


def best_span(
    start_logits: torch.Tensor, end_logits: torch.Tensor, allowed: torch.Tensor, max_answer_tokens: int
) -> tuple[int, int] | None:
    """(start, end) of highest start+end logit among allowed tokens, end - start < max_answer_tokens."""
    found = scored_span(start_logits, end_logits, allowed, max_answer_tokens)
    return None if found is None else found[:2]


def scored_span(
    start_logits: torch.Tensor, end_logits: torch.Tensor, allowed: torch.Tensor, max_answer_tokens: int
) -> tuple[int, int, float] | None:
    """`best_span` with its score (start + end logit)."""
    length = start_logits.shape[0]
    positions = torch.arange(length)
    gap = positions.unsqueeze(0) - positions.unsqueeze(1)  # gap[i, j] = j - i
    valid = (gap >= 0) & (gap < max_answer_tokens) & allowed.unsqueeze(1) & allowed.unsqueeze(0)
    if not valid.any():
        return None
    scores = (start_logits.unsqueeze(1) + end_logits.unsqueeze(0)).masked_fill(~valid, float("-inf"))
    flat = int(scores.argmax())
    return flat // length, flat % length, float(scores.view(-1)[flat])


def _node_spans(graph: EncodedGraph, rows: range, batch: GraphBatch, out: dict, max_answer_tokens: int) -> list:
    """Per node, its best span (start, end, score) or None."""
    spans = []
    for node in range(graph.num_nodes):
        row, length = rows.start + node, len(graph.input_ids[node])
        spans.append(
            scored_span(
                out["start_logits"][row, :length],
                out["end_logits"][row, :length],
                batch.paragraph_mask[row, :length],
                max_answer_tokens,
            )
        )
    return spans


def supporting_nodes(graph: EncodedGraph, ranked: list[int], sp_mode: str) -> list[int]:
    """The nodes whose sentences may be supporting facts (`ranked`: nodes by relevance, answer node first)."""
    if sp_mode == "joint":
        return ranked[:SUPPORTING_NODES]
    if sp_mode != "chain":
        raise ValueError(f"unknown sp_mode {sp_mode!r}; one of {', '.join(SP_MODES)}")
    answer = ranked[0]
    parents = {int(src) for src, dst in np.asarray(graph.edges).reshape(-1, 2) if int(dst) == answer and src != dst}
    parent = next((n for n in ranked[1:] if n in parents), None)
    if parent is None:
        parent = ranked[1] if len(ranked) > 1 else None
    return [answer] if parent is None else [answer, parent]


def _hotpot(
    graph: EncodedGraph,
    rows: range,
    batch: GraphBatch,
    out: dict,
    g: int,
    max_answer_tokens: int,
    sp_mode: str = "joint",
    by_span: bool = False,
) -> dict:
    spans = None
    if by_span:
        spans = _node_spans(graph, rows, batch, out, max_answer_tokens)
        scores = torch.tensor([float("-inf") if s is None else s[2] for s in spans])
        node_scores = torch.softmax(scores, 0) if torch.isfinite(scores).any() else torch.full_like(scores, 0.0)
    else:
        node_scores = torch.sigmoid(out["node_logits"][rows.start : rows.stop])
    ranked = torch.argsort(node_scores, descending=True, stable=True).tolist()
    node = ranked[0]
    row, length = rows.start + node, len(graph.input_ids[node])

    answer_type = ANSWER_TYPES[int(out["answer_type_logits"][g].argmax())]
    if answer_type != "span" and graph.question_type == QUESTION_TYPES.index("bridge"):
        answer_type = "span"
    if answer_type == "span":
        span = (
            spans[node]
            if spans is not None
            else best_span(
                out["start_logits"][row, :length],
                out["end_logits"][row, :length],
                batch.paragraph_mask[row, :length],
                max_answer_tokens,
            )
        )
        offsets = graph.offsets[node]
        answer = "" if span is None else graph.node_paragraphs[node][offsets[span[0]][0] : offsets[span[1]][1]]
    else:
        answer = answer_type

    facts = []
    for local in supporting_nodes(graph, ranked, sp_mode):
        count = int(graph.num_sentences[local])
        present = out["sentence_mask"][rows.start + local, :count]
        if not present.any():
            continue
        probs = torch.sigmoid(out["sentence_logits"][rows.start + local, :count]).masked_fill(~present, 0.0)
        chosen = torch.nonzero(probs > SENTENCE_THRESHOLD).flatten().tolist() or [int(probs.argmax())]
        facts.extend([graph.node_titles[local], s] for s in chosen)
    return {
        "qid": graph.qid,
        "answer": answer,
        "answer_doc_id": graph.node_doc_ids[node],
        "answer_title": graph.node_titles[node],
        "answer_node": node,
        "node_score": float(node_scores[node]),
        "answer_type": answer_type,
        "supporting_facts": facts,
    }


def _fever(graph: EncodedGraph, rows: range, out: dict, g: int) -> dict:
    probs = out["claim_log_probs"][g].exp()
    importance = out["importance"][rows.start : rows.stop]
    evidence = [
        [fever_page_id(graph.node_titles[node]), int(graph.node_lines[node])]
        for node in torch.argsort(importance, descending=True).tolist()
        if graph.node_lines[node] >= 0
    ]
    return {
        "qid": graph.qid,
        "label": CLAIM_LABELS[int(probs.argmax())],
        "label_probs": {label: float(p) for label, p in zip(CLAIM_LABELS, probs)},
        "evidence": evidence[:MAX_EVIDENCE],
    }


def decode(
    graphs: Sequence[EncodedGraph],
    batch: GraphBatch,
    output: XHOutput,
    max_answer_tokens: int,
    sp_mode: str = "joint",
    by_span: bool = False,
) -> list[dict]:
    """One prediction dict per graph, in batch order (the graphs `collate` received, same order).
    `sp_mode` and `by_span`: HotpotQA's supporting-fact nodes and no-node decoding (module docstring)."""
    if len(graphs) != batch.num_graphs:
        raise ValueError(f"decode got {len(graphs)} graphs for a batch of {batch.num_graphs}")
    out: dict[str, torch.Tensor] = {}
    for name in _OUTPUTS:
        value = getattr(output, name)
        if value is not None:
            out[name] = value.detach().cpu() if value.dtype == torch.bool else value.detach().float().cpu()
    batch = batch.to("cpu")
    bounds = batch.graph_offsets.tolist()
    predictions = []
    for g, graph in enumerate(graphs):
        rows = range(bounds[g], bounds[g + 1])
        if graph.num_nodes != len(rows):
            raise ValueError(f"graph {graph.qid!r} has {graph.num_nodes} nodes but batch slot {g} has {len(rows)}")
        needed = "start_logits" if graph.task == "hotpot" else "claim_log_probs"
        if needed not in out:
            raise ValueError(f"graph {graph.qid!r} is a {graph.task} graph but the model has no {graph.task} heads")
        if graph.task == "hotpot":
            predictions.append(_hotpot(graph, rows, batch, out, g, max_answer_tokens, sp_mode, by_span))
        else:
            predictions.append(_fever(graph, rows, out, g))
    return predictions
