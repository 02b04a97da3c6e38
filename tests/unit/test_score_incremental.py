"""Incremental scoring's record: the input files a run scored are published into the partition with its
rows (`xh.partitions`), and gathered over every run date of a model version."""

from __future__ import annotations

import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from xh.partitions import (
    INPUTS,
    PLAN,
    partition_of,
    plan_merge,
    publish,
    recover,
    scored_inputs,
    write_inputs_record,
)
from xh.stages.score import dated_input
from xh.store import Location, Store

pytestmark = pytest.mark.unit


def _run(tmp_path, output: Location, run_date: str, token: str, qids: list[str], files: dict, **kw) -> dict:
    """One run's publish: its rows (qids) and its record of `files` into the date's partition of m v1."""
    staged = tmp_path / f"staged-{token}"
    staged.mkdir()
    pq.write_table(pa.table({"qid": qids}), staged / "part-0.parquet")
    record = output.store.at(str(tmp_path / f"inputs-{token}.json"))
    write_inputs_record(record, files, mlflow_run_id=token)
    partition = partition_of(output, run_date, "m", 1)
    kept = output.store.at(str(tmp_path / f"kept-{token}"))
    return plan_merge(output.store.at(str(staged)), partition, kept, token, inputs=record, **kw)


def test_the_files_a_published_run_scored_are_found_over_every_run_date_of_the_model_version(tmp_path):
    output = Store().at(str(tmp_path / "predictions"))
    assert scored_inputs(output, "m", 1) == {}  # no output yet
    plan = _run(tmp_path, output, "2026-11-23", "t1", ["a"], {"in/a.jsonl": "sha256:1", "in/b.jsonl": "sha256:2"})
    publish(plan, partition_of(output, "2026-11-23", "m", 1))
    plan = _run(tmp_path, output, "2026-11-24", "t2", ["c"], {"in/c.jsonl": "sha256:3"})
    publish(plan, partition_of(output, "2026-11-24", "m", 1))
    assert scored_inputs(output, "m", 1) == {
        ("in/a.jsonl", "sha256:1"): "2026-11-23",
        ("in/b.jsonl", "sha256:2"): "2026-11-23",
        ("in/c.jsonl", "sha256:3"): "2026-11-24",
    }
    assert scored_inputs(output, "m", 2) == {} and scored_inputs(output, "other", 1) == {}
    # the record is no Parquet file: readers of the partition see the rows only
    assert pq.read_table(partition_of(output, "2026-11-23", "m", 1).uri)["qid"].to_pylist() == ["a"]

    # replace: the partition's earlier records go with its rows
    plan = _run(tmp_path, output, "2026-11-23", "t3", ["b"], {"in/b.jsonl": "sha256:2"}, replace=True)
    publish(plan, partition_of(output, "2026-11-23", "m", 1))
    assert set(scored_inputs(output, "m", 1)) == {("in/b.jsonl", "sha256:2"), ("in/c.jsonl", "sha256:3")}


@pytest.mark.parametrize("moved", [0, 1, 2])
def test_the_record_is_in_the_partition_exactly_when_the_rows_are_after_a_killed_publish(tmp_path, moved):
    output = Store().at(str(tmp_path / "predictions"))
    partition = partition_of(output, "2026-11-23", "m", 1)
    publish(_run(tmp_path, output, "2026-11-23", "t1", ["a"], {"in/a.jsonl": "sha256:1"}), partition)
    plan = _run(tmp_path, output, "2026-11-23", "t2", ["b"], {"in/b.jsonl": "sha256:2"})
    assert [name for _, name in plan["add"]] == ["t2-part-0.parquet", f"{INPUTS}t2.json"]

    # what publish does, cut off after `moved` of its moves (2: all of them, the plan not yet deleted)
    with open(f"{partition.uri}/{PLAN}", "w") as out:
        json.dump({"add": [n for _, n in plan["add"]], "remove": plan["remove"]}, out)
    for source, name in plan["add"][:moved]:
        os.rename(source, f"{partition.uri}/{name}")
    assert recover(partition) == ("finished" if moved == 2 else "undone")
    expected = {("in/a.jsonl", "sha256:1")} | ({("in/b.jsonl", "sha256:2")} if moved == 2 else set())
    assert set(scored_inputs(output, "m", 1)) == expected
    assert sorted(pq.read_table(partition.uri)["qid"].to_pylist()) == (["a", "b"] if moved == 2 else ["a"])


def test_run_date_in_the_input_becomes_the_run_date():
    assert dated_input("s3://b/incoming/{run_date}/", "2026-11-24") == "s3://b/incoming/2026-11-24/"
    assert dated_input("s3://b/incoming/", "2026-11-24") == "s3://b/incoming/"
