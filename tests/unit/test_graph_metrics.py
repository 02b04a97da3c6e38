"""`xh graphs build` logs its summary to MLflow: quarantine reasons are data, never metric names."""

from mlflow.utils.validation import _validate_metric_name

from workflows.graphs import metrics
from xh.tracking import flatten_numbers


def test_quarantine_reasons_with_quotes_and_brackets_never_become_metric_names():
    summary = {
        "task": "hotpot",
        "graphs": 3,
        "quarantined": 2,
        "quarantine_reasons": {"invalid record: 'context' is not a list [got str]": 1, 'no "answer" (span)': 1},
        "nodes": {"mean": 6.5, "p50": 7},
    }
    names = metrics(summary)
    assert names == {"graphs": 3, "quarantined": 2, "nodes.mean": 6.5, "nodes.p50": 7}
    for name in names:
        _validate_metric_name(name)  # raises MlflowException on an invalid name
    # what the driver did before: the reasons became names MLflow refuses
    bad = [n for n in flatten_numbers(summary) if n.startswith("quarantine_reasons.")]
    assert bad and any("'" in n or "[" in n or '"' in n for n in bad)
