"""Stage summaries logged to MLflow: quarantine reasons are data, never metric names."""

from mlflow.utils.validation import _validate_metric_name

from workflows.graphs import metrics
from xh.tracking import flatten_numbers

REASONS = {"invalid record: 'context' is not a list [got str]": 1, 'no "answer" (span)': 1}


def test_quarantine_reasons_with_quotes_and_brackets_never_become_metric_names():
    summary = {
        "task": "hotpot",
        "graphs": 3,
        "quarantined": 2,
        "quarantine_reasons": REASONS,
        "nodes": {"mean": 6.5, "p50": 7},
    }
    names = metrics(summary)
    assert names == {"graphs": 3, "quarantined": 2, "nodes.mean": 6.5, "nodes.p50": 7}
    for name in names:
        _validate_metric_name(name)  # raises MlflowException on an invalid name


def test_the_demo_summary_flattens_to_names_mlflow_accepts_with_every_stage_quarantine_left_out():
    """The demo logs `flatten_numbers` of all its stages at once: the graphs' and the question-type
    classifier's reasons sit two levels down there."""
    stages = {
        "graphs": {"graphs": 3, "quarantined": 2, "quarantine_reasons": REASONS},
        "question_types": {
            "held_out_accuracy": 0.75,
            "quarantined": 1,
            "quarantine_reasons": {"unknown type 'tricky'": 1},
        },
        "retrieve": {"eval": {"all": {"supp_recall@2": 0.5}}},
    }
    names = flatten_numbers(stages)
    assert names == {
        "graphs.graphs": 3,
        "graphs.quarantined": 2,
        "question_types.held_out_accuracy": 0.75,
        "question_types.quarantined": 1,
        "retrieve.eval.all.supp_recall_at_2": 0.5,
    }
    for name in names:
        _validate_metric_name(name)
