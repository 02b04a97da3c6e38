"""`xh.eval.official`: the one composition of the official metrics of graph-row predictions (training's dev
evaluation, promotion, the benches), its misses and the official files it hands back."""

from __future__ import annotations

import pytest

from xh.eval.fever import evaluate_fever, flat_metrics
from xh.eval.hotpot import evaluate_hotpot
from xh.eval.official import fever_gold, fever_prediction_file, hotpot_gold, hotpot_prediction_file, official_metrics

pytestmark = pytest.mark.unit

ROWS = [
    {"qid": "a", "answer": "Paris", "question_type": "bridge", "supporting_facts": [{"title": "P", "sent": 0}]},
    {"qid": "b", "answer": "yes", "question_type": "comparison", "supporting_facts": [{"title": "Q", "sent": 1}]},
]
PREDICTIONS = [
    {"qid": "a", "answer": "paris", "supporting_facts": [("P", 0)]},
    {"qid": "b", "answer": "no", "supporting_facts": [("Q", 1), ("R", 0)]},
]


def test_hotpot_metrics_are_the_official_scripts_on_the_converted_files_and_misses_score_zero():
    files: dict = {}
    metrics = official_metrics(ROWS, PREDICTIONS, "hotpot", files=files)
    assert metrics == pytest.approx(evaluate_hotpot(hotpot_gold(ROWS), hotpot_prediction_file(PREDICTIONS)))
    assert metrics["em"] == 0.5 and files["gold"] == hotpot_gold(ROWS)
    assert files["predictions"]["sp"]["b"] == [["Q", 1], ["R", 0]]
    missed = official_metrics(ROWS, PREDICTIONS, "hotpot", missed=["c", "d"])
    assert missed["em"] == pytest.approx(metrics["em"] / 2)  # two more questions, both scored 0
    assert official_metrics([], [], "hotpot") == {}


def test_fever_metrics_are_the_scorers_flat_slices_with_misses_as_wrong_claims():
    rows = [
        {"qid": 1, "claim_label": "SUPPORTS", "evidence": [[{"page": "P", "line": 0}]]},
        {"qid": 2, "claim_label": "NOT ENOUGH INFO", "evidence": None},
    ]
    predictions = [
        {"qid": 1, "label": "SUPPORTS", "evidence": [("P", 0)]},
        {"qid": 2, "label": "REFUTES", "evidence": [("X", 3)]},
    ]
    metrics = official_metrics(rows, predictions, "fever")
    expected = flat_metrics(evaluate_fever(fever_gold(rows), fever_prediction_file(predictions), slices=True))
    assert metrics == pytest.approx(expected) and metrics["fever_score"] == 0.5
    assert official_metrics(rows, predictions, "fever", missed=["3", "4"])["fever_score"] == pytest.approx(0.25)
    assert official_metrics([], [], "fever") == {"fever_score": 0.0, "label_accuracy": 0.0}
