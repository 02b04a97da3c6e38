"""The recorded train / dev / gate split (xh.train.split) on small graphs folders: which questions a run trained
on, what promotion evaluates by default (the gate share), and how many questions of an eval set overlap the
training set; the one rule behind FEVER's claim split too."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from xh import schemas
from xh.storage.tables import MARKER
from xh.train.split import (
    dev_questions,
    dev_set,
    has_part,
    held_set,
    in_dev_split,
    part_uri,
    shared_questions,
    split_of,
    split_record,
    training_questions,
)

pytestmark = pytest.mark.unit


def _empty(kind: pa.DataType):
    """A value of a non-nullable column that says nothing: empty text or list, zero, false."""
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return ""
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return []
    if pa.types.is_struct(kind):
        return {f.name: None if f.nullable else _empty(f.type) for f in kind}
    return False if pa.types.is_boolean(kind) else 0


def _graphs(folder, questions: dict[str, str]) -> str:
    """A complete graphs folder: one row per qid (with its question type), every GRAPHS column present."""
    folder.mkdir()
    defaults = {f.name: None if f.nullable else _empty(f.type) for f in schemas.GRAPHS}
    rows = [defaults | {"qid": q, "question": f"q {q}?", "question_type": t} for q, t in questions.items()]
    pq.write_table(pa.Table.from_pylist(rows, schema=schemas.GRAPHS), folder / "part-00000.parquet")
    (folder / MARKER).write_text(
        json.dumps({"rows": len(rows), "written_at": "2026-01-01T00:00:00Z", "kind": "graphs"})
    )
    return str(folder)


QUESTIONS = {f"q{i}": "bridge" if i % 3 else "comparison" for i in range(60)}
DEV = {q for q in QUESTIONS if in_dev_split(q, 0.25)}


def test_a_split_cut_from_the_graphs_trains_on_the_rest_and_evaluates_on_its_dev_share(tmp_path):
    assert 0 < len(DEV) < len(QUESTIONS)  # the hash cuts both ways on these ids
    record = split_record(_graphs(tmp_path / "g", QUESTIONS), None, 0.25, 0.0, None)
    assert training_questions(record) == set(QUESTIONS) - DEV
    rows, missed = dev_set(record)
    assert {r["qid"] for r in rows} == DEV and missed == []
    assert part_uri(record, "dev").endswith("(dev split by qid; dev 0.25, gate 0.0)")
    assert not has_part(record, "gate") and held_set(record, "gate")[0] == []
    assert shared_questions(record, DEV) == 0
    assert shared_questions(record, [*DEV, "q-new", *sorted(set(QUESTIONS) - DEV)[:3]]) == 3


def test_separate_dev_graphs_leave_the_whole_training_folder_as_training_and_types_restrict_both(tmp_path):
    graphs = _graphs(tmp_path / "g", QUESTIONS)
    dev = _graphs(tmp_path / "dev", {"d1": "bridge", "d2": "comparison"})
    record = split_record(graphs, dev, 0.25, 0.0, ("bridge",))
    assert record["dev_fraction"] is None and record["question_types"] == ["bridge"]
    assert training_questions(record) == {q for q, t in QUESTIONS.items() if t == "bridge"}
    rows, _ = dev_set(record)
    assert [r["qid"] for r in rows] == ["d1"] and part_uri(record, "dev") == dev
    assert dev_questions(record) == {"d1"}
    # the comparison questions were not trained on by a bridge model: no overlap counted for them
    assert shared_questions(record, ["q0", "q1", "q2"]) == 2


def test_the_gate_share_is_cut_after_dev_so_dev_is_unchanged_and_the_gate_neither_trains_nor_selects(tmp_path):
    parts = {q: split_of(q, 0.25, 0.2) for q in QUESTIONS}
    gate = {q for q, p in parts.items() if p == "gate"}
    assert {q for q, p in parts.items() if p == "dev"} == DEV  # a gate share moves no dev question
    assert 0 < len(gate) and not gate & DEV
    record = split_record(_graphs(tmp_path / "g", QUESTIONS), None, 0.25, 0.2, None)
    assert has_part(record, "gate") and part_uri(record, "gate").endswith("(gate split by qid; dev 0.25, gate 0.2)")
    assert training_questions(record) == set(QUESTIONS) - DEV - gate
    rows, missed = held_set(record, "gate")
    assert {r["qid"] for r in rows} == gate and missed == []
    assert shared_questions(record, gate) == 0 and dev_questions(record) == DEV


def test_separate_dev_graphs_with_a_gate_share_cut_the_gate_from_the_training_folder(tmp_path):
    graphs = _graphs(tmp_path / "g", QUESTIONS)
    record = split_record(graphs, _graphs(tmp_path / "dev", {"d1": "bridge"}), 0.25, 0.3, None)
    gate = {q for q in QUESTIONS if split_of(q, 0.0, 0.3) == "gate"}
    assert 0 < len(gate) < len(QUESTIONS)
    assert {r["qid"] for r in held_set(record, "gate")[0]} == gate
    assert training_questions(record) == set(QUESTIONS) - gate


def test_fevers_claim_split_is_the_one_rule_with_its_gate_share_called_test():
    from xh.inputs.claims import claim_split

    names = {"train": "train", "dev": "dev", "gate": "test"}
    assert all(claim_split(q, 0.2, 0.3) == names[split_of(q, 0.2, 0.3)] for q in [*QUESTIONS, "137334", "7"])
