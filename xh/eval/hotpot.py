"""HotpotQA's official metrics: `hotpot_evaluate_v1.py`, rule for rule.

    gold = json.load(open("hotpot_dev_distractor_v1.json"))            # [{"_id", "answer", "supporting_facts", "type"}, ...]
    prediction = {"answer": {qid: "Paris"}, "sp": {qid: [["Title", 0], ...]}}
    evaluate_hotpot(gold, prediction)               # {"em", "f1", "prec", "recall", "sp_*", "joint_*"}
    evaluate_hotpot(gold, prediction, slices=True)  # ... plus "slices": {"bridge": {...}, "comparison": {...}}
    evaluate_hotpot_files("gold.json", "pred.json")  # the same from files (local or s3://)

The rules, as the official script has them:
- answers are compared after `normalize_answer` (lower case, punctuation and the articles a / an / the
  removed, whitespace collapsed); EM is equality, F1 is over tokens with multiplicity; when either side
  normalises to yes / no / noanswer and they differ, EM, F1, precision and recall are all 0;
- supporting facts are compared as sets of (title, sentence index) pairs; their EM needs both sets equal;
- joint precision = answer precision x sp precision, joint recall likewise, joint F1 from those two,
  joint EM = answer EM x sp EM;
- a question with no predicted answer (or no predicted supporting facts) scores 0 on those and on the
  joint metrics; every average is over all gold questions, predictions for other ids are ignored.

Supporting facts are not checked against the paragraphs (a fact may name a sentence past the end of
its paragraph; the official script does not care either).
"""

from __future__ import annotations

import re
import string
from collections import Counter
from numbers import Integral
from typing import Any

from xh.storage.jsonfiles import InputFileError as EvalInputError
from xh.storage.jsonfiles import read_json

ANSWER_KEYS = ("em", "f1", "prec", "recall")
SP_KEYS = ("sp_em", "sp_f1", "sp_prec", "sp_recall")
JOINT_KEYS = ("joint_em", "joint_f1", "joint_prec", "joint_recall")
METRIC_KEYS = ANSWER_KEYS + SP_KEYS + JOINT_KEYS  # the official script's keys, in its order

_PUNCTUATION = frozenset(string.punctuation)
_ZERO_RULE_ANSWERS = ("yes", "no", "noanswer")


def normalize_answer(text: str) -> str:
    """The official HotpotQA normalisation: lower case, no punctuation, no articles, single spaces."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def answer_scores(prediction: str, gold: str) -> tuple[float, float, float, float]:
    """(em, f1, precision, recall) of one predicted answer against the gold one."""
    pred, true = normalize_answer(prediction), normalize_answer(gold)
    em = float(pred == true)
    if pred != true and (pred in _ZERO_RULE_ANSWERS or true in _ZERO_RULE_ANSWERS):
        return em, 0.0, 0.0, 0.0
    pred_tokens, true_tokens = pred.split(), true.split()
    same = sum((Counter(pred_tokens) & Counter(true_tokens)).values())
    if same == 0:
        return em, 0.0, 0.0, 0.0
    prec, recall = same / len(pred_tokens), same / len(true_tokens)
    return em, 2 * prec * recall / (prec + recall), prec, recall


def sp_scores(prediction: list, gold: list) -> tuple[float, float, float, float]:
    """(em, f1, precision, recall) of predicted supporting facts against the gold ones, as sets of pairs."""
    pred, true = set(map(tuple, prediction)), set(map(tuple, gold))
    tp, fp, fn = len(pred & true), len(pred - true), len(true - pred)
    prec = tp / (tp + fp) if tp + fp > 0 else 0.0
    recall = tp / (tp + fn) if tp + fn > 0 else 0.0
    f1 = 2 * prec * recall / (prec + recall) if prec + recall > 0 else 0.0
    return float(fp + fn == 0), f1, prec, recall


def question_scores(question: dict, prediction: dict) -> dict[str, float]:
    """The 12 metrics of one gold question; those a missing prediction cannot earn are 0."""
    qid = question["_id"]
    scores = dict.fromkeys(METRIC_KEYS, 0.0)
    answer = prediction["answer"].get(qid)
    sp = prediction["sp"].get(qid)
    if answer is not None:
        scores.update(zip(ANSWER_KEYS, answer_scores(answer, question["answer"])))
    if sp is not None:
        scores.update(zip(SP_KEYS, sp_scores(sp, question["supporting_facts"])))
    if answer is not None and sp is not None:
        joint_prec = scores["prec"] * scores["sp_prec"]
        joint_recall = scores["recall"] * scores["sp_recall"]
        scores["joint_prec"], scores["joint_recall"] = joint_prec, joint_recall
        if joint_prec + joint_recall > 0:
            scores["joint_f1"] = 2 * joint_prec * joint_recall / (joint_prec + joint_recall)
        scores["joint_em"] = scores["em"] * scores["sp_em"]
    return scores


def evaluate_hotpot(gold: list[dict], prediction: dict, slices: bool = False) -> dict[str, Any]:
    """The official metrics averaged over every gold question; `slices` adds them per question type,
    with the number of questions and of missing answers / supporting facts in each."""
    _check_gold(gold)
    _check_prediction(prediction, [q["_id"] for q in gold])
    per_question = [question_scores(q, prediction) for q in gold]
    result: dict[str, Any] = _average(per_question)
    if slices:
        groups: dict[str, list[int]] = {}
        for i, q in enumerate(gold):
            groups.setdefault(q.get("type") or "unknown", []).append(i)
        result["slices"] = {
            kind: {
                "questions": len(members),
                "missing_answer": sum(gold[i]["_id"] not in prediction["answer"] for i in members),
                "missing_sp": sum(gold[i]["_id"] not in prediction["sp"] for i in members),
                **_average([per_question[i] for i in members]),
            }
            for kind, members in sorted(groups.items())
        }
    return result


def evaluate_hotpot_files(gold_path: str, pred_path: str, slices: bool = False) -> dict[str, Any]:
    """`evaluate_hotpot` on a gold file (the official JSON array) and a prediction file
    (`{"answer": {id: str}, "sp": {id: [[title, sent], ...]}}`), local paths or s3:// URIs."""
    gold = read_json(gold_path)
    prediction = read_json(pred_path)
    try:
        return evaluate_hotpot(gold, prediction, slices=slices)
    except EvalInputError as e:  # name the file instead of its side
        side, _, detail = str(e).partition(": ")
        if side not in ("gold", "prediction"):  # already names its file
            raise
        raise EvalInputError(f"{gold_path if side == 'gold' else pred_path}: {detail}") from None


def _average(per_question: list[dict[str, float]]) -> dict[str, float]:
    # Summed in gold order, then divided, as the official script does (same floats, same rounding).
    totals = dict.fromkeys(METRIC_KEYS, 0.0)
    for scores in per_question:
        for key in METRIC_KEYS:
            totals[key] += scores[key]
    return {key: totals[key] / len(per_question) for key in METRIC_KEYS}


def _check_gold(gold: Any) -> None:
    if not isinstance(gold, list) or not gold:
        raise EvalInputError("gold: expected a non-empty JSON array of questions")
    for i, q in enumerate(gold):
        where = f"gold question {i}"
        if not isinstance(q, dict) or not isinstance(q.get("_id"), str):
            raise EvalInputError(f"gold: {where} has no string '_id'")
        where += f" ({q['_id']})"
        if not isinstance(q.get("answer"), str):
            raise EvalInputError(f"gold: {where} has no string 'answer'")
        if not _is_fact_list(q.get("supporting_facts")):
            raise EvalInputError(f"gold: {where}: 'supporting_facts' is not a list of [title, sentence index]")


def _check_prediction(prediction: Any, ids: list[str]) -> None:
    if not isinstance(prediction, dict) or not all(isinstance(prediction.get(k), dict) for k in ("answer", "sp")):
        raise EvalInputError('prediction: expected {"answer": {id: answer}, "sp": {id: [[title, sent], ...]}}')
    for qid in ids:
        if qid in prediction["answer"] and not isinstance(prediction["answer"][qid], str):
            raise EvalInputError(f"prediction: the answer for {qid} is not a string")
        if qid in prediction["sp"] and not _is_fact_list(prediction["sp"][qid]):
            raise EvalInputError(f"prediction: the sp for {qid} is not a list of [title, sentence index]")


def _is_fact_list(value: Any) -> bool:
    # JSON gives lists of [str, int]; callers in-process may hand tuples and numpy integers, which compare alike.
    return isinstance(value, (list, tuple)) and all(
        isinstance(f, (list, tuple)) and len(f) == 2 and isinstance(f[0], str) and _is_index(f[1]) for f in value
    )


def _is_index(value: Any) -> bool:
    return isinstance(value, Integral) and not isinstance(value, bool)
