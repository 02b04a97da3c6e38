"""Scoring runs that meet, against the real services (MLflow server, S3 endpoint, the Ray cluster): a second
run of a model version being scored is refused in one line or waits its turn, and no row is lost or
doubled; a publish that failed midway is repaired by the next run, whatever its date."""

from __future__ import annotations

import json
import threading
import time
import uuid

import pytest

from tests.integration.test_score import _champion, _score_overrides, _write_questions, scoring_world  # noqa: F401
from xh.config import load_config


def _read(output: str, name: str, run_date: str = "2026-11-23"):
    from xh.storage.partitions import partition_of, read_partition
    from xh.storage.store import Store

    return read_partition(partition_of(Store().at(output), run_date, name, 1))


def test_two_runs_into_one_partition_one_refused_in_one_line_one_waiting_and_no_row_lost_or_doubled(
    scoring_world,  # noqa: F811
    tiny_backbone,
    mlflow_server,
    s3_endpoint,
):
    from workflows import score
    from workflows.cli import USER_ERRORS
    from xh.storage.partitions import PartitionLocked, lock_file
    from xh.storage.store import Store

    name = _champion("xh-lock", tiny_backbone, scoring_world, mlflow_server, seed=3)
    questions = scoring_world["questions"]
    incoming = f"s3://xh-test/incoming-{uuid.uuid4().hex[:6]}"
    _write_questions(
        f"{incoming}/q.jsonl", [json.dumps({"qid": f"q-{i}", "question": questions[i]["question"]}) for i in range(8)]
    )
    output = f"s3://xh-test/predictions-{uuid.uuid4().hex[:6]}"
    overrides = _score_overrides(scoring_world, mlflow_server, name, incoming, output)
    lock = lock_file(Store().at(output), name, 1)

    results = {}
    first = threading.Thread(target=lambda: results.update(first=score.run(load_config(None, overrides))))
    first.start()
    try:
        deadline = time.monotonic() + 120
        while not lock.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert lock.exists()
        # the same input again while the first runs: refused in one line (exit 2), nothing written
        with pytest.raises(PartitionLocked) as refused:
            score.run(load_config(None, overrides))
        assert isinstance(refused.value, USER_ERRORS) and "\n" not in str(refused.value)
        assert "is being scored by run" in str(refused.value)
        # and with a wait: its turn comes after the first's publish
        again = score.run(load_config(None, [*overrides, "score.lock_wait_s=600"]))
    finally:
        first.join()
    assert results["first"]["predictions"] == again["predictions"] > 0
    assert again["replaced_rows"] == again["predictions"]  # the second run replaced the first's rows
    qids = _read(output, name)["qid"].to_pylist()
    assert len(qids) == len(set(qids)) == again["partition_rows"] == again["predictions"]
    assert not lock.exists()


def test_a_publish_that_failed_midway_is_finished_by_the_next_run_of_another_date(
    scoring_world,  # noqa: F811
    tiny_backbone,
    mlflow_server,
    s3_endpoint,
    monkeypatch,
):
    import pyarrow.dataset as pads

    import xh.storage.partitions as partitions
    from workflows import score

    name = _champion("xh-repair", tiny_backbone, scoring_world, mlflow_server, seed=3)
    questions = scoring_world["questions"]
    output = f"s3://xh-test/predictions-{uuid.uuid4().hex[:6]}"

    def run(run_date: str, qids: range) -> dict:
        incoming = f"s3://xh-test/incoming-{uuid.uuid4().hex[:6]}"
        _write_questions(
            f"{incoming}/q.jsonl", [json.dumps({"qid": f"q-{i}", "question": questions[i]["question"]}) for i in qids]
        )
        return score.run(
            load_config(None, _score_overrides(scoring_world, mlflow_server, name, incoming, output, run_date))
        )

    first = run("2026-11-23", range(6))

    def broken(*args):
        raise OSError("connection reset")

    with monkeypatch.context() as patch:  # the publish of a re-run fails after its commit, before its deletes
        patch.setattr(partitions, "_finish", broken)
        with pytest.raises(OSError, match="connection reset"):
            run("2026-11-23", range(3))
    partition = f"{output}/run_date=2026-11-23/model={name}/version=1"[len("s3://") :]
    listed = pads.dataset(partition, filesystem=s3_endpoint.pyarrow_fs(), format="parquet").count_rows()
    assert listed > first["predictions"]  # a folder listing sees rows and their replacements...
    assert _read(output, name).num_rows == first["predictions"]  # ...a reader of the manifest does not

    night = run("2026-11-24", range(6, 9))  # the next night: another date
    assert night["repaired_publishes"] == [
        f"the interrupted publish of run {night['repaired_publishes'][0].split()[5]} into s3://{partition} was finished"
    ]
    qids = _read(output, name)["qid"].to_pylist()
    assert sorted(qids) == sorted(set(qids)) and len(qids) == first["predictions"]
    assert pads.dataset(partition, filesystem=s3_endpoint.pyarrow_fs(), format="parquet").count_rows() == len(qids)
