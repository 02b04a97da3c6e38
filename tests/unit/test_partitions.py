"""Batch scoring's partitions (`xh.storage.partitions`), against real files, real processes and threads, and the S3
endpoint where the code path differs: rows added and replaced, the model version's lock (two processes),
a publish killed midway repaired by any later run (another date, another version), readers during a
publish, the scored-inputs index."""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from xh import schemas
from xh.storage.partitions import (
    INPUTS,
    MANIFEST,
    PartitionLocked,
    VersionLock,
    lock_file,
    partition_of,
    partition_rows,
    plan_merge,
    publish,
    read_partition,
    repair,
    scored_inputs,
    write_inputs_record,
)
from xh.storage.store import Location, Store

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[2]


def _predictions(qids: list[str], answer: str) -> pa.Table:
    rows = [
        {
            "qid": q,
            "question": f"{q}?",
            "answer": answer,
            "supporting_facts": [],
            "score": 0.5,
            "model_name": "m",
            "model_version": "1",
            "run_id": "r",
            "corpus_snapshot": "s",
            "scored_at": dt.datetime(2026, 11, 22, tzinfo=dt.UTC),
        }
        for q in qids
    ]
    return pa.Table.from_pylist(rows, schema=schemas.PREDICTIONS)


def _stage(staged: Location, qids: list[str], answer: str) -> Location:
    fs, path = staged.fs_path()
    fs.create_dir(path, recursive=True)
    table = _predictions(qids, answer)
    pq.write_table(table if qids else table.schema.empty_table(), f"{path}/part-0.parquet", filesystem=fs)
    return staged


def _run(root: Location, output: Location, run_date: str, token: str, qids, answer="a", files=None, **kw):
    """One run's publish into `run_date`'s partition of m v1 under the version's lock; returns the plan."""
    lock = VersionLock.acquire(output, "m", 1, f"run-{token}")
    try:
        staged = _stage(root.join(f"staged-{token}"), qids, answer)
        record = root.join(f"inputs-{token}.json")
        write_inputs_record(record, files or {}, mlflow_run_id=token)
        partition = partition_of(output, run_date, "m", 1)
        plan = plan_merge(staged, partition, root.join(f"kept-{token}"), token, inputs=record, **kw)
        publish(plan, partition, lock, inputs=files or {})
        return plan
    finally:
        lock.release()


def _rows(partition: Location) -> dict[str, str]:
    table = read_partition(partition)
    assert table.num_rows == len(set(table["qid"].to_pylist()))  # one row per qid
    return dict(zip(table["qid"].to_pylist(), table["answer"].to_pylist()))


def test_a_run_adds_its_rows_to_the_partition_replacing_only_the_qids_it_scored_again(tmp_path):
    root = Store().at(str(tmp_path))
    output = root.join("predictions")
    partition = partition_of(output, "2026-11-23", "m", 1)
    folder = Path(partition.uri)

    def run(n: int, qids: list[str], answer: str, replace: bool = False) -> dict:
        return _run(root, output, "2026-11-23", f"t{n}", qids, answer, replace=replace)

    assert run(1, ["a", "b", "c"], "first")["rows"] == 3
    assert run(2, ["d", "e"], "second")["replaced"] == 0  # another input: added
    assert _rows(partition) == {"a": "first", "b": "first", "c": "first", "d": "second", "e": "second"}
    plan = run(3, [], "none")  # nothing to score: nothing changes, no empty file added
    assert plan["rows"] == 0 and len(list(folder.glob("*.parquet"))) == 2
    assert run(4, ["b", "e"], "third")["replaced"] == 2  # re-scored qids replaced, the others kept
    assert _rows(partition) == {"a": "first", "b": "third", "c": "first", "d": "second", "e": "third"}
    # what the manifest names is exactly what is there: a plain reader of the folder agrees
    assert _rows(partition) == dict(zip(*pq.read_table(folder).select(["qid", "answer"]).to_pydict().values()))

    assert run(5, ["z"], "only", replace=True)["replaced"] == 5  # the explicit flag replaces all
    assert _rows(partition) == {"z": "only"}
    run(6, [], "none", replace=True)
    assert _rows(partition) == {} and len(list(folder.glob("*.parquet"))) == 1  # empty, still readable
    run(7, [], "none")
    assert len(list(folder.glob("*.parquet"))) == 1 and partition_rows(partition) == 0


def test_the_files_a_run_scored_are_found_in_one_index_over_every_run_date_of_the_model_version(tmp_path):
    root = Store().at(str(tmp_path))
    output = root.join("predictions")
    assert scored_inputs(output, "m", 1) == {}  # no output yet
    _run(root, output, "2026-11-23", "t1", ["a"], files={"in/a.jsonl": "sha256:1", "in/b.jsonl": "sha256:2"})
    _run(root, output, "2026-11-24", "t2", ["c"], files={"in/c.jsonl": "sha256:3"})
    assert scored_inputs(output, "m", 1) == {
        ("in/a.jsonl", "sha256:1"): "2026-11-23",
        ("in/b.jsonl", "sha256:2"): "2026-11-23",
        ("in/c.jsonl", "sha256:3"): "2026-11-24",
    }
    assert scored_inputs(output, "m", 2) == {} and scored_inputs(output, "other", 1) == {}
    # the partition keeps its own record too (named by the manifest), no Parquet file: readers see rows only
    partition = partition_of(output, "2026-11-23", "m", 1)
    assert f"{INPUTS}t1.json" in json.loads(Path(partition.uri, MANIFEST).read_text())["files"]
    assert pq.read_table(partition.uri)["qid"].to_pylist() == ["a"]

    # replace: the partition's earlier records go with its rows
    _run(root, output, "2026-11-23", "t3", ["b"], files={"in/b.jsonl": "sha256:2"}, replace=True)
    assert set(scored_inputs(output, "m", 1)) == {("in/b.jsonl", "sha256:2"), ("in/c.jsonl", "sha256:3")}


# --- the lock: two processes -----------------------------------------------------------------------

HOLDER = textwrap.dedent(
    """
    import sys, time
    from xh.storage.partitions import VersionLock
    from xh.storage.store import Store
    lock = VersionLock.acquire(Store().at(sys.argv[1]), "m", 1, sys.argv[2], ttl_s=float(sys.argv[3]))
    print("held", flush=True)
    time.sleep(float(sys.argv[4]))
    lock.release()
    print("released", flush=True)
    """
)


def _holder(output: Location, run_id: str, ttl_s: float = 300, hold_s: float = 60) -> subprocess.Popen:
    """Another process holding the version's lock for `hold_s` seconds (started once it holds it)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, output.uri, run_id, str(ttl_s), str(hold_s)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_run_of_a_locked_version_is_refused_in_one_line_or_waits_for_it(tmp_path):
    output = Store().at(str(tmp_path / "predictions"))
    holder = _holder(output, "first", hold_s=3)
    try:
        with pytest.raises(PartitionLocked) as refused:
            VersionLock.acquire(output, "m", 1, "second")
        message = str(refused.value)
        assert "\n" not in message and "run first" in message and f"pid {holder.pid}" in message
        assert "score.take_lock=first" in message
        # another version is not locked by it
        VersionLock.acquire(output, "m", 2, "other").release()
        waited = VersionLock.acquire(output, "m", 1, "second", wait_s=30)  # until the holder releases it
        assert holder.wait(timeout=30) == 0 and waited.record["run_id"] == "second"
        waited.release()
    finally:
        holder.kill()
    assert not Path(lock_file(output, "m", 1).uri).exists()


def test_the_lock_of_a_killed_run_is_taken_over_and_one_that_may_live_is_refused_until_told(tmp_path):
    output = Store().at(str(tmp_path / "predictions"))
    holder = _holder(output, "killed")
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    taken = VersionLock.acquire(output, "m", 1, "next")  # its process is gone on this host: dead
    assert taken.previous["run_id"] == "killed"
    taken.release()

    # a run on another host whose heartbeat is fresh may live: refused (one line) unless named
    file = lock_file(output, "m", 1)
    other = {"run_id": "elsewhere", "host": "pod-7", "pid": 1, "started_at": time.time(), "heartbeat_at": time.time()}
    file.write_bytes(json.dumps(other).encode())
    with pytest.raises(PartitionLocked, match=r"expires in \d+ s"):
        VersionLock.acquire(output, "m", 1, "next", ttl_s=300)
    assert json.loads(file.read_bytes())["run_id"] == "elsewhere"  # nothing changed
    VersionLock.acquire(output, "m", 1, "next", take="elsewhere").release()

    # a heartbeat older than the TTL is a dead run's
    file.write_bytes(json.dumps(other | {"heartbeat_at": time.time() - 10}).encode())
    VersionLock.acquire(output, "m", 1, "next", ttl_s=5).release()


def test_a_live_holder_keeps_its_lock_by_its_heartbeat_and_one_taken_over_publishes_nothing(tmp_path):
    output = Store().at(str(tmp_path / "predictions"))
    lock = VersionLock.acquire(output, "m", 1, "slow", ttl_s=1.0)
    time.sleep(1.5)  # past the TTL: only the heartbeat (every ttl/5) keeps it
    with pytest.raises(PartitionLocked):
        VersionLock.acquire(output, "m", 1, "eager", ttl_s=1.0)
    thief = VersionLock.acquire(output, "m", 1, "thief", take="slow")
    with pytest.raises(PartitionLocked, match="taken over by run thief"):
        lock.update(publishing={"partition": "x"})
    lock.release()  # not its lock any more: the thief's stays
    assert json.loads(thief.file.read_bytes())["run_id"] == "thief"
    thief.release()


# --- a publish killed midway, repaired by a later run of another date and version ----------------

KILLED = textwrap.dedent(
    """
    import os, sys
    import xh.storage.partitions as partitions
    from xh.storage.store import Store
    root, when = Store().at(sys.argv[1]), sys.argv[2]
    output = root.join("predictions")
    if when == "before_commit":
        partitions._write_atomic = lambda *a: os._exit(9)
    else:
        partitions._finish = lambda *a: os._exit(9)
    lock = partitions.VersionLock.acquire(output, "m", 1, "killed")
    staged = root.join("staged-killed")
    fs, path = staged.fs_path()
    fs.create_dir(path, recursive=True)
    import pyarrow as pa, pyarrow.parquet as pq
    from tests.unit.test_partitions import _predictions
    pq.write_table(_predictions(["b", "d"], "third"), path + "/part-0.parquet")
    record = root.join("inputs-killed.json")
    partitions.write_inputs_record(record, {"in/3.jsonl": "sha256:3"})
    partition = partitions.partition_of(output, "2026-11-23", "m", 1)
    plan = partitions.plan_merge(staged, partition, root.join("kept-killed"), "killed", inputs=record)
    partitions.publish(plan, partition, lock, inputs={"in/3.jsonl": "sha256:3"})
    """
)


@pytest.mark.parametrize("when", ["before_commit", "after_commit"])
def test_a_publish_killed_midway_is_finished_or_undone_by_a_later_run_of_another_date_and_version(tmp_path, when):
    root = Store().at(str(tmp_path))
    output = root.join("predictions")
    _run(root, output, "2026-11-23", "t1", ["a", "b"], "first", files={"in/1.jsonl": "sha256:1"})
    _run(root, output, "2026-11-23", "t2", ["c"], "second", files={"in/2.jsonl": "sha256:2"})
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    killed = subprocess.run([sys.executable, "-c", KILLED, root.uri, when], env=env, cwd=ROOT)
    assert killed.returncode == 9
    partition = partition_of(output, "2026-11-23", "m", 1)
    assert len(list(Path(partition.uri).glob("*.parquet"))) == 4  # a folder listing sees the half-done publish
    expected = {"a": "first", "b": "first", "c": "second"}
    if when == "after_commit":
        expected = {"a": "first", "b": "third", "c": "second", "d": "third"}
    assert _rows(partition) == expected  # a reader of the manifest does not

    # the next night's run: another date, another version of the model
    lock = VersionLock.acquire(output, "m", 2, "next-night")
    try:
        done = repair(output, lock)
    finally:
        lock.release()
    assert done == [
        f"the interrupted publish of run killed into {partition.uri} was "
        + ("finished" if when == "after_commit" else "undone")
    ]
    assert _rows(partition) == expected
    assert dict(zip(*pq.read_table(partition.uri).select(["qid", "answer"]).to_pydict().values())) == expected
    scored = {("in/1.jsonl", "sha256:1"), ("in/2.jsonl", "sha256:2")}
    assert set(scored_inputs(output, "m", 1)) == scored | (
        {("in/3.jsonl", "sha256:3")} if when == "after_commit" else set()
    )
    assert not Path(lock_file(output, "m", 1).uri).exists()  # the dead run's lock went with the repair
    assert repair(output) == []


# --- readers during a publish ----------------------------------------------------------------------


def _readers_see_old_or_new(output: Location, root: Location) -> int:
    """Publishes that replace every row (answer `n`, the same qids) while a thread reads: each read sees one
    generation whole. Returns the reads made."""
    qids = [f"q{i}" for i in range(6)]
    _run(root, output, "2026-11-23", "g0", qids, "0")
    partition = partition_of(output, "2026-11-23", "m", 1)
    seen, stop, errors = [], threading.Event(), []

    def read() -> None:
        while not stop.is_set():
            try:
                rows = _rows(partition)
                assert sorted(rows) == qids and len(set(rows.values())) == 1, rows
                seen.append(rows)
            except Exception as e:  # noqa: BLE001 (reported below)
                errors.append(e)
                return

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for n in range(1, 12):  # each publish moves its file in before it deletes the one it replaces
            _run(root, output, "2026-11-23", f"g{n}", qids, str(n))
    finally:
        stop.set()
        reader.join()
    assert not errors, errors[0]
    return len(seen)


def test_a_reader_during_publishes_sees_old_or_new_rows_never_both(tmp_path):
    root = Store().at(str(tmp_path))
    assert _readers_see_old_or_new(root.join("predictions"), root) > 5


def test_the_lock_and_the_manifest_on_s3(s3_endpoint):
    store = Store(s3=s3_endpoint)
    root = store.at(f"s3://xh-test/partitions-{uuid.uuid4().hex[:6]}")
    output = root.join("predictions")
    lock = VersionLock.acquire(output, "m", 1, "first")
    with pytest.raises(PartitionLocked, match="run first"):
        VersionLock.acquire(output, "m", 1, "second")
    lock.release()
    assert not lock_file(output, "m", 1).exists()
    _run(root, output, "2026-11-23", "t1", ["a"], files={"in/a.jsonl": "etag:1"})
    assert _rows(partition_of(output, "2026-11-23", "m", 1)) == {"a": "a"}
    assert scored_inputs(output, "m", 1) == {("in/a.jsonl", "etag:1"): "2026-11-23"}
    # a dead run's (expired) lock is taken over by a conditional write that only one taker wins
    file = lock_file(output, "m", 1)
    dead = {"run_id": "dead", "host": socket.gethostname() + "-x", "pid": 1, "heartbeat_at": time.time() - 60}
    file.write_bytes(json.dumps(dead).encode())
    winners, barrier = [], threading.Barrier(4)

    def take(n: int) -> None:
        barrier.wait()
        try:
            winners.append(VersionLock.acquire(output, "m", 1, f"taker-{n}", ttl_s=30))
        except PartitionLocked:
            pass

    threads = [threading.Thread(target=take, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(winners) == 1 and winners[0].previous["run_id"] == "dead"
    winners[0].release()
    assert _readers_see_old_or_new(store.at(f"{root.uri}/readers"), root) > 0


def test_a_run_that_fails_inside_its_publish_leaves_its_plan_for_the_next_run_at_once(tmp_path, monkeypatch):
    import xh.storage.partitions as partitions

    root = Store().at(str(tmp_path))
    output = root.join("predictions")
    _run(root, output, "2026-11-23", "t1", ["a", "b"], "first")

    def broken(*args):
        raise OSError("the store went away")

    with monkeypatch.context() as patch:
        patch.setattr(partitions, "_finish", broken)
        with pytest.raises(OSError, match="went away"):
            _run(root, output, "2026-11-23", "t2", ["b"], "second")
    assert json.loads(lock_file(output, "m", 1).read_bytes())["publishing"]["token"] == "t2"
    lock = VersionLock.acquire(output, "m", 1, "next")  # this process lives on: the lock says it failed
    try:
        assert repair(output, lock) == [
            f"the interrupted publish of run run-t2 into {partition_of(output, '2026-11-23', 'm', 1).uri} was finished"
        ]
    finally:
        lock.release()
    assert _rows(partition_of(output, "2026-11-23", "m", 1)) == {"a": "first", "b": "second"}


def test_an_output_inside_another_table_is_refused_in_one_line_before_anything_starts(tmp_path):
    from workflows.cli import USER_ERRORS
    from xh.config import load_config
    from xh.stages.score import prepare
    from xh.storage.tables import WIKI_TABLES, staged

    tables = Store().at(str(tmp_path / "tables"))
    with staged(tables, kind=WIKI_TABLES) as stage:
        stage.location.join("docs", "part-0.parquet").write_bytes(b"x")
    (tmp_path / "in.jsonl").write_text('{"qid": "1", "question": "Who?"}\n')
    for output in (tables.uri, f"{tables.uri}/predictions"):
        cfg = load_config(None, [f"score.input={tmp_path / 'in.jsonl'}", f"score.output={output}"])
        with pytest.raises(USER_ERRORS) as refused:
            prepare(cfg, Store())
        assert "\n" not in str(refused.value) and "wiki tables" in str(refused.value), refused.value
    assert sorted(p.name for p in Path(tables.uri).iterdir()) == ["_complete.json", "docs"]
