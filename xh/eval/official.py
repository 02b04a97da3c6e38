"""The official metrics of a model's predictions on graph rows, and the converters to the official files.

    metrics = official_metrics(rows, predictions, "hotpot", missed=quarantined_ids)   # {"f1": ..., "em": ...}
    metrics = official_metrics(rows, predictions, "fever")    # the FEVER scorer, with its slices, flat

Training's dev evaluation, promotion and the demo all score predictions through `official_metrics`. Its
converters give the official scripts' two files: `hotpot_gold` / `hotpot_prediction_file` (HotpotQA's
`hotpot_evaluate_v1.py`) and `fever_gold` / `fever_prediction_file` (FEVER's scorer).
"""

from __future__ import annotations

from collections.abc import Sequence


def official_metrics(
    rows: Sequence[dict],
    predictions: Sequence[dict],
    task: str,
    missed: Sequence[str] = (),
    files: dict | None = None,
) -> dict[str, float]:
    """HotpotQA's official metrics (FEVER: its scorer, with the slices, as flat keys) of `predictions`
    aligned with the graph `rows`. `missed`: ids of evaluation questions that got no graph, each scored as
    a miss (score 0), as the official scripts score a question without a prediction. `files`, when a dict,
    receives the official "gold" and "predictions" files. No rows and no misses: no metrics (FEVER: zeros)."""
    if task == "fever":
        from xh.eval.fever import evaluate_fever, flat_metrics, with_misses

        gold, predicted = fever_gold(rows), fever_prediction_file(predictions)
        if files is not None:
            files.update(gold=gold, predictions=predicted)
        if not rows:
            return {"fever_score": 0.0, "label_accuracy": 0.0}
        return with_misses(flat_metrics(evaluate_fever(gold, predicted, slices=True)), len(rows), len(missed))
    from xh.eval.hotpot import evaluate_hotpot

    gold, predicted = hotpot_gold(rows, missed), hotpot_prediction_file(predictions)
    if files is not None:
        files.update(gold=gold, predictions=predicted)
    return {k: float(v) for k, v in evaluate_hotpot(gold, predicted).items()} if gold else {}


def hotpot_gold(rows: Sequence[dict], missed: Sequence[str] = ()) -> list[dict]:
    """Graph rows as the official evaluation script's gold records. `missed`: ids of questions that got
    no graph (quarantined); they join the gold with no prediction, so they score 0 on every metric, as
    the official script scores a question without a prediction (their other gold fields do not matter)."""
    gold = [
        {
            "_id": r["qid"],
            "answer": r["answer"],
            "type": r.get("question_type"),
            "supporting_facts": [[sf["title"], sf["sent"]] for sf in (r.get("supporting_facts") or [])],
        }
        for r in rows
    ]
    known = {g["_id"] for g in gold}
    return gold + [
        {"_id": qid, "answer": "", "type": "quarantined", "supporting_facts": []} for qid in missed if qid not in known
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
