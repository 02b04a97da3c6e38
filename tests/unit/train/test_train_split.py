"""The recorded train / dev split (xh.train.split) on small graphs folders: which questions a run trained on,
what promotion evaluates by default, and how many questions of an eval set overlap the training set."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from xh import schemas
from xh.tables import MARKER
from xh.train.split import dev_set, dev_uri, in_dev_split, shared_questions, split_record, training_questions

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
    record = split_record(_graphs(tmp_path / "g", QUESTIONS), None, 0.25, None)
    assert training_questions(record) == set(QUESTIONS) - DEV
    rows, missed = dev_set(record)
    assert {r["qid"] for r in rows} == DEV and missed == []
    assert dev_uri(record).endswith("(dev split 0.25 by qid)")
    assert shared_questions(record, DEV) == 0
    assert shared_questions(record, [*DEV, "q-new", *sorted(set(QUESTIONS) - DEV)[:3]]) == 3


def test_separate_dev_graphs_leave_the_whole_training_folder_as_training_and_types_restrict_both(tmp_path):
    graphs = _graphs(tmp_path / "g", QUESTIONS)
    dev = _graphs(tmp_path / "dev", {"d1": "bridge", "d2": "comparison"})
    record = split_record(graphs, dev, 0.25, ("bridge",))
    assert record["dev_fraction"] is None and record["question_types"] == ["bridge"]
    assert training_questions(record) == {q for q, t in QUESTIONS.items() if t == "bridge"}
    rows, _ = dev_set(record)
    assert [r["qid"] for r in rows] == ["d1"] and dev_uri(record) == dev
    # the comparison questions were not trained on by a bridge model: no overlap counted for them
    assert shared_questions(record, ["q0", "q1", "q2"]) == 2
