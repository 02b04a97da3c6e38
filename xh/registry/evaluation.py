"""What promotion judges a version on and how: a held-out evaluation set (by default the challenger's gate
split; checked against both models' training splits and the challenger's recorded graph settings), the
version's predictions and their official metrics (`xh.eval.official`)."""

from __future__ import annotations

import json
from collections.abc import Sequence

import mlflow

from xh.config import ConfigError
from xh.eval.official import official_metrics
from xh.registry.pyfunc import INPUT_COLUMNS, LoadedVersion, graph_input, input_columns, takes_graph_rows
from xh.registry.register import pipeline_of
from xh.registry.versions import data_folder, version_files
from xh.storage.store import Location, Store


def training_split(name: str, version: str) -> tuple[str, dict | None]:
    """(run id, the split its training run recorded or None) of a registered version; an unknown version
    is refused in one line (ConfigError)."""
    from xh.train.split import recorded_split

    try:
        run_id = mlflow.MlflowClient().get_model_version(name, str(version)).run_id or ""
    except mlflow.exceptions.MlflowException as e:
        raise ConfigError(f"promote: no version {version} of registered model {name!r}: {e.message}") from None
    return run_id, recorded_split(run_id)


def evaluation_set(
    store: Store, name: str, version: str, eval_set: Location | None = None, champion: str | None = None
) -> dict:
    """What promotion evaluates `version` of `name` (the challenger) and `champion` on: `eval_set` when named,
    else the gate split the challenger's training run recorded (`xh.train.split`: questions that neither
    trained it nor picked its checkpoint). A set sharing questions with either model's training set is
    refused (ConfigError, counting them); a model whose run recorded no split cannot be checked, which the
    lineage says. A challenger without a gate split needs a named set. A named set's questions that
    picked the challenger's checkpoint (its dev split) are counted as `dev_overlap` in the lineage.

    Returns {"uri", "folder", "rows", "missed", "dataset"}: the set's description, its graphs folder, its graph
    rows, the ids of its questions without a graph (misses), and its lineage (`xh.tracking.dataset_ref`)."""
    from xh.graph.store import quarantined_qids, read_eval_set
    from xh.tracking import dataset_ref
    from xh.train.split import dev_questions, has_part, held_set, part_uri

    run_id, record = training_split(name, version)
    if eval_set is None:
        if record is None or not has_part(record, "gate"):
            why = f"its run {run_id or '(none)'} " + (
                "recorded no split" if record is None else "held out no gate split"
            )
            raise ConfigError(
                f"{name} version {version} has no gate set ({why}): name held-out graphs with promote.eval_set "
                "(--eval-set), or train with train.gate_fraction > 0"
            )
        rows, missed = held_set(record, "gate", store)
        uri, folder = part_uri(record, "gate"), record["graphs"]
        profile = {
            "split": "gate",
            "gate_fraction": record["gate_fraction"],
            "question_types": record["question_types"],
        }
    else:
        rows, missed = read_eval_set(eval_set), quarantined_qids(eval_set)
        uri = folder = eval_set.uri
        profile = {"split": "named"}
        if record is not None:  # not refused (dev trained nothing), but the judgement is optimistic: flagged
            profile["dev_overlap"] = len({r["qid"] for r in rows} & dev_questions(record, store))
    what = "the gate set" if eval_set is None else f"promote.eval_set {eval_set}"
    profile["training_split"] = _check_overlap(store, name, what, {r["qid"] for r in rows}, version, champion, record)
    profile |= {"num_rows": len(rows), "missed": len(missed)}
    return {
        "uri": uri,
        "folder": folder,
        "rows": rows,
        "missed": missed,
        "dataset": dataset_ref(store.at(folder), "eval-set", profile),
    }


def _check_overlap(
    store: Store, name: str, what: str, qids: set[str], challenger: str, champion: str | None, record: dict | None
) -> dict:
    """{"challenger": "checked" | "not recorded", "champion": ...}; refuses a set either model trained on."""
    from xh.train.split import shared_questions

    checked = {}
    for role, version in (("challenger", challenger), ("champion", champion)):
        if version is None:
            continue
        split = record if role == "challenger" else training_split(name, version)[1]
        if split is None:
            checked[role] = "not recorded"
            continue
        shared = shared_questions(split, qids, store)
        if shared:
            raise ConfigError(
                f"{what} shares {shared} of its {len(qids)} questions with the training set of {name} version "
                f"{version} (the {role}): name held-out graphs that neither model trained on"
            )
        checked[role] = "checked"
    return checked


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


def evaluate_version(name: str, version: str, rows: Sequence[dict], task: str, missed: Sequence[str] = ()) -> dict:
    """The official metrics (HotpotQA's; FEVER's scorer with its slices) of one registered version on graph rows,
    in this process, and under `predictions` its predictions; `missed`: ids of evaluation questions that got
    no graph, each scored as a miss."""
    predictions = version_predictions(name, version, rows)
    return official_metrics(rows, predictions, task, missed) | {"predictions": predictions}
