"""Batch scoring's outputs: partitions (`<output>/run_date=D/model=NAME/version=V/`), the lock of a model
version, the record of the files a version has scored, and the repair of publishes a killed run left.

    lock = VersionLock.acquire(output, model, version, run_id)   # one run per model version; or PartitionLocked
    repair(output, lock)                                  # finish or undo every publish a dead run left
    plan = plan_merge(staged, partition, kept, token)     # which files go, which come (a Ray task's work)
    publish(plan, partition, lock, inputs={uri: digest})  # moves, the manifest flipped, the old files deleted
    lock.release()
    table = read_partition(partition)                     # the committed rows, never half of a publish
    scored = scored_inputs(output, model, version)        # one file read, however many dates were scored

**Rows.** A run adds its predictions to the partition: the rows of a qid it scored again are replaced,
every other row is kept, so that two inputs scored for the same date and model (two deliveries, or a
re-run of one) both stay, and an input with nothing to score changes nothing. `replace=True`
(`score.replace`) makes the run's predictions the whole partition. A partition file that holds a
re-scored qid is rewritten without it (under `kept`, then moved in); the other files are not touched.

**Readers never see a row and its replacement together.** The partition's `_manifest.json` names its
committed files. A publish moves its new files in under names of its own (the run's token), then
replaces the manifest in one write (an S3 PUT, a local rename), then deletes the files it replaced.
`read_partition` (and `partition_files`, `partition_rows`) read the files the manifest names, and read
it again when a later publish deleted one meanwhile: a reader gets the rows before or after a publish.
A plain folder listing (Spark, `pyarrow.dataset` on the folder) sees both for the moment between the moves
and the deletes, and the leftovers of a killed publish until it is repaired. A partition without a
manifest (none published yet) is its Parquet files.

**One run per model version at a time.** `VersionLock` is a lease, `<output>/_locks/NAME-vV.json` (run
id, host, pid, heartbeat), created and replaced only by conditional writes (S3 `If-None-Match` /
`If-Match`; a guarded compare-and-swap on a local filesystem), refreshed by a heartbeat thread every
`ttl_s / 5` seconds. A second run waits up to `wait_s` for it, then is refused in one line
(`PartitionLocked`, naming the holder). A holder is dead when its heartbeat is older than `ttl_s`, or
when it ran on this host and its process is gone; a dead holder's lock is taken over (and `take=RUN_ID`
takes the lock of that run now, for a run known dead whose heartbeat has not expired). Locking the
version (not one date) also keeps two incremental runs from scoring the same new file into two dates.

**A killed publish is repaired by any later run.** While it publishes, a run records its plan in its
lock (`publishing`): the partition, its token, the names it adds and removes, the inputs it scored.
`repair` lists `<output>/_locks/` (one listing, whatever the history) and, for every lock of a dead
run that holds a plan, whichever date and version: finishes the publish when the manifest names its
token (deletes what it replaced, records its inputs), or undoes it (deletes what it moved in).

**The scored-inputs record.** A publish also records the input files it scored (URI and content digest,
`write_inputs_record`) twice: in the partition (`_inputs-<token>.json`, named by its manifest: the
partition's own history) and in the version's index (`<output>/_scored/NAME-vV.json`, written under the
version's lock after the manifest). `scored_inputs` reads the index: one file, whatever the number of
past dates. `replace=True` forgets the replaced partition's entries with its rows.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import posixpath
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field

import pyarrow as pa

from xh.config import ConfigError
from xh.storage.store import Location
from xh.storage.tables import empty_folder, s3_client

MANIFEST = "_manifest.json"
INPUTS = "_inputs-"  # + token + ".json": the input files one run scored into the partition
LOCKS = "_locks"
SCORED = "_scored"


def partition_of(output: Location, run_date: str, model: str, version) -> Location:
    return output.join(f"run_date={run_date}", f"model={model}", f"version={version}")


def _files(folder: Location) -> list[str]:
    """The names of the files directly in a folder (none when it does not exist)."""
    from pyarrow import fs as pafs

    fs, path = folder.fs_path()
    infos = fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
    return sorted(posixpath.basename(i.path) for i in infos if i.type == pafs.FileType.File)


def _records(names: list[str]) -> list[str]:
    return [n for n in names if n.startswith(INPUTS) and n.endswith(".json")]


def _delete_file(folder: Location, name: str) -> None:
    fs, path = folder.fs_path()
    with contextlib.suppress(FileNotFoundError):
        fs.delete_file(f"{path}/{name}")


# --- conditional writes: the lock's one primitive ---------------------------------------------------


def _cas_read(file: Location) -> tuple[bytes | None, str | None]:
    """(content, token) of a small file, (None, None) when there is none; the token is what a conditional
    write compares (the S3 ETag; locally the content's SHA-256)."""
    if file.is_s3:
        bucket, key = _bucket_key(file)
        try:
            found = s3_client(file).get_object(Bucket=bucket, Key=key)
        except Exception as e:  # noqa: BLE001 (botocore's NoSuchKey is a generated class)
            if _status(e) == 404:
                return None, None
            raise
        return found["Body"].read(), found["ETag"]
    try:
        with open(file.fs_path()[1], "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None, None
    return data, hashlib.sha256(data).hexdigest()


def _cas_write(file: Location, data: bytes | None, token: str | None) -> bool:
    """Write `data` (None: delete) only if the file's token is still `token` (None: only if there is no
    file); False when another writer got there first."""
    if file.is_s3:
        bucket, key = _bucket_key(file)
        client = s3_client(file)
        condition = {"IfMatch": token} if token else {"IfNoneMatch": "*"}
        try:
            if data is None:
                client.delete_object(Bucket=bucket, Key=key, IfMatch=token)
            else:
                client.put_object(Bucket=bucket, Key=key, Body=data, **condition)
        except Exception as e:  # noqa: BLE001
            if _status(e) in (404, 409, 412):
                return False
            raise
        return True
    import fcntl

    path = file.fs_path()[1]
    os.makedirs(os.path.dirname(path), exist_ok=True)
    # a guard held only for the compare and the write; the kernel drops it if the process dies
    with open(os.path.join(os.path.dirname(path), "." + os.path.basename(path) + ".guard"), "a") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)
        if _cas_read(file)[1] != token:
            return False
        if data is None:
            os.remove(path)
        else:
            tmp = f"{path}.{uuid.uuid4().hex}.tmp"
            with open(tmp, "wb") as out:
                out.write(data)
            os.replace(tmp, path)
    return True


def _bucket_key(file: Location) -> tuple[str, str]:
    bucket, _, key = file.uri[len("s3://") :].partition("/")
    return bucket, key


def _status(error: Exception) -> int | None:
    return getattr(error, "response", {}).get("ResponseMetadata", {}).get("HTTPStatusCode")


def _write_atomic(file: Location, data: bytes) -> None:
    """Replace a file in one step for its readers: an S3 PUT, or a local rename over it."""
    if file.is_s3:
        file.write_bytes(data)
        return
    path = file.fs_path()[1]
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{os.path.dirname(path)}/.{os.path.basename(path)}.{uuid.uuid4().hex}.tmp"
    with open(tmp, "wb") as out:
        out.write(data)
    os.replace(tmp, path)


# --- the lock of a model version -------------------------------------------------------------------


class PartitionLocked(ConfigError):
    """Another scoring run holds the model version's lock (or took it over from this run)."""


def lock_file(output: Location, model: str, version) -> Location:
    return output.join(LOCKS, f"{model}-v{version}.json")


def _alive(holder: dict, ttl_s: float) -> bool:
    """Whether a lock's holder may still run: its heartbeat is recent and, on this host, its process is there."""
    if time.time() - holder.get("heartbeat_at", 0) > ttl_s:
        return False
    if holder.get("host") == socket.gethostname():
        try:
            os.kill(int(holder["pid"]), 0)
        except ProcessLookupError:
            return False
        except (PermissionError, KeyError, ValueError):
            pass
    return True


def _describe(holder: dict) -> str:
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(holder.get("started_at", 0)))
    beat = time.time() - holder.get("heartbeat_at", 0)
    return f"run {holder.get('run_id')} (host {holder.get('host')}, pid {holder.get('pid')}, since {started}, last heartbeat {beat:.0f} s ago)"


@dataclass
class VersionLock:
    """This run's lease on a model version's outputs under one predictions root (see the module docstring)."""

    output: Location
    file: Location
    record: dict
    token: str | None
    ttl_s: float
    previous: dict | None = None  # the dead holder's record when this lock was taken over
    lost: str | None = None
    _mutex: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _stop: threading.Event = field(default_factory=threading.Event, repr=False)

    @classmethod
    def acquire(
        cls,
        output: Location,
        model: str,
        version,
        run_id: str,
        *,
        wait_s: float = 0.0,
        ttl_s: float = 300.0,
        take: str | None = None,
    ) -> VersionLock:
        """The lock, or `PartitionLocked` (one line) once `wait_s` has passed with a live holder."""
        file = lock_file(output, model, version)
        deadline = time.monotonic() + wait_s
        while True:
            lock = cls._try(output, file, run_id, ttl_s, take)
            if isinstance(lock, VersionLock):
                lock._start_heartbeat()
                return lock
            if lock is not None and time.monotonic() >= deadline:
                expires = max(0.0, lock.get("heartbeat_at", 0) + ttl_s - time.time())
                raise PartitionLocked(
                    f"{model} v{version} under {output.uri} is being scored by {_describe(lock)}: "
                    f"try again later; if that run is dead its lock expires in {expires:.0f} s, or take it over "
                    f"now with --set score.take_lock={lock.get('run_id')}"
                )
            time.sleep(0.2 if lock is None else min(1.0, max(0.05, deadline - time.monotonic())))

    @classmethod
    def _try(
        cls, output: Location, file: Location, run_id: str, ttl_s: float, take: str | None
    ) -> VersionLock | dict | None:
        """Our lock; or the live holder's record; or None (the lock changed hands meanwhile: try again)."""
        now = time.time()
        mine = {"run_id": run_id, "host": socket.gethostname(), "pid": os.getpid(), "started_at": now}
        mine |= {"heartbeat_at": now, "ttl_s": ttl_s, "publishing": None}
        data, token = _cas_read(file)
        holder = json.loads(data) if data is not None else None
        if holder is not None and _alive(holder, ttl_s) and holder.get("run_id") != take:
            return holder
        if not _cas_write(file, json.dumps(mine).encode(), token):
            return None
        return cls(output, file, mine, _cas_read(file)[1], ttl_s, previous=holder)

    def update(self, **changes) -> None:
        """Record `changes` in the lock (a conditional write); `PartitionLocked` when it was taken over."""
        with self._mutex:
            if self.lost:
                raise PartitionLocked(self.lost)
            record = self.record | {"heartbeat_at": time.time()} | changes
            if not _cas_write(self.file, json.dumps(record).encode(), self.token):
                data, _ = _cas_read(self.file)
                other = json.loads(data) if data else {}
                self.lost = (
                    f"the lock of {self.file.uri} was taken over by {_describe(other)} (this run's heartbeat was "
                    f"older than {self.ttl_s:.0f} s): nothing more published by run {self.record['run_id']}"
                )
                raise PartitionLocked(self.lost)
            self.record, self.token = record, _cas_read(self.file)[1]

    def _start_heartbeat(self) -> None:
        def beat() -> None:
            while not self._stop.wait(self.ttl_s / 5):
                with contextlib.suppress(PartitionLocked):
                    self.update()

        threading.Thread(target=beat, name="xh-lock-heartbeat", daemon=True).start()

    def release(self) -> None:
        """Delete the lock (only while it is still this run's). A run that failed inside a publish leaves
        it with its plan, marked dead at once, for `repair`."""
        self._stop.set()
        if not self.lost and self.record.get("publishing"):
            with contextlib.suppress(PartitionLocked):
                self.update(heartbeat_at=0, failed=True)
        with self._mutex:
            if not self.lost and not self.record.get("failed"):
                _cas_write(self.file, None, self.token)
            self.lost = self.lost or "released"


# --- publishing ------------------------------------------------------------------------------------


def read_manifest(partition: Location) -> dict | None:
    data, _ = _cas_read(partition.join(MANIFEST))
    return json.loads(data) if data is not None else None


def _committed(partition: Location) -> list[str]:
    """The names of the partition's committed files (Parquet and inputs records)."""
    manifest = read_manifest(partition)
    if manifest is not None:
        return manifest["files"]
    return [n for n in _files(partition) if n.endswith(".parquet") or n in _records([n])]


def plan_merge(
    staged: Location,
    partition: Location,
    kept: Location,
    token: str,
    replace: bool = False,
    inputs: Location | None = None,
) -> dict:
    """What publishing the staged predictions (a folder of PREDICTIONS Parquet files) into `partition`
    takes: {"add": [[staged file URI, name in the partition], ...], "remove": [names], "rows": this run's
    rows, "replaced": rows of re-scored qids removed}. Partition files holding a qid of this run are
    rewritten without those rows into `kept` (an empty folder is made there); `token` makes this run's
    file names unique in the partition. `inputs`: the run's record of its input files
    (`write_inputs_record`), published with the rows."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    fs, kept_path = empty_folder(kept)
    _, part_path = partition.fs_path()
    new = staged.files(suffix=".parquet")
    new_rows = {f: pq.read_metadata(staged.store.at(f).fs_path()[1], filesystem=fs).num_rows for f in new}
    committed = _committed(partition)
    old = [n for n in committed if n.endswith(".parquet")]
    add, remove, replaced = [], [], 0
    if replace:
        remove = old
        replaced = sum(pq.read_metadata(f"{part_path}/{n}", filesystem=fs).num_rows for n in old)
    else:
        qids = _qids([staged.store.at(f) for f in new])
        for name in old:
            table = pq.read_table(f"{part_path}/{name}", filesystem=fs)
            hit = pc.is_in(table["qid"], value_set=qids)
            if not pc.any(hit).as_py():
                continue
            keep = table.filter(pc.invert(hit))
            remove.append(name)
            replaced += table.num_rows - keep.num_rows
            if keep.num_rows:
                target = f"kept-{token}-{name}"
                pq.write_table(keep, f"{kept_path}/{target}", filesystem=fs)
                add.append([kept.join(target).uri, target])
    # an empty result adds a file only where the partition would otherwise have none (readers want one)
    empty_only = len(old) - len(remove) + len(add) == 0 and not any(new_rows.values())
    for f in new:
        if new_rows[f] or (empty_only and f == new[0]):
            add.append([f, f"{token}-{posixpath.basename(f)}"])
    if inputs is not None:
        if replace:
            remove += _records(committed)
        add.append([inputs.uri, f"{INPUTS}{token}.json"])
    rows = sum(new_rows.values())
    return {"add": add, "remove": remove, "rows": rows, "replaced": replaced, "token": token, "replace": replace}


def _qids(files: list[Location]) -> pa.Array:
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    columns = []
    for f in files:
        fs, path = f.fs_path()
        columns.append(pq.read_table(path, columns=["qid"], filesystem=fs)["qid"])
    return pc.unique(pa.chunked_array(columns, type=pa.string()))


def publish(plan: dict, partition: Location, lock: VersionLock, inputs: dict[str, str] | None = None, **about) -> int:
    """Publish `plan` (`plan_merge`) into the partition under the version's `lock`: the plan recorded in the
    lock, the new files moved in, the manifest replaced (the commit), the replaced files deleted, the
    `inputs` ({URI: digest}) added to the version's index, the plan cleared. Returns the files added."""
    fs, path = partition.fs_path()
    fs.create_dir(path, recursive=True)
    names = [name for _, name in plan["add"]]
    files = [n for n in _committed(partition) if n not in set(plan["remove"])] + names
    manifest = {"files": files, "publish": plan["token"], "published_at": time.time(), **about}
    run_date, model, version = (p.split("=", 1)[1] for p in partition.uri.rstrip("/").split("/")[-3:])
    lock.update(
        publishing={
            "partition": partition.uri,
            "index": scored_index(lock.output, model, version).uri,
            "run_date": run_date,
            "token": plan["token"],
            "add": names,
            "remove": plan["remove"],
            "inputs": inputs or {},
            "replace": plan.get("replace", False),
        }
    )
    for source, name in plan["add"]:
        fs.move(partition.store.at(source).fs_path()[1], f"{path}/{name}")
    lock.update()  # still ours after the moves: the commit is next
    _write_atomic(partition.join(MANIFEST), json.dumps(manifest).encode())
    _finish(partition, lock.record["publishing"])
    lock.update(publishing=None)
    return len(plan["add"])


def _finish(partition: Location, publishing: dict) -> None:
    """What follows a publish's commit (and what `repair` redoes): the replaced files deleted, the inputs indexed."""
    for name in publishing["remove"]:
        _delete_file(partition, name)
    index = partition.store.at(publishing["index"])
    data, _ = _cas_read(index)
    entries = json.loads(data)["files"] if data else []
    if publishing.get("replace"):
        entries = [e for e in entries if e["run_date"] != publishing["run_date"]]
    done = {(e["uri"], e["digest"]) for e in entries}
    entries += [
        {"uri": u, "digest": d, "run_date": publishing["run_date"], "token": publishing["token"]}
        for u, d in sorted(publishing["inputs"].items())
        if (u, d) not in done
    ]
    _write_atomic(index, json.dumps({"files": entries}).encode())


def repair(output: Location, lock: VersionLock | None = None, ttl_s: float = 300.0) -> list[str]:
    """Finish or undo every publish a dead run left under `output` (any date, any version): first the one
    in `lock` (this run's, taken over from a dead run), then those in other dead runs' locks, each taken
    over for the repair and released. Returns lines saying what was done."""
    done = []
    if lock is not None and (lock.previous or {}).get("publishing"):
        done.append(_repair_one(lock, lock.previous))
        lock.update(publishing=None)
    for name in _files(output.join(LOCKS)):
        file = output.join(LOCKS, name)
        if not name.endswith(".json") or (lock is not None and file.uri == lock.file.uri):
            continue
        data, _ = _cas_read(file)
        holder = json.loads(data) if data else None
        if not holder or not holder.get("publishing") or _alive(holder, ttl_s):
            continue
        model, _, version = name[: -len(".json")].rpartition("-v")
        try:
            other = VersionLock.acquire(output, model, version, f"repair-{uuid.uuid4().hex[:8]}", ttl_s=ttl_s)
        except PartitionLocked:  # taken by a live run meanwhile: that run repairs it
            continue
        try:
            if (other.previous or {}).get("publishing"):
                done.append(_repair_one(other, other.previous))
        finally:
            other.release()
    return done


def _repair_one(lock: VersionLock, dead: dict) -> str:
    publishing = dead["publishing"]
    partition = lock.file.store.at(publishing["partition"])
    manifest = read_manifest(partition)
    if manifest is not None and manifest.get("publish") == publishing["token"]:
        _finish(partition, publishing)
        outcome = "finished"
    else:
        committed = set(_committed(partition))
        for name in publishing["add"]:
            if name not in committed:
                _delete_file(partition, name)
        outcome = "undone"
    return f"the interrupted publish of run {dead.get('run_id')} into {partition.uri} was {outcome}"


# --- readers ---------------------------------------------------------------------------------------


def partition_files(partition: Location) -> list[Location]:
    """The partition's committed Parquet files (those its manifest names)."""
    return [partition.join(n) for n in _committed(partition) if n.endswith(".parquet")]


def read_partition(partition: Location, columns: list[str] | None = None, attempts: int = 5) -> pa.Table:
    """The partition's committed rows: those before a publish or those after it, never both."""
    import pyarrow.dataset as pads

    from xh import schemas

    for _ in range(attempts):
        files = partition_files(partition)
        if not files:
            return schemas.PREDICTIONS.empty_table().select(columns or schemas.PREDICTIONS.names)
        fs = files[0].fs_path()[0]
        try:
            # the table's schema, not the first file's: a column added since (null in older files) is kept
            paths = [f.fs_path()[1] for f in files]
            return pads.dataset(paths, schema=schemas.PREDICTIONS, filesystem=fs, format="parquet").to_table(
                columns=columns
            )
        except OSError:  # a later publish deleted a file it replaced (S3: NO_SUCH_KEY): its manifest is newer
            if [f.uri for f in partition_files(partition)] == [f.uri for f in files]:
                raise
    raise OSError(f"{partition.uri} kept changing while it was read ({attempts} attempts)")


def partition_rows(partition: Location) -> int:
    """The committed rows (from the Parquet footers), 0 when there is no partition."""
    import pyarrow.parquet as pq

    total = 0
    for f in partition_files(partition):
        fs, path = f.fs_path()
        with contextlib.suppress(FileNotFoundError):
            total += pq.read_metadata(path, filesystem=fs).num_rows
    return total


# --- the scored-inputs record ----------------------------------------------------------------------


def write_inputs_record(record: Location, files: dict[str, str], **about) -> None:
    """The input files a run scored ({URI: content digest}) and `about` it, as the JSON file `record`."""
    entries = [{"uri": u, "digest": d} for u, d in sorted(files.items())]
    record.write_bytes(json.dumps({**about, "files": entries}).encode())


def scored_index(output: Location, model: str, version) -> Location:
    return output.join(SCORED, f"{model}-v{version}.json")


def scored_inputs(output: Location, model: str, version) -> dict[tuple[str, str], str]:
    """(URI, content digest) -> run date of every input file a published run scored with this model
    version under `output` (none when there are none): one read of the version's index."""
    data, _ = _cas_read(scored_index(output, model, version))
    return {(e["uri"], e["digest"]): e["run_date"] for e in (json.loads(data)["files"] if data else [])}


def scored_versions(output: Location, model: str) -> list[str]:
    """The versions of `model` that have scored into `output` (one listing of the index folder)."""
    prefix = f"{model}-v"
    found = [n[len(prefix) : -len(".json")] for n in _files(output.join(SCORED)) if n.startswith(prefix)]
    return [v for v in found if v.isdigit()]  # not another model whose name starts with this one's
