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
- Supporting facts: in the two most relevant nodes (a HotpotQA answer rests on two paragraphs), every
  sentence whose probability passes 0.5; a node where none passes contributes its best sentence.

FEVER, one dict per graph:
    {"qid", "label", "label_probs": {label: p}, "evidence": [[page_id, line], ...]}
- label = argmax of p(y) = Σ importance × p(y|node); evidence = nodes by importance, at most 5 (the
  FEVER scorer reads no more), nodes without a page line skipped. Pages are named by their FEVER page
  id (`xh.wiki.titles.fever_page_id` of the node's title), as FEVER's gold evidence names them.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from xh.graph.encoded import ANSWER_TYPES, CLAIM_LABELS, QUESTION_TYPES, EncodedGraph
from xh.model.batch import GraphBatch
from xh.model.xh import XHOutput
from xh.wiki.titles import fever_page_id

SUPPORTING_NODES = 2
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
    length = start_logits.shape[0]
    positions = torch.arange(length)
    gap = positions.unsqueeze(0) - positions.unsqueeze(1)  # gap[i, j] = j - i
    valid = (gap >= 0) & (gap < max_answer_tokens) & allowed.unsqueeze(1) & allowed.unsqueeze(0)
    if not valid.any():
        return None
    scores = (start_logits.unsqueeze(1) + end_logits.unsqueeze(0)).masked_fill(~valid, float("-inf"))
    flat = int(scores.argmax())
    return flat // length, flat % length


def _hotpot(graph: EncodedGraph, rows: range, batch: GraphBatch, out: dict, g: int, max_answer_tokens: int) -> dict:
    node_scores = torch.sigmoid(out["node_logits"][rows.start : rows.stop])
    ranked = torch.argsort(node_scores, descending=True).tolist()
    node = ranked[0]
    row, length = rows.start + node, len(graph.input_ids[node])

    answer_type = ANSWER_TYPES[int(out["answer_type_logits"][g].argmax())]
    if answer_type != "span" and graph.question_type == QUESTION_TYPES.index("bridge"):
        answer_type = "span"
    if answer_type == "span":
        span = best_span(
            out["start_logits"][row, :length],
            out["end_logits"][row, :length],
            batch.paragraph_mask[row, :length],
            max_answer_tokens,
        )
        offsets = graph.offsets[node]
        answer = "" if span is None else graph.node_paragraphs[node][offsets[span[0]][0] : offsets[span[1]][1]]
    else:
        answer = answer_type

    facts = []
    for local in ranked[:SUPPORTING_NODES]:
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


def decode(graphs: Sequence[EncodedGraph], batch: GraphBatch, output: XHOutput, max_answer_tokens: int) -> list[dict]:
    """One prediction dict per graph, in batch order (the graphs `collate` received, same order)."""
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
            predictions.append(_hotpot(graph, rows, batch, out, g, max_answer_tokens))
        else:
            predictions.append(_fever(graph, rows, out, g))
    return predictions
