"""What promotion judges a version on and how: a held-out evaluation set (checked against the version's training
split and its recorded graph settings), the version's predictions and the official metrics."""

from __future__ import annotations

import json
from collections.abc import Sequence

import mlflow

from xh.config import ConfigError
from xh.registry.pyfunc import INPUT_COLUMNS, LoadedVersion, graph_input, input_columns, takes_graph_rows
from xh.registry.register import pipeline_of
from xh.registry.versions import data_folder, version_files
from xh.store import Location, Store


def evaluation_set(store: Store, name: str, version: str, eval_set: Location | None = None) -> dict:
    """What promotion evaluates `version` of `name` on, held out from its training: `eval_set` when named,
    else the dev split its training run recorded (`xh.train.split`, read through `store`). A named set that shares questions with
    the version's training set is refused (ConfigError, counting them); a version whose run recorded no split
    (registered from code, or before the record) needs a named set, which is then taken as it is.

    Returns {"uri", "folder", "rows", "missed", "dataset"}: the set's description, its graphs folder, its graph
    rows, the ids of its questions without a graph (misses), and its lineage (`xh.tracking.dataset_ref`)."""
    from xh.graph.store import quarantined_qids, read_eval_set
    from xh.tracking import dataset_ref
    from xh.train.split import dev_set, dev_uri, recorded_split, shared_questions

    run_id = mlflow.MlflowClient().get_model_version(name, version).run_id or ""
    record = recorded_split(run_id)
    what = f"{name} version {version}"
    if eval_set is None:
        if record is None:
            raise ConfigError(
                f"{what} has no recorded training split (its run {run_id or '(none)'} has no split.json): "
                "name held-out graphs with promote.eval_set (--eval-set)"
            )
        rows, missed = dev_set(record, store)
        uri, folder = dev_uri(record), record["dev_graphs"] or record["graphs"]
        profile = {"split": "dev", "dev_fraction": record["dev_fraction"], "question_types": record["question_types"]}
    else:
        rows, missed = read_eval_set(eval_set), quarantined_qids(eval_set)
        if record is not None:
            qids = {r["qid"] for r in rows}
            shared = shared_questions(record, qids, store)
            if shared:
                raise ConfigError(
                    f"promote.eval_set {eval_set} shares {shared} of its {len(qids)} questions with the training "
                    f"set of {what} (run {run_id}): name held-out graphs, or leave it unset for the run's dev split"
                )
        uri = folder = eval_set.uri
        profile = {"split": "named", "training_split": "checked" if record is not None else "not recorded"}
    profile |= {"num_rows": len(rows), "missed": len(missed)}
    return {
        "uri": uri,
        "folder": folder,
        "rows": rows,
        "missed": missed,
        "dataset": dataset_ref(store.at(folder), "eval-set", profile),
    }


def eval_graph_drift(name: str, version: str, folder: Location, allow_drift: bool = False) -> dict | None:
    """How the graphs of an evaluation set (`folder`, built by `xh graphs`) differ from those `version` of `name`
    was trained on: each graph setting its `_summary.json` records is compared with the version's pipeline record
    (`xh.pipeline_record.GRAPH_KNOBS`, and the node choice `xh.config.NODE_CHOICE` of the retrieve section), as
    batch scoring compares its config (`apply_pipeline`). A difference is
    refused (`PipelineDrift`, one line naming the setting) unless `allow_drift` (`score.allow_drift`), and then
    returned as {setting: {"version", "used"}}. None for a version registered without a pipeline record."""
    import tempfile

    from xh.config import NODE_CHOICE
    from xh.graph.store import read_summary
    from xh.pipeline_record import GRAPH_KNOBS, PipelineDrift

    with tempfile.TemporaryDirectory(prefix="xh-pipeline-") as dst:
        found = pipeline_of(name, version, dst)
    if found is None:
        return None
    summary = read_summary(folder)
    built = summary.get("settings", {}) | {k: summary[k] for k in ("task", "edge_mode") if k in summary}
    drift = {}
    for section, keys, ours, theirs in (
        ("graphs", GRAPH_KNOBS, built, found[0]["graphs"]),
        ("retrieve", NODE_CHOICE, built.get("retrieve", {}), found[0]["retrieve"]),
    ):
        for key in keys:
            if key in ours and key in theirs and ours[key] != theirs[key]:
                if not allow_drift:
                    raise PipelineDrift(
                        f"{section}.{key}={ours[key]!r} of the evaluation set {folder} differs from {name} version "
                        f"{version}'s {theirs[key]!r}: a version is judged on graphs built as it was trained (rebuild "
                        "the evaluation set, or set score.allow_drift=true)"
                    )
                drift[f"{section}.{key}"] = {"version": theirs[key], "used": ours[key]}
    return drift


def version_predictions(name: str, version: str, rows: Sequence[dict]) -> list[dict]:
    """One registered version's predictions on graph rows (in their order), loaded from its data alone; a
    signature other than the graph input's is refused (ValueError)."""
    local, meta = version_files(name, version)
    if not takes_graph_rows(meta):
        raise ValueError(f"signature mismatch: inputs {input_columns(meta)}, expected {INPUT_COLUMNS}")
    frame = LoadedVersion(data_folder(local, meta, f"{name} version {version}")).predict(graph_input(rows))
    return [
        {k: json.loads(v) if k in ("supporting_facts", "evidence", "label_probs") else v for k, v in p.items()}
        for p in frame.to_dict("records")
    ]


def official_metrics(rows: Sequence[dict], predictions: Sequence[dict], task: str, missed: Sequence[str] = ()) -> dict:
    """HotpotQA's official metrics (FEVER: its scorer, with the slices) of predictions aligned with `rows`;
    `missed`: ids of evaluation questions that got no graph, each scored as a miss (`xh.inference.hotpot_gold`)."""
    from xh.eval.hotpot import evaluate_hotpot
    from xh.inference import hotpot_gold, hotpot_prediction_file

    if task == "fever":  # the official scorer: fever_score, label_accuracy, evidence_*, and per slice
        from xh.eval.fever import evaluate_fever, flat_metrics, with_misses
        from xh.inference import fever_gold, fever_prediction_file

        result = evaluate_fever(fever_gold(rows), fever_prediction_file(predictions), slices=True)
        return with_misses(flat_metrics(result), len(rows), len(missed))
    return evaluate_hotpot(hotpot_gold(rows, missed), hotpot_prediction_file(predictions))


def evaluate_version(name: str, version: str, rows: Sequence[dict], task: str, missed: Sequence[str] = ()) -> dict:
    """The official metrics (HotpotQA's; FEVER's scorer with its slices) of one registered version on graph rows,
    in this process; `missed`: ids of evaluation questions that got no graph, each scored as a miss."""
    return official_metrics(rows, version_predictions(name, version, rows), task, missed)
