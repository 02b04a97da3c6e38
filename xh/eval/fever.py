"""FEVER's official scorer (`fever.scorer.fever_score` of the fever-scorer package, max_evidence=5), rule for rule.

    gold = [{"id": 137334, "label": "SUPPORTS", "evidence": [[[ann_id, ev_id, "Soul_Food_-LRB-film-RRB-", 0]], ...]}]
    predictions = [{"id": 137334, "predicted_label": "SUPPORTS", "predicted_evidence": [["Soul_Food_-LRB-film-RRB-", 0]]}]
    evaluate_fever(gold, predictions)                # {"fever_score", "label_accuracy", "evidence_precision", ...}
    evaluate_fever(gold, predictions, slices=True)   # ... plus "slices": {"single_evidence": {...}, ...}
    evaluate_fever_files("paper_dev.jsonl", "predictions.jsonl")   # JSON lines, local or s3://
    evaluate_fever_files("claims.jsonl", "predictions/run_date=D/model=xh-fever/version=3/")  # `xh score` output
    flat_metrics(evaluate_fever(gold, predictions, slices=True))    # {"fever_score", "nei_label_accuracy", ...}

Gold and predictions are paired by position, as the official scorer pairs them; a prediction that
carries an "id" (or its own "label" / "evidence") must agree with its gold line, and a label outside
SUPPORTS / REFUTES / NOT ENOUGH INFO is refused rather than scored wrong. The rules:
- labels are compared in upper case; label accuracy = correct labels / claims;
- FEVER score: the label is right and, unless the claim is NOT ENOUGH INFO, some complete gold evidence
  group (its [page, line] pairs) is among the first 5 predicted evidence;
- evidence precision, per non-NEI claim: the share of the first 5 predicted evidence that appear
  anywhere in its gold evidence (1.0 when it predicts none), averaged over non-NEI claims;
- evidence recall, per non-NEI claim: 1 when a complete group is among the first 5 (or the claim has
  no gold evidence), else 0, averaged over non-NEI claims; F1 = 2PR / (P + R).
The one departure: where the official F1 divides by zero (P = R = 0), it is 0 here.

Batch scoring's output (a Parquet `predictions` table, `xh.schemas.PREDICTIONS`: FEVER's label in
`answer`, evidence as `supporting_facts` {title: page id, sent: line}) is scored by pairing its rows
with the gold lines by id instead of position; a claim without a prediction (quarantined on the way)
scores as wrong: no label, no evidence.

Slices: claims whose gold evidence has a group of one sentence (`single_evidence`), claims whose every
group needs several sentences (`multi_evidence`), `not_enough_info`, and `no_evidence` for a verifiable
claim without gold evidence (none in the FEVER data). Each slice has its number of claims; the
evidence measures of the NEI slice are null (it has no evidence to measure).
"""

from __future__ import annotations

from dataclasses import dataclass
from numbers import Integral
from typing import Any

from xh.graph.encoded import CLAIM_LABELS
from xh.storage.jsonfiles import InputFileError as EvalInputError
from xh.storage.jsonfiles import read_jsonl

MAX_EVIDENCE = 5
NEI = "NOT ENOUGH INFO"
METRIC_KEYS = ("fever_score", "label_accuracy", "evidence_precision", "evidence_recall", "evidence_f1")

Sentence = tuple[Any, Any]  # (page, line); gold lines of NEI claims are null


@dataclass(frozen=True)
class GoldClaim:
    id: Any
    label: str  # upper case, one of CLAIM_LABELS
    evidence: list[list[Sentence]]  # groups; each group is complete evidence on its own


@dataclass(frozen=True)
class PredictedClaim:
    label: str  # upper case
    evidence: list[tuple[str, int]]  # ranked; only the first max_evidence count


@dataclass(frozen=True)
class ClaimScore:
    """One claim's share of each sum the official scorer divides at the end."""

    correct: float
    strict: float
    precision: float
    precision_hits: float  # 1 for non-NEI claims: precision is averaged over those
    recall: float
    recall_hits: float


def score_claim(gold: GoldClaim, pred: PredictedClaim, max_evidence: int = MAX_EVIDENCE) -> ClaimScore:
    """The official scorer's per-claim terms (is_correct_label, is_strictly_correct, evidence_macro_*)."""
    correct = gold.label == pred.label
    if gold.label == NEI:
        return ClaimScore(float(correct), float(correct), 0.0, 0.0, 0.0, 0.0)
    kept = pred.evidence[:max_evidence]
    # Lists, not sets: a sentence predicted twice counts twice in precision, as in the official code.
    covered = any(all(sentence in kept for sentence in group) for group in gold.evidence)
    all_gold = [s for group in gold.evidence for s in group if s[1] is not None]
    precision = sum(1.0 for s in kept if s in all_gold) / len(kept) if kept else 1.0
    recall = 1.0 if not gold.evidence or covered else 0.0
    return ClaimScore(float(correct), float(correct and covered), precision, 1.0, recall, 1.0)


def aggregate(scores: list[ClaimScore]) -> dict[str, float]:
    """The official scorer's final divisions over a list of claims."""
    total = len(scores)
    precision_hits = sum(s.precision_hits for s in scores)
    recall_hits = sum(s.recall_hits for s in scores)
    precision = sum(s.precision for s in scores) / precision_hits if precision_hits > 0 else 1.0
    recall = sum(s.recall for s in scores) / recall_hits if recall_hits > 0 else 0.0
    return {
        "fever_score": sum(s.strict for s in scores) / total,
        "label_accuracy": sum(s.correct for s in scores) / total,
        "evidence_precision": precision,
        "evidence_recall": recall,
        "evidence_f1": 2.0 * precision * recall / (precision + recall) if precision + recall > 0 else 0.0,
    }


def evidence_slice(gold: GoldClaim) -> str:
    if gold.label == NEI:
        return "not_enough_info"
    sizes = [len(group) for group in gold.evidence]
    if 1 in sizes:
        return "single_evidence"
    if sizes and min(sizes) > 1:
        return "multi_evidence"
    return "no_evidence"


def evaluate_fever(
    gold: list[dict], predictions: list[dict], slices: bool = False, max_evidence: int = MAX_EVIDENCE
) -> dict[str, Any]:
    """The official metrics over line-aligned gold claims and predictions; `slices` adds them per
    evidence slice, with the number of claims in each."""
    return _evaluate(list(enumerate(gold, 1)), list(enumerate(predictions, 1)), slices, max_evidence)


def evaluate_fever_files(gold_path: str, pred_path: str, slices: bool = False) -> dict[str, Any]:
    """`evaluate_fever` on two JSON-lines files (local paths or s3:// URIs), paired line by line; a
    prediction path that is a Parquet predictions table (a folder, or a `.parquet` file) is paired by id."""
    try:
        gold = read_jsonl(gold_path)
        if pred_path.endswith((".jsonl", ".json", ".jsonl.bz2")):
            predictions = read_jsonl(pred_path)
        else:
            predictions = list(enumerate(_table_predictions(pred_path, [record for _, record in gold]), 1))
        return _evaluate(gold, predictions, slices, MAX_EVIDENCE)
    except EvalInputError as e:  # name the file instead of its side
        side, _, detail = str(e).partition(": ")
        if side not in ("gold", "prediction"):  # already names its file
            raise
        raise EvalInputError(f"{gold_path if side == 'gold' else pred_path}: {detail}") from None


def official_predictions(rows: list[dict]) -> list[dict]:
    """PREDICTIONS rows (FEVER) -> the official format: {"id", "predicted_label", "predicted_evidence"}."""
    return [
        {
            "id": r["qid"],
            "predicted_label": r["answer"],
            "predicted_evidence": [[sf["title"], sf["sent"]] for sf in (r.get("supporting_facts") or [])],
        }
        for r in rows
    ]


def flat_metrics(result: dict[str, Any]) -> dict[str, float]:
    """`evaluate_fever(..., slices=True)` as flat numeric keys (for MLflow): `fever_score`, ...,
    `single_evidence_fever_score`, `nei_label_accuracy`, `multi_evidence_claims`; null measures left out."""
    flat = {k: float(v) for k, v in result.items() if k in METRIC_KEYS}
    for name, metrics in (result.get("slices") or {}).items():
        prefix = "nei" if name == "not_enough_info" else name
        flat |= {f"{prefix}_{k}": float(v) for k, v in metrics.items() if v is not None}
    return flat


def with_misses(metrics: dict[str, float], scored: int, missed: int) -> dict[str, float]:
    """Flat metrics of `scored` claims with `missed` more that got no graph counted as wrong, as the official
    scorer counts a claim without a prediction: the two per-claim accuracies scale by scored / (scored + missed)."""
    share = scored / (scored + missed) if scored + missed else 0.0
    return metrics | {k: metrics[k] * share for k in ("fever_score", "label_accuracy") if k in metrics}


def _table_predictions(uri: str, gold: list[Any]) -> list[dict | None]:
    """A Parquet predictions table, one official record per gold line (None where a claim has none)."""
    import pyarrow.dataset as pads

    from xh.storage.uris import resolve

    try:
        fs, path = resolve(uri)
        table = pads.dataset(path, filesystem=fs, format="parquet").to_table(
            columns=["qid", "answer", "supporting_facts"]
        )
    except (OSError, ValueError, KeyError) as e:  # pyarrow's errors are OSError / ArrowInvalid (a ValueError)
        raise EvalInputError(f"prediction: {uri} is not a predictions table ({str(e).splitlines()[0]})") from None
    by_id = {p["id"]: p for p in official_predictions(table.to_pylist())}
    aligned = []
    for record in gold:
        found = by_id.get(str(record.get("id"))) if isinstance(record, dict) else None
        aligned.append(None if found is None else {k: v for k, v in found.items() if k != "id"})
    return aligned


def _evaluate(gold: list[tuple[int, Any]], predictions: list[tuple[int, Any]], slices: bool, max_evidence: int) -> dict:
    if not gold:
        raise EvalInputError("gold: no claims")
    if len(gold) != len(predictions):
        raise EvalInputError(
            f"prediction: {len(predictions)} predictions for {len(gold)} gold claims (paired by position)"
        )
    claims = [_gold_claim(number, record) for number, record in gold]
    preds = [_predicted_claim(number, record, raw_gold) for (number, record), (_, raw_gold) in zip(predictions, gold)]
    scores = [score_claim(g, p, max_evidence) for g, p in zip(claims, preds)]
    result: dict[str, Any] = aggregate(scores)
    if slices:
        groups: dict[str, list[ClaimScore]] = {}
        for claim, score in zip(claims, scores):
            groups.setdefault(evidence_slice(claim), []).append(score)
        result["slices"] = {name: _slice(members) for name, members in sorted(groups.items())}
    return result


def _slice(scores: list[ClaimScore]) -> dict[str, Any]:
    metrics: dict[str, Any] = {"claims": len(scores), **aggregate(scores)}
    if not any(s.precision_hits for s in scores):  # NEI only: the evidence measures have nothing to measure
        metrics.update(evidence_precision=None, evidence_recall=None, evidence_f1=None)
    return metrics


def _gold_claim(number: int, record: Any) -> GoldClaim:
    where = f"gold: line {number}"
    if not isinstance(record, dict) or not isinstance(record.get("label"), str):
        raise EvalInputError(f"{where} has no string 'label'")
    label = record["label"].upper()
    if label not in CLAIM_LABELS:
        raise EvalInputError(f"{where}: label {record['label']!r} is not one of {', '.join(CLAIM_LABELS)}")
    groups = record.get("evidence")
    if not isinstance(groups, (list, tuple)) or not all(
        isinstance(group, (list, tuple)) and all(isinstance(e, (list, tuple)) and len(e) == 4 for e in group)
        for group in groups
    ):
        raise EvalInputError(f"{where}: 'evidence' is not a list of groups of [annotation_id, evidence_id, page, line]")
    return GoldClaim(record.get("id"), label, [[(e[2], e[3]) for e in group] for group in groups])


def _predicted_claim(number: int, record: Any, gold: dict) -> PredictedClaim:
    where = f"prediction: line {number}"
    if record is None:  # a claim the predictions table has no row for: scored as wrong
        return PredictedClaim("", [])
    if not isinstance(record, dict) or not isinstance(record.get("predicted_label"), str):
        raise EvalInputError(f"{where} has no string 'predicted_label'")
    label = record["predicted_label"].upper()
    if label not in CLAIM_LABELS:
        labels = ", ".join(CLAIM_LABELS)
        raise EvalInputError(f"{where}: predicted_label {record['predicted_label']!r} is not one of {labels}")
    evidence = record.get("predicted_evidence")
    # JSON gives lists of [str, int]; callers in-process may hand tuples and numpy integers, which compare alike.
    if not isinstance(evidence, (list, tuple)) or not all(
        isinstance(e, (list, tuple)) and len(e) == 2 and isinstance(e[0], str) and _is_index(e[1]) for e in evidence
    ):
        raise EvalInputError(f"{where}: 'predicted_evidence' is not a list of [page, line]")
    # The official scorer would score against a prediction's own copy of the gold: it must be the same.
    for key in ("id", "label", "evidence"):
        if key in record and record[key] != gold.get(key):
            raise EvalInputError(
                f"{where}: {key} {_short(record[key])} differs from the gold line's {_short(gold.get(key))}"
            )
    return PredictedClaim(label, [(page, line) for page, line in evidence])


def _is_index(value: Any) -> bool:
    return isinstance(value, Integral) and not isinstance(value, bool)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
