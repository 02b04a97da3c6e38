"""Stage summaries logged to MLflow: measurements only; quarantine reasons (data) and settings
(configuration, the run's params) never become metric names."""

from mlflow.utils.validation import _validate_metric_name

from xh.config import load_config
from xh.stages.graphs import built_with
from xh.tracking import flatten_numbers

REASONS = {"invalid record: 'context' is not a list [got str]": 1, 'no "answer" (span)': 1}
# what the graphs stage records beside its counts (`xh.stages.graphs`): every setting it built with
SETTINGS = built_with(load_config(None, []))


def test_the_graphs_summary_logs_its_counts_and_neither_its_reasons_nor_its_settings():
    summary = {
        "task": "hotpot",
        "graphs": 3,
        "quarantined": 2,
        "quarantine_reasons": REASONS,
        "settings": SETTINGS,
        "nodes": {"mean": 6.5, "p50": 7},
    }
    names = flatten_numbers(summary)
    assert names == {"graphs": 3, "quarantined": 2, "nodes.mean": 6.5, "nodes.p50": 7}
    for name in names:
        _validate_metric_name(name)  # raises MlflowException on an invalid name


def test_the_demo_summary_flattens_to_names_mlflow_accepts_with_every_stage_quarantine_and_setting_left_out():
    """The demo logs `flatten_numbers` of all its stages at once: the graphs' reasons and settings, and the
    question-type classifier's reasons, sit two levels down there."""
    # numbers, some nested (the retrieve section's node choice): they would pass as metrics
    assert {"seed", "max_node_tokens", "workers"} <= SETTINGS.keys() and "ir_keep" in SETTINGS["retrieve"]
    stages = {
        "graphs": {"graphs": 3, "quarantined": 2, "quarantine_reasons": REASONS, "settings": SETTINGS},
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
