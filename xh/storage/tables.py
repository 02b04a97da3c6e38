"""Tables handed on whole or not at all (staged writes, a completion marker, a reader check), and a batch
job's resumable stages on the same marker.

    table = store.at("runs/demo/graphs/hotpot")      # a Location (xh.storage.store); `table.staged(...)` says the same
    with staged(table, kind=GRAPHS, stage="graphs", inputs={...}) as stage:
        write_everything_under(stage.location)  # a hidden sibling: <parent>/.hotpot.staging
        stage.rows = 500
    # here: the folder holds the new table and `_complete.json`; on an exception the previous table is untouched

    require_complete(table)                   # a reader: one-line error unless the marker is there

A table folder is *complete* when it holds `_complete.json` (its kind, the stage that wrote it, rows,
written_at, an input fingerprint), the last file written. Writers build the whole folder in a staging
sibling, write the marker there, and swap it into place:

- local: rename the old folder aside (`.<name>.old`), rename the staging folder into place, delete the
  old one — a run that fails or is killed while building leaves the previous table and its marker intact
  (killed between the two renames: the next run puts the old folder back first);
- s3 (no rename): the staging prefix is complete first; then the old marker is deleted (from that moment
  readers refuse the folder instead of reading a mix), the old objects deleted, the staged objects
  copied in (server-side copies) and the marker copied last. Only a failure inside that short swap
  leaves the folder without a marker: refused, never read half-written.

Outputs only ever delete what the project wrote, and only a table of their own kind: `staged` refuses
(`ForeignFolderError`, one line, before any work) to replace a non-empty folder without the marker, a
table of another kind (`graphs.output` pointed at the wiki tables), a folder inside another table, or a
`.<name>.staging` / `.<name>.old` sibling that carries no proof of being this kind's own: a staging
folder holds `_staging.json` (its kind and target) from the moment it is created, an old one the marker.
A marker written before markers named kinds counts as the kind its folder's layout shows, or none.

A batch job (scoring) writes each of its stages whole under a staging folder before the next starts, so a
failed run re-run resumes after its last finished stage:

    stages = Stages(store.at(staging_uri), fingerprint=fingerprint(settings, [store.at(f) for f in inputs]))
    parsed = stages.run("parse", lambda: files.map_batches(parse))   # a Ray Dataset -> <staging>/parse/*.parquet
    graphs = stages.run("graphs", lambda: build(usable(parsed)))   # each a Location; `usable`: the caller's
    stages.resumed, stages.seconds                 # the stages a re-run skipped; seconds per stage
    write_quarantine([parsed, graphs], store.at(quarantine_uri))   # {reason: count}

A stage is finished when its folder holds `_complete.json` (kind `batch stage`), written after its last
Parquet file. The staging folder's `_staging.json` (kind `batch staging`, written first) holds the
fingerprint of the run's input files and settings: staging of another fingerprint is cleared, never
resumed, and a folder without one is refused. A stage's rows that could not be used carry the QUARANTINE
columns (`with_quarantine`), `reason` not null; the next stage reads only the others, and
`write_quarantine` gathers them at the end.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import posixpath
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.fs as pafs

from xh import schemas
from xh.config import ConfigError
from xh.storage.uris import is_s3, list_paths, resolve


class Place(Protocol):
    """What this protocol needs of a place: a `xh.storage.store.Location` (the one kind there is), named by
    what it offers rather than imported, since the store builds on this module."""

    uri: str
    store: Any  # its `at(uri)`: another place of the same store

    @property
    def is_s3(self) -> bool: ...
    @property
    def s3(self) -> Any: ...
    def join(self, *parts: str) -> Place: ...
    def exists(self) -> bool: ...
    def fs_path(self) -> tuple[pafs.FileSystem, str]: ...
    def files(self, suffix: str = "") -> list[str]: ...
    def open_input(self) -> Any: ...
    def read_bytes(self) -> bytes: ...
    def write_bytes(self, data: bytes) -> None: ...
    def read_dataset(self, **read_args) -> Any: ...


_log = logging.getLogger("xh.stages").info

MARKER = "_complete.json"
OWNER = "_staging.json"  # the first file of a staging folder: which kind and target it is being built for

# The kinds of table the stages write; a marker names one, and a stage replaces only its own kind.
WIKI_TABLES = "wiki tables"
RETRIEVAL = "retrieval output"
BM25_INDEX = "bm25 index"
GRAPHS = "graphs"
GRAPHS_QUARANTINE = "graphs quarantine"
BATCH_STAGING = "batch staging"  # a batch job's staging folder (its `_staging.json` holds the fingerprint)
BATCH_STAGE = "batch stage"  # one finished stage inside it


# The kinds a reader can check by the name it gives a table (`require_complete(folder, "wiki tables")`).
KINDS = (WIKI_TABLES, RETRIEVAL, BM25_INDEX, GRAPHS, GRAPHS_QUARANTINE)


class IncompleteTableError(FileNotFoundError):
    """A table folder without its completion marker (a run that failed, was killed, or never ran)."""


class WrongKindError(ConfigError):
    """A reader given a complete table of another kind (the graphs where the wiki tables belong)."""


class ForeignFolderError(ConfigError):
    """An output folder the stage may not replace: files the project did not write, or another kind of table."""


def fingerprint(inputs: object, files: Sequence[Place] = (), digests: dict[str, str] | None = None) -> str:
    """A short stable hash of what a table or a run's staging was built from: `inputs` (JSON-able: paths,
    settings, upstream markers) and, for each of `files`, its URI and content (`content_digest`, or
    `digests[uri]` where the caller has it already)."""
    if files:
        digests = digests or {}
        contents = [[f.uri, digests.get(f.uri) or content_digest(f)] for f in files]
        inputs = {"inputs": inputs, "files": contents}
    return hashlib.sha256(json.dumps(inputs, sort_keys=True, default=str).encode()).hexdigest()[:16]


def content_digest(file: Place) -> str:
    """What a file holds: the SHA-256 of a local file's bytes, or an S3 object's ETag (the store's
    digest of the bytes, read without downloading them). Size and modification time are not enough:
    a file replaced by one of the same size, its time set back, would resume the old file's stages."""
    if file.is_s3:
        return "etag:" + _etag(file)
    digest = hashlib.sha256()
    with file.open_input() as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return "sha256:" + digest.hexdigest()


def _etag(file: Place) -> str:
    bucket, _, key = file.uri[len("s3://") :].partition("/")
    return s3_client(file).head_object(Bucket=bucket, Key=key)["ETag"]


def s3_client(file: Place):
    """A boto3 S3 client with `file`'s store settings (for what pyarrow's filesystem cannot: ETags,
    conditional writes)."""
    import boto3

    settings = file.s3
    settings.require_endpoint(file.uri)
    return boto3.client(
        "s3",
        endpoint_url=settings.endpoint_url,
        region_name=settings.region,
        aws_access_key_id=settings.access_key_id,
        aws_secret_access_key=settings.secret_access_key,
        aws_session_token=settings.session_token,
    )


def _read_json(file: Place) -> dict | None:
    try:
        found = json.loads(file.read_bytes())
    except (FileNotFoundError, OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def read_marker(folder: Place) -> dict | None:
    """The folder's `_complete.json`, or None when it has none."""
    return _read_json(folder.join(MARKER))


def require_complete(folder: Place, what: str = "table", hint: str = "", kind: str | None = None) -> dict:
    """The folder's marker; `IncompleteTableError` (one line) when the folder is missing or has none, and
    `WrongKindError` (one line) when it is a table of another kind than `kind` (default: `what`, when that
    names a kind). A marker that names no kind passes if its layout shows none either (`_legacy_kind`)."""
    if not folder.exists():
        raise IncompleteTableError(f"no {what} at {folder.uri}{hint}")
    marker = read_marker(folder)
    if marker is None:
        raise IncompleteTableError(
            f"{what} at {folder.uri} is incomplete (no {MARKER}: a run failed or was interrupted){hint}"
        )
    kind = kind or (what if what in KINDS else None)
    found = marker.get("kind") or _legacy_kind(folder)
    if kind is not None and found is not None and found != kind:
        raise WrongKindError(f"{what} at {folder.uri} holds {_written_by(marker)}, not the {kind}{hint}")
    return marker


def _written_by(marker: dict) -> str:
    kind = marker.get("kind")
    if not kind:
        return f"a table whose {MARKER} names no kind (written by an older version)"
    return f"the {kind}" + (f" of `{marker['stage']}`" if marker.get("stage") else "")


def _parents(uri: str) -> list[str]:
    """The folders above `uri`, nearest first (up to the bucket, or the filesystem root)."""
    stripped = uri.rstrip("/")
    if is_s3(stripped):
        parts = stripped[len("s3://") :].split("/")
        return ["s3://" + "/".join(parts[:n]) for n in range(len(parts) - 1, 0, -1)]
    path, found = resolve(stripped)[1], []
    while os.path.dirname(path) != path:
        path = os.path.dirname(path)
        found.append(path)
    return found


def _inside_table(folder: Place, what: str = "output") -> None:
    for parent in _parents(folder.uri):
        marker = read_marker(_at(folder, parent))
        if marker is not None:
            raise ForeignFolderError(
                f"{what} {folder.uri} lies inside {_written_by(marker)} at {parent}: refusing to write into it; "
                "choose a folder outside it"
            )


def check_outside_tables(folder: Place, what: str = "output") -> None:
    """Raise `ForeignFolderError` (one line) when `folder` is a table or lies inside one: a root that holds
    folders of its own (batch scoring's predictions) would be deleted with the table, or read as its rows."""
    _inside_table(folder, what)
    marker = read_marker(folder)
    if marker is not None:
        raise ForeignFolderError(
            f"{what} {folder.uri} holds {_written_by(marker)}: refusing to write into it; choose a folder outside it"
        )


def check_replaceable(folder: Place, kind: str | None = None) -> None:
    """Raise `ForeignFolderError` unless `folder` is missing, empty, or a table of `kind` the project marked,
    and lies inside no other table."""
    uri = folder.uri
    fs, path = folder.fs_path()
    info = fs.get_file_info(path)
    _inside_table(folder)
    if info.type == pafs.FileType.NotFound:
        return
    if info.type == pafs.FileType.File:
        raise ForeignFolderError(f"output {uri} is a file, not a table folder: refusing to replace it")
    marker = read_marker(folder)
    if marker is None:
        if list_paths(fs, path):
            raise ForeignFolderError(
                f"output {uri} holds files this project did not write (no {MARKER}): refusing to delete them; "
                "choose an empty or new folder"
            )
        return
    if kind is not None and (marker.get("kind") or _legacy_kind(folder)) != kind:
        raise ForeignFolderError(
            f"output {uri} holds {_written_by(marker)}, not the {kind}: refusing to replace it; "
            "choose another folder (or delete that one yourself)"
        )


def _legacy_kind(folder: Place) -> str | None:
    """The kind of a table whose marker names none (written before markers named kinds), from its layout;
    None when the layout says nothing: such a folder is then refused, not guessed at."""
    fs, path = folder.fs_path()
    names = {info.base_name for info in fs.get_file_info(pafs.FileSelector(path))} - {MARKER}
    if {"docs", "links", "redirects", "anchors"} <= names:
        return WIKI_TABLES
    if {"questions", "quarantine"} <= names:
        return RETRIEVAL
    if "_summary.json" in names:
        return GRAPHS
    if names and all(name.startswith("part-") and name.endswith(".parquet") for name in names):
        return GRAPHS_QUARANTINE
    return None


def _at(folder: Place, uri: str) -> Place:
    """Another place of `folder`'s store."""
    return folder.store.at(uri)


def _sibling(folder: Place, suffix: str) -> Place:
    stripped = folder.uri.rstrip("/")
    if is_s3(stripped):
        parent, name = posixpath.split(stripped[len("s3://") :])
        return _at(folder, "s3://" + posixpath.join(parent, f".{name}.{suffix}"))
    parent, name = os.path.split(resolve(stripped)[1])
    return _at(folder, os.path.join(parent, f".{name}.{suffix}"))


def _where(uri: str) -> str:
    """`uri` as a staging folder's `_staging.json` records it: the same folder whatever the working directory."""
    return uri.rstrip("/") if is_s3(uri) else resolve(uri)[1]


@dataclass
class Stage:
    """Where a run writes its table before it is published (`location`, a Location of the target's store);
    set `rows` (and `detail`) before the end."""

    location: Place
    target: Place
    kind: str
    stage: str | None = None
    inputs: object = None
    rows: int | None = None
    detail: dict = field(default_factory=dict)

    @property
    def uri(self) -> str:
        return self.location.uri


def _delete(folder: Place) -> None:
    fs, path = folder.fs_path()
    if fs.get_file_info(path).type != pafs.FileType.NotFound:
        fs.delete_dir(path)


def _ours(folder: Place, target: Place, kind: str) -> bool:
    """Whether a `.<name>.staging` / `.<name>.old` sibling may be deleted: empty, or carrying this kind's
    own proof (a staging folder's `_staging.json` naming `target`, or a marker of `kind`)."""
    fs, path = folder.fs_path()
    if fs.get_file_info(path).type == pafs.FileType.File:
        return False
    owner = _read_json(folder.join(OWNER))
    if owner is not None and owner.get("kind") == kind and owner.get("target") == _where(target.uri):
        return True
    marker = read_marker(folder)
    if marker is not None:
        return marker.get("kind") == kind
    return not list_paths(fs, path)


def _clear_sibling(folder: Place, target: Place, kind: str) -> None:
    """Delete a leftover sibling of a killed run, but only one that is provably this kind's own."""
    if not folder.exists():
        return
    if not _ours(folder, target, kind):
        raise ForeignFolderError(
            f"{folder.uri} is in the way of the {kind} at {target.uri} and holds no {OWNER} or {MARKER} of the "
            f"{kind}: refusing to delete it; move it away"
        )
    _delete(folder)


@contextmanager
def staged(folder: Place, *, kind: str, stage: str | None = None, inputs: object = None) -> Iterator[Stage]:
    """Build a table of `kind` in a staging sibling of `folder`; on success mark it complete and swap it into place.

    Refuses up front (before any work) to replace a folder the project did not write, a table of
    another kind, or a sibling it cannot prove its own. On any exception the staging folder is removed
    and the previous table at `folder` is left as it was.
    """
    if not folder.is_s3:
        _recover_local(folder, kind)
    check_replaceable(folder, kind)
    staging = Stage(location=_sibling(folder, "staging"), target=folder, kind=kind, stage=stage, inputs=inputs)
    _clear_sibling(staging.location, folder, kind)  # a leftover of a killed run
    if not folder.is_s3:
        _clear_sibling(_sibling(folder, "old"), folder, kind)
    # the proof that this folder is ours, first: a later run deletes it only with this in it
    staging.location.join(OWNER).write_bytes(
        json.dumps({"kind": kind, "stage": stage, "target": _where(folder.uri)}).encode()
    )
    try:
        yield staging
    except BaseException:
        try:
            _delete(staging.location)
        finally:
            raise
    publish(staging)


def _recover_local(folder: Place, kind: str) -> None:
    """A run killed between the two renames of a swap left the previous table aside: put it back."""
    target, old = resolve(folder.uri)[1], _sibling(folder, "old")
    if not os.path.exists(target) and (read_marker(old) or {}).get("kind") == kind:
        os.rename(old.uri, target)


def _write_marker(folder: Place, kind: str, stage: str | None, rows: int | None, **more) -> dict:
    """The folder's `_complete.json`: written last, once everything else in the folder is."""
    marker = {
        "kind": kind,
        **({"stage": stage} if stage else {}),
        "rows": rows,
        "written_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **more,
    }
    folder.join(MARKER).write_bytes(json.dumps(marker, indent=1, default=str).encode())
    return marker


def publish(stage: Stage) -> dict:
    """Write the marker into the staging folder (its last file), then swap the folder into place."""
    detail = {"detail": stage.detail} if stage.detail else {}
    marker = _write_marker(
        stage.location, stage.kind, stage.stage, stage.rows, inputs=fingerprint(stage.inputs), **detail
    )
    check_replaceable(stage.target, stage.kind)  # again: someone may have written there meanwhile
    if stage.target.is_s3:
        _swap_s3(stage.location, stage.target)
    else:
        # the marker of our kind is proof enough from here on (see `_ours`)
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(resolve(stage.uri)[1], OWNER))
        _swap_local(stage.location, stage.target, stage.kind)
    return marker


def _swap_local(staging: Place, target: Place, kind: str) -> None:
    old = _sibling(target, "old")
    _clear_sibling(old, target, kind)
    target_path = resolve(target.uri)[1]
    os.makedirs(os.path.dirname(target_path), exist_ok=True)
    if os.path.exists(target_path):
        os.rename(target_path, old.uri)
    os.rename(resolve(staging.uri)[1], target_path)
    shutil.rmtree(old.uri, ignore_errors=True)  # the table just renamed aside: checked by `check_replaceable`


def _swap_s3(staging_folder: Place, target_folder: Place) -> None:
    fs, staging = staging_folder.fs_path()
    _, target = target_folder.fs_path()
    if fs.get_file_info(target).type != pafs.FileType.NotFound:
        marker = f"{target}/{MARKER}"
        if fs.get_file_info(marker).type == pafs.FileType.File:
            fs.delete_file(marker)  # from here on readers refuse the folder
        fs.delete_dir_contents(target, missing_dir_ok=True)
    skip = ("/" + MARKER, "/" + OWNER)
    files = [p for p in list_paths(fs, staging) if not p.endswith(skip)]
    for src in files:
        fs.copy_file(src, target + src[len(staging) :])
    fs.copy_file(f"{staging}/{MARKER}", f"{target}/{MARKER}")  # last
    fs.delete_dir(staging)


# --------------------------------------------------------------------------------------------
# A batch job's resumable stages: the same marker in each finished stage's folder
# --------------------------------------------------------------------------------------------


def with_quarantine(fields: Sequence[pa.Field]) -> pa.Schema:
    """A stage's schema: its own columns, then the QUARANTINE columns (null on rows it could use)."""
    return pa.schema([*fields, *(f.with_nullable(True) for f in schemas.QUARANTINE)])


def empty_folder(folder: Place) -> tuple:
    """(filesystem, path) of a folder that exists and is empty, whatever an earlier run left in it."""
    fs, path = folder.fs_path()
    fs.create_dir(path, recursive=True)
    fs.delete_dir_contents(path)
    return fs, path


def write_stage(dataset, folder: Place, schema: pa.Schema | None = None, stage: str | None = None) -> None:
    """Write a Ray Dataset as a stage's Parquet files and mark it finished (a half-written stage is cleared first);
    with `schema`, an empty result is one empty Parquet file of that schema."""
    import pyarrow.parquet as pq

    fs, path = empty_folder(folder)
    dataset.write_parquet(path, filesystem=fs, ray_remote_args={"num_cpus": 0.25})
    if schema is not None and not folder.files(suffix=".parquet"):
        pq.write_table(schema.empty_table(), f"{path}/part-empty.parquet", filesystem=fs)
    _write_marker(folder, BATCH_STAGE, stage, count_rows(folder))


class Stages:
    """The stages of one run under `staging`: each runs unless a finished copy is there already.

    With a `fingerprint` (see `fingerprint`), staging left by a run of other inputs or settings is cleared
    first, and the fingerprint is written there (`_staging.json`, its first file, with `run_id`: the run
    it belongs to, which the caller makes the only writer, e.g. under `xh.storage.partitions.VersionLock`); a
    non-empty folder without one of a batch job's is refused (`ForeignFolderError`), never cleared. Each
    stage logs its start and its end (rows, seconds), for the job's log."""

    def __init__(self, staging: Place, fingerprint: str | None = None, run_id: str | None = None) -> None:
        self.staging = staging
        self.run_id = run_id
        self.resumed: list[str] = []
        self.seconds: dict[str, float] = {}
        self.discarded = False  # whether staging of another fingerprint was cleared
        if fingerprint is not None:
            self._claim(fingerprint)

    def _claim(self, digest: str) -> None:
        owner_file = self.staging.join(OWNER)
        if self.staging.exists():
            owner = _read_json(owner_file)
            if owner is not None and owner.get("kind") == BATCH_STAGING and owner.get("fingerprint") == digest:
                owner_file.write_bytes(json.dumps(owner | {"run_id": self.run_id}).encode())  # resumed: now this run's
                return
            fs, path = self.staging.fs_path()
            if (owner is None or owner.get("kind") != BATCH_STAGING) and list_paths(fs, path):
                # the owner file is the first file of a batch job's staging: without it, not ours to delete
                raise ForeignFolderError(
                    f"{self.staging} holds files but no {OWNER} of a batch job's staging: refusing to delete "
                    "them; move them away"
                )
            self.discarded = True
            # everything but the owner file, which is then replaced: a run killed in between leaves staging
            # that a later run still recognizes (and clears), never a folder that blocks every later run
            for sub in fs.get_file_info(pafs.FileSelector(path)):
                if sub.type == pafs.FileType.Directory:
                    fs.delete_dir(sub.path)
                elif posixpath.basename(sub.path) != OWNER:
                    fs.delete_file(sub.path)
        else:
            empty_folder(self.staging)
        owner = {"kind": BATCH_STAGING, "fingerprint": digest, "run_id": self.run_id}
        owner_file.write_bytes(json.dumps(owner).encode())

    def run(
        self, name: str, dataset: Callable[[], object], resume: bool = True, schema: pa.Schema | None = None
    ) -> Place:
        """Write `dataset()` to `<staging>/<name>` (or keep a finished one when `resume`); returns its place.

        With `schema`, a stage that wrote no rows gets one empty Parquet file of that schema, so the
        next stage (and the partition) reads an empty table rather than a folder with no files."""
        folder = self.staging.join(name)
        start = time.perf_counter()
        if resume and (read_marker(folder) or {}).get("kind") == BATCH_STAGE:
            self.resumed.append(name)
            _log(f"stage {name}: resumed, {read_marker(folder).get('rows')} rows finished by an earlier run")
        else:
            _log(f"stage {name}: start")
            write_stage(dataset(), folder, schema, stage=name)
            _log(f"stage {name}: end, {read_marker(folder).get('rows')} rows, {time.perf_counter() - start:.1f} s")
        self.seconds[name] = time.perf_counter() - start
        return folder

    def clear(self) -> None:
        _delete(self.staging)


def _parquet(folder: Place):
    import pyarrow.dataset as pads

    fs, path = folder.fs_path()
    return pads.dataset(path, filesystem=fs, format="parquet", exclude_invalid_files=True)


def count_rows(folder: Place) -> int:
    """The rows of the Parquet files at or under `folder` (from their footers)."""
    return _parquet(folder).count_rows()


def usable_rows(folder: Place) -> int:
    """How many of a finished stage's rows the next stage reads (those without a reason)."""
    import pyarrow.dataset as pads

    return _parquet(folder).count_rows(filter=pads.field("reason").is_null())


def write_quarantine(stages: Sequence[Place], target: Place) -> dict[str, int]:
    """The stages' rows with a reason, as one QUARANTINE file in `target` (replaced); returns {reason: count}."""
    import pyarrow.dataset as pads
    import pyarrow.parquet as pq

    fs, dst = empty_folder(target)
    parts = []
    for stage in stages:
        rows = _parquet(stage).to_table(columns=schemas.QUARANTINE.names, filter=pads.field("reason").is_valid())
        parts.append(rows.cast(schemas.QUARANTINE))
    table = pa.concat_tables(parts)
    pq.write_table(table, f"{dst}/part-00000.parquet", filesystem=fs)
    counts: dict[str, int] = {}
    for reason in table["reason"].to_pylist():
        counts[reason] = counts.get(reason, 0) + 1
    return counts
