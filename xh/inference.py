"""Graph rows in, predictions out: the one inference path that training's dev evaluation, the MLflow
pyfunc and batch scoring all share.

    model, tokenizer = load_model(folder)                  # what XHModel.save_pretrained wrote
    predictions = predict_graphs(model, tokenizer, rows)  # rows: `graphs` table rows as dicts

HotpotQA predictions carry `answer`, `answer_doc_id`, `supporting_facts` ([title, sentence]) and
`node_score`; FEVER predictions `label`, `label_probs` and `evidence` ([FEVER page id, line]).
`fever_gold(rows)` and `fever_prediction_file(predictions)` are the official FEVER scorer's two files
(`xh.eval.fever.evaluate_fever`), as `hotpot_gold` / `hotpot_prediction_file` are HotpotQA's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from contextlib import nullcontext

import torch

from xh.graph.encode import encode_graph
from xh.model import GraphBatch, XHModel, collate, decode, load_tokenizer


def load_model(directory: str, device: str | torch.device = "cpu") -> tuple[XHModel, object]:
    """(model, tokenizer) of a saved folder; the model an XHModel or a DocHopper (`xh.model.variants`)."""
    from xh.model.variants import load_saved

    model = load_saved(directory).to(device)
    model.eval()
    return model, load_tokenizer(directory)


def autocast(device: torch.device, bf16: bool):
    """bf16 autocast on GPUs; CPU stays fp32 (faster and exact there)."""
    if bf16 and device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return nullcontext()


def predict_graphs(
    model: XHModel,
    tokenizer,
    rows: Iterable[dict],
    *,
    batch_graphs: int = 8,
    bf16: bool = True,
    collect_attention: list | None = None,
    make_batch: Callable[[list], GraphBatch] = collate,
) -> list[dict]:
    """Predictions for graph rows, in order. `collect_attention`, when a list, receives
    (EncodedGraph list, GraphBatch, XHOutput) per batch for the hop-attention analysis. `make_batch`:
    how encoded graphs become a batch (`collate`, or packed rows as `xh.train.batching` trains with)."""
    from xh.model.dochopper import DocHopper

    if isinstance(model, DocHopper):  # its own batches; paragraph embeddings from its corpus cache
        return model.predict_rows(list(rows), batch_size=batch_graphs)
    device = next(model.parameters()).device
    cfg = model.cfg
    predictions: list[dict] = []
    batch_rows: list[dict] = []

    def flush() -> None:
        graphs = [encode_graph(row, tokenizer, cfg.max_node_tokens) for row in batch_rows]
        batch = make_batch(graphs).to(device)
        with torch.inference_mode(), autocast(device, bf16):
            output = model(batch)
        predictions.extend(decode(graphs, batch, output, cfg.max_answer_tokens))
        if collect_attention is not None:
            collect_attention.append((graphs, batch, output))
        batch_rows.clear()

    model.eval()
    for row in rows:
        batch_rows.append(row)
        if len(batch_rows) == batch_graphs:
            flush()
    if batch_rows:
        flush()
    return predictions


def hotpot_gold(rows: Sequence[dict]) -> list[dict]:
    """Graph rows as the official evaluation script's gold records."""
    return [
        {
            "_id": r["qid"],
            "answer": r["answer"],
            "type": r.get("question_type"),
            "supporting_facts": [[sf["title"], sf["sent"]] for sf in (r.get("supporting_facts") or [])],
        }
        for r in rows
    ]


def hotpot_prediction_file(predictions: Sequence[dict]) -> dict:
    """Predictions in the official script's format: {"answer": {qid: text}, "sp": {qid: [[title, sent]]}}."""
    return {
        "answer": {p["qid"]: p["answer"] for p in predictions},
        "sp": {p["qid"]: [list(sf) for sf in p["supporting_facts"]] for p in predictions},
    }


def fever_gold(rows: Sequence[dict]) -> list[dict]:
    """FEVER graph rows as the official scorer's gold lines: `evidence` groups of
    [annotation_id, evidence_id, page, line] (NOT ENOUGH INFO: no groups)."""
    return [
        {
            "id": r["qid"],
            "label": r["claim_label"],
            "evidence": [[[None, None, s["page"], s["line"]] for s in group] for group in (r.get("evidence") or [])],
        }
        for r in rows
    ]


def fever_prediction_file(predictions: Sequence[dict]) -> list[dict]:
    """FEVER predictions in the official format, one per claim in the same order:
    {"id", "predicted_label", "predicted_evidence": [[page_id, line], ...]} (at most 5, by importance)."""
    return [
        {"id": p["qid"], "predicted_label": p["label"], "predicted_evidence": [list(e) for e in p["evidence"]]}
        for p in predictions
    ]
