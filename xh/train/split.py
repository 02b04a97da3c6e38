"""The train / dev split of a training run, recorded with the run so that promotion judges on held-out data.

    record = split_record(graphs_uri, dev_graphs, dev_fraction=0.2, question_types=None)   # the run's split.json
    record = recorded_split(run_id)            # what a registered version's training run recorded (None: nothing)
    rows, missed = dev_set(record)             # promotion's default evaluation set: the run's dev graphs
    shared = shared_questions(record, qids)    # evaluation questions the run trained on

Training either holds out `dev_fraction` of the graphs by a hash of the qid (`in_dev_split`) or reads separate
dev graphs (`train.dev_graphs`; FEVER's `<graphs>-dev`); a model of one question type sees only those.
The record names all of it, resolved (never "the default folder"), as the JSON artifact `split.json` of the
training run: the registered version's `run_id` leads to it.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Iterable, Sequence

from xh.store import Location, Store

SPLIT_ARTIFACT = "split.json"


def in_dev_split(qid: str, dev_fraction: float) -> bool:
    """A stable split by qid (the same on every machine and every run)."""
    return (zlib.crc32(qid.encode("utf-8")) % 10_000) < dev_fraction * 10_000


def split_record(
    graphs: str, dev_graphs: str | None, dev_fraction: float, question_types: Sequence[str] | None
) -> dict:
    """What a training run trained and was evaluated on: `graphs` less its dev share (or all of it when
    `dev_graphs` is given), restricted to `question_types` (None: every type)."""
    return {
        "graphs": graphs,
        "dev_graphs": dev_graphs,
        "dev_fraction": None if dev_graphs else dev_fraction,
        "question_types": sorted(question_types) if question_types else None,
    }


def recorded_split(run_id: str) -> dict | None:
    """The split a training run recorded, or None (a version registered without one: before this record, or
    from code)."""
    import mlflow

    if not run_id:
        return None
    # a progress bar on stderr for one small file would come before a refusal's one line
    bar = os.environ.get("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR")
    os.environ["MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"] = "false"
    try:
        return mlflow.artifacts.load_dict(f"runs:/{run_id}/{SPLIT_ARTIFACT}")
    except (mlflow.exceptions.MlflowException, OSError):  # no such artifact (or run): nothing recorded
        return None
    finally:
        if bar is None:
            os.environ.pop("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR")
        else:
            os.environ["MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"] = bar


def _of_kinds(rows: Iterable[dict], kinds: Sequence[str] | None) -> list[dict]:
    return [r for r in rows if kinds is None or r.get("question_type") in kinds]


def _questions(folder: Location) -> list[dict]:
    """qid and question type of every graph of a folder (two columns read, not the graphs)."""
    import pyarrow.dataset as pads

    from xh.graph.store import require_graphs

    require_graphs(folder)
    fs, path = folder.fs_path()
    table = pads.dataset(path, filesystem=fs, format="parquet").to_table(columns=["qid", "question_type"])
    return table.to_pylist()


def training_questions(record: dict, store: Store | None = None) -> set[str]:
    """The qids the run trained on; `store` reaches the record's folders (default: settings from the environment)."""
    kinds = record.get("question_types")
    rows = _of_kinds(_questions((store or Store()).at(record["graphs"])), kinds)
    if record.get("dev_graphs"):
        return {r["qid"] for r in rows}
    return {r["qid"] for r in rows if not in_dev_split(r["qid"], record["dev_fraction"])}


def shared_questions(record: dict, qids: Iterable[str], store: Store | None = None) -> int:
    """How many of `qids` (each counted once) the run trained on."""
    return len(set(qids) & training_questions(record, store))


def dev_uri(record: dict) -> str:
    """The dev set as one string: its own folder, or the training folder with the held-out share."""
    if record.get("dev_graphs"):
        return record["dev_graphs"]
    return f"{record['graphs']} (dev split {record['dev_fraction']} by qid)"


def dev_missed(record: dict, store: Store | None = None) -> list[str]:
    """Ids of dev questions quarantined at graph building, each a miss (score 0) for every model. A model of one
    question type misses only quarantined questions of unknown type or its own (a quarantined record keeps
    its `type` when the data gave one)."""
    from xh.graph.store import quarantined_qids

    kinds, store = record.get("question_types"), store or Store()
    if record.get("dev_graphs"):
        return quarantined_qids(store.at(record["dev_graphs"]), kinds)
    graphs = quarantined_qids(store.at(record["graphs"]), kinds)
    return [q for q in graphs if in_dev_split(q, record["dev_fraction"])]


def dev_set(record: dict, store: Store | None = None) -> tuple[list[dict], list[str]]:
    """The run's dev graphs (rows with gold labels) and its dev questions without a graph."""
    from xh.graph.store import read_eval_set

    store = store or Store()
    kinds = record.get("question_types")
    if record.get("dev_graphs"):
        rows = _of_kinds(read_eval_set(store.at(record["dev_graphs"])), kinds)
    else:
        rows = [
            r
            for r in _of_kinds(read_eval_set(store.at(record["graphs"])), kinds)
            if in_dev_split(r["qid"], record["dev_fraction"])
        ]
    return rows, dev_missed(record, store)
