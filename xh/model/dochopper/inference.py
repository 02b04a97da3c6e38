"""DocHopper's predictions: the best combination per question, reranked by the reader (`predict`), and
the project's graph rows in, XH's prediction keys out (`predict_rows`, for `xh.inference.predict_graphs`)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from xh.graph.encoded import ANSWER_TYPES, QUESTION_TYPES
from xh.model.decode import best_span
from xh.model.dochopper.batch import DocHopperExample
from xh.model.dochopper.config import DocHopperConfig
from xh.model.dochopper.reader import ReaderOutput, combinations, context_piece, read


@torch.no_grad()
def predict(
    model, examples: Sequence[DocHopperExample], corpus: dict[str, torch.Tensor] | None = None, batch_size: int = 8
) -> list[dict]:
    """One dict per example, in order: {"qid", "answer", "answer_type", "supporting_facts": [[title,
    sentence]], "evidence": [[doc_id, sentence]], "score"}. With `corpus` (doc_id -> `encode_corpus`
    output) no paragraph is encoded here."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    predictions = []
    try:
        for first in range(0, len(examples), batch_size):
            chunk = examples[first : first + batch_size]
            out = model.retrieve(model.collate(chunk, corpus).to(device))
            candidates = [combinations(out.evidence_scores, b, model.cfg.top_k) for b in range(len(chunk))]
            if not model.cfg.rerank:
                candidates = [c[:1] for c in candidates]  # "direct": the best Eq. 8 combination
            reader_out = read(model, [(e, combo) for e, combos in zip(chunk, candidates) for _, combo in combos])
            row = 0
            for example, combos in zip(chunk, candidates):
                scores = torch.tensor([score for score, _ in combos])
                if model.cfg.rerank:
                    scores = scores + reader_out.pair_logits[row : row + len(combos)].cpu()
                best = int(scores.argmax())
                predictions.append(
                    prediction(model.cfg, example, combos[best][1], float(scores[best]), reader_out, row + best)
                )
                row += len(combos)
    finally:
        model.train(was_training)
    return predictions


def prediction(
    cfg: DocHopperConfig, example: DocHopperExample, combo: tuple, score: float, read: ReaderOutput, row: int
) -> dict:
    """The prediction of one question from its best combination and the reader's output row."""
    answer_type = ANSWER_TYPES[int(read.answer_type_logits[row].argmax())]
    if answer_type != "span" and example.question_type == QUESTION_TYPES.index("bridge"):
        answer_type = "span"  # a bridge question's answer is never yes / no (as XH's decoding)
    piece = len(combo) - 1  # the evidence the answer comes from: the last (§4.2) unless the span says otherwise
    if answer_type == "span":
        mask = read.context_mask[row].cpu()
        span = best_span(read.start_logits[row].cpu(), read.end_logits[row].cpu(), mask, cfg.max_answer_tokens)
        offsets = read.offsets[row]
        answer = "" if span is None else read.contexts[row][int(offsets[span[0], 0]) : int(offsets[span[1], 1])]
        if span is not None:
            piece = context_piece(
                [(example.titles[p], example.sentences[p][j]) for p, j in combo], int(offsets[span[0], 0])
            )
    else:
        answer = answer_type
    node = combo[piece][0]
    return {
        "qid": example.qid,
        "answer": answer,
        "answer_doc_id": example.doc_ids[node],
        "answer_title": example.titles[node],
        "answer_node": node,
        "node_score": score,
        "answer_type": answer_type,
        "supporting_facts": [[example.titles[p], j] for p, j in combo],
        "evidence": [[example.doc_ids[p], j] for p, j in combo],
        "score": score,
    }


def predict_rows(model, rows: Sequence[dict], batch_size: int = 8) -> list[dict]:
    """`graphs` rows -> predictions with XH's keys (`xh.model.decode`), in order. Paragraph embeddings
    come from `corpus_cache`; the paragraphs it does not hold are encoded (once) and added to it."""
    was_training = model.training
    model.eval()  # from here to the end: the cache must outlive the encoders' train/eval switches
    try:
        examples = model.prepare(rows)
        paragraphs = {
            (d, title, tuple(sentences)): None
            for e in examples
            for d, title, sentences in zip(e.doc_ids, e.titles, e.sentences)
        }
        stored = model.corpus_cache.lookup(model, [(title, list(sentences)) for _, title, sentences in paragraphs])
        corpus = {d: embedding for (d, _, _), embedding in zip(paragraphs, stored)}
        model.corpus_cache.flush()
        predictions = predict(model, examples, corpus, batch_size)
    finally:
        model.train(was_training)  # back to training empties the cache: the weights change next
    return [{k: p[k] for k in PREDICTION_KEYS} for p in predictions]


PREDICTION_KEYS = (
    "qid",
    "answer",
    "answer_doc_id",
    "answer_title",
    "answer_node",
    "node_score",
    "answer_type",
    "supporting_facts",
)
