"""The split of a training run into train, dev and gate, recorded with the run so that promotion judges on
data that chose nothing.

    part = split_of(qid, dev_fraction=0.2, gate_fraction=0.1)   # "train", "dev" or "gate": the one split rule
    record = split_record(graphs_uri, dev_graphs, 0.2, 0.1, question_types=None)   # the run's split.json
    record = recorded_split(run_id)            # what a registered version's training run recorded (None: nothing)
    rows, missed = held_set(record, "gate")    # promotion's default evaluation set: the run's gate graphs
    shared = shared_questions(record, qids)    # evaluation questions the run trained on

Three parts, by a hash of the qid (`split_of`): `train` (gradients), `dev` (evaluated at every checkpoint,
picks the best one) and `gate` (neither: promotion's default evaluation set). Dev comes first, so a run
with a gate share holds out the same dev questions as one without. With separate dev graphs
(`train.dev_graphs`; FEVER's `<graphs>-dev`) the training graphs split into train and gate only. A model
of one question type sees only those. The record names all of it, resolved (never "the default folder"),
as the JSON artifact `split.json` of the training run: the registered version's `run_id` leads to it.
The FEVER claim split (`xh.inputs.claims.claim_split`) and the question-type classifier's hold-out use the same rule.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Iterable, Sequence

from xh.storage.store import Location, Store

SPLIT_ARTIFACT = "split.json"
PARTS = ("train", "dev", "gate")


def split_of(key: str, dev_fraction: float, gate_fraction: float = 0.0) -> str:
    """The part of a question: a stable hash of its id (the same on every machine and every run); the first
    `dev_fraction` of the hash range is dev, the next `gate_fraction` gate, the rest train."""
    bucket = zlib.crc32(str(key).encode("utf-8")) % 10_000
    if bucket < dev_fraction * 10_000:
        return "dev"
    return "gate" if bucket < (dev_fraction + gate_fraction) * 10_000 else "train"


def in_dev_split(qid: str, dev_fraction: float) -> bool:
    """Whether `split_of` puts `qid` in dev (dev comes first: the gate share does not change it)."""
    return split_of(qid, dev_fraction) == "dev"


def split_record(
    graphs: str,
    dev_graphs: str | None,
    dev_fraction: float,
    gate_fraction: float,
    question_types: Sequence[str] | None,
) -> dict:
    """What a training run trained, was evaluated and may be gated on: `graphs` less its dev share (none
    when `dev_graphs` is given) and its gate share, restricted to `question_types` (None: every type)."""
    return {
        "graphs": graphs,
        "dev_graphs": dev_graphs,
        "dev_fraction": None if dev_graphs else dev_fraction,
        "gate_fraction": gate_fraction,
        "question_types": sorted(question_types) if question_types else None,
    }


def part_of(record: dict, qid: str) -> str:
    """The part of `qid` of the record's training graphs (a record without a gate share has none)."""
    return split_of(qid, record.get("dev_fraction") or 0.0, record.get("gate_fraction") or 0.0)


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
    rows = _of_kinds(_questions((store or Store()).at(record["graphs"])), record.get("question_types"))
    return {r["qid"] for r in rows if part_of(record, r["qid"]) == "train"}


def shared_questions(record: dict, qids: Iterable[str], store: Store | None = None) -> int:
    """How many of `qids` (each counted once) the run trained on."""
    return len(set(qids) & training_questions(record, store))


def dev_questions(record: dict, store: Store | None = None) -> set[str]:
    """The qids that picked the run's checkpoints (its dev split, or its own dev graphs)."""
    store = store or Store()
    if record.get("dev_graphs"):
        return {r["qid"] for r in _of_kinds(_questions(store.at(record["dev_graphs"])), record.get("question_types"))}
    rows = _of_kinds(_questions(store.at(record["graphs"])), record.get("question_types"))
    return {r["qid"] for r in rows if part_of(record, r["qid"]) == "dev"}


def has_part(record: dict, part: str) -> bool:
    """Whether the run held out `part` ("dev" or "gate") at all."""
    if part == "dev":
        return bool(record.get("dev_graphs") or record.get("dev_fraction"))
    return bool(record.get("gate_fraction"))


def part_uri(record: dict, part: str) -> str:
    """A held-out part as one string: the dev set's own folder, or the training folder with the part's share."""
    if part == "dev" and record.get("dev_graphs"):
        return record["dev_graphs"]
    shares = f"dev {record.get('dev_fraction') or 0.0}, gate {record.get('gate_fraction') or 0.0}"
    return f"{record['graphs']} ({part} split by qid; {shares})"


def _folder(record: dict, part: str) -> str:
    return record["dev_graphs"] if part == "dev" and record.get("dev_graphs") else record["graphs"]


def part_missed(record: dict, part: str, store: Store | None = None) -> list[str]:
    """Ids of the part's questions quarantined at graph building, each a miss (score 0) for every model. A model
    of one question type misses only quarantined questions of unknown type or its own (a quarantined record
    keeps its `type` when the data gave one)."""
    from xh.graph.store import quarantined_qids

    kinds, store = record.get("question_types"), store or Store()
    quarantined = quarantined_qids(store.at(_folder(record, part)), kinds)
    if part == "dev" and record.get("dev_graphs"):
        return quarantined
    return [q for q in quarantined if part_of(record, q) == part]


def dev_missed(record: dict, store: Store | None = None) -> list[str]:
    """The dev questions without a graph (training's dev metrics count them as misses)."""
    return part_missed(record, "dev", store)


def held_set(record: dict, part: str, store: Store | None = None) -> tuple[list[dict], list[str]]:
    """The graphs of a held-out part ("dev" or "gate"; rows with gold labels) and its questions without a graph."""
    from xh.graph.store import read_eval_set

    store = store or Store()
    rows = _of_kinds(read_eval_set(store.at(_folder(record, part))), record.get("question_types"))
    if not (part == "dev" and record.get("dev_graphs")):
        rows = [r for r in rows if part_of(record, r["qid"]) == part]
    return rows, part_missed(record, part, store)


def dev_set(record: dict, store: Store | None = None) -> tuple[list[dict], list[str]]:
    """The run's dev graphs and its dev questions without a graph."""
    return held_set(record, "dev", store)
