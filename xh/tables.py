"""Tables handed on whole or not at all: staged writes, a completion marker, a reader check.

    with staged("runs/demo/graphs/hotpot", s3, inputs={"questions": ..., "config": ...}) as stage:
        write_everything_under(stage.uri)      # a hidden sibling: <parent>/.hotpot.staging
        stage.rows = 500
    # here: the folder holds the new table and `_complete.json`; on an exception the previous table is untouched

    require_complete("runs/demo/graphs/hotpot", s3)   # a reader: one-line error unless the marker is there

A table folder is *complete* when it holds `_complete.json` (rows, written_at, an input fingerprint),
the last file written. Writers build the whole folder in a staging sibling, write the marker there, and
swap it into place:

- local: rename the old folder aside (`.<name>.old`), rename the staging folder into place, delete the
  old one — a run that fails or is killed while building leaves the previous table and its marker intact;
- s3 (no rename): the staging prefix is complete first; then the old marker is deleted (from that moment
  readers refuse the folder instead of reading a mix), the old objects deleted, the staged objects
  copied in (server-side copies) and the marker copied last. Only a failure inside that short swap
  leaves the folder without a marker: refused, never read half-written.

Outputs only ever delete what the project wrote: `staged` refuses (`ForeignFolderError`, one line) to
replace a non-empty folder without the marker, so a mistyped `graphs.output` never empties a user's folder.
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import pyarrow.fs as pafs

from xh.config import ConfigError
from xh.storage import S3Settings, is_s3, join, list_paths, open_input, open_output, resolve

MARKER = "_complete.json"


class IncompleteTableError(FileNotFoundError):
    """A table folder without its completion marker (a run that failed, was killed, or never ran)."""


class ForeignFolderError(ConfigError):
    """An output folder that holds files the project did not write (no marker): never deleted."""


def fingerprint(inputs: object) -> str:
    """A short stable hash of what a table was built from (paths, settings, upstream markers)."""
    return hashlib.sha256(json.dumps(inputs, sort_keys=True, default=str).encode()).hexdigest()[:16]


def read_marker(uri: str, s3: S3Settings | None = None) -> dict | None:
    """The folder's `_complete.json`, or None when it has none."""
    try:
        with open_input(join(uri, MARKER), s3) as f:
            return json.loads(f.read())
    except (FileNotFoundError, OSError):
        return None


def require_complete(uri: str, s3: S3Settings | None = None, what: str = "table", hint: str = "") -> dict:
    """The folder's marker; `IncompleteTableError` (one line) when the folder is missing or has none."""
    fs, path = resolve(uri, s3)
    if fs.get_file_info(path).type == pafs.FileType.NotFound:
        raise IncompleteTableError(f"no {what} at {uri}{hint}")
    marker = read_marker(uri, s3)
    if marker is None:
        raise IncompleteTableError(
            f"{what} at {uri} is incomplete (no {MARKER}: a run failed or was interrupted){hint}"
        )
    return marker


def check_replaceable(uri: str, s3: S3Settings | None = None) -> None:
    """Raise `ForeignFolderError` unless `uri` is missing, empty, or a folder the project marked."""
    fs, path = resolve(uri, s3)
    info = fs.get_file_info(path)
    if info.type == pafs.FileType.NotFound:
        return
    if info.type == pafs.FileType.File:
        raise ForeignFolderError(f"output {uri} is a file, not a table folder: refusing to replace it")
    if read_marker(uri, s3) is None and list_paths(fs, path):
        raise ForeignFolderError(
            f"output {uri} holds files this project did not write (no {MARKER}): refusing to delete them; "
            "choose an empty or new folder"
        )


def _sibling(uri: str, suffix: str) -> str:
    stripped = uri.rstrip("/")
    if is_s3(stripped):
        parent, name = posixpath.split(stripped[len("s3://") :])
        return "s3://" + posixpath.join(parent, f".{name}.{suffix}")
    parent, name = os.path.split(os.path.abspath(stripped))
    return os.path.join(parent, f".{name}.{suffix}")


@dataclass
class Stage:
    """Where a run writes its table before it is published; set `rows` (and `detail`) before the end."""

    uri: str
    target: str
    inputs: object = None
    rows: int | None = None
    detail: dict = field(default_factory=dict)


def _delete(uri: str, s3: S3Settings | None) -> None:
    fs, path = resolve(uri, s3)
    if fs.get_file_info(path).type != pafs.FileType.NotFound:
        fs.delete_dir(path)


@contextmanager
def staged(uri: str, s3: S3Settings | None = None, *, inputs: object = None) -> Iterator[Stage]:
    """Build a table in a staging sibling of `uri`; on success mark it complete and swap it into place.

    Refuses up front (before any work) to replace a folder the project did not write. On any exception
    the staging folder is removed and the previous table at `uri` is left as it was.
    """
    check_replaceable(uri, s3)
    stage = Stage(uri=_sibling(uri, "staging"), target=uri, inputs=inputs)
    _delete(stage.uri, s3)  # a leftover of a killed run
    fs, path = resolve(stage.uri, s3)
    fs.create_dir(path, recursive=True)
    try:
        yield stage
    except BaseException:
        try:
            _delete(stage.uri, s3)
        finally:
            raise
    publish(stage, s3)


def publish(stage: Stage, s3: S3Settings | None = None) -> dict:
    """Write the marker into the staging folder (its last file), then swap the folder into place."""
    marker = {
        "rows": stage.rows,
        "written_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "inputs": fingerprint(stage.inputs),
        **({"detail": stage.detail} if stage.detail else {}),
    }
    with open_output(join(stage.uri, MARKER), s3) as f:
        f.write(json.dumps(marker, indent=1, default=str).encode())
    check_replaceable(stage.target, s3)  # again: someone may have written there meanwhile
    if is_s3(stage.target):
        _swap_s3(stage.uri, stage.target, s3)
    else:
        _swap_local(resolve(stage.uri)[1], resolve(stage.target)[1])
    return marker


def _swap_local(staging: str, target: str) -> None:
    old = _sibling(target, "old")
    shutil.rmtree(old, ignore_errors=True)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    if os.path.exists(target):
        os.rename(target, old)
    os.rename(staging, target)
    shutil.rmtree(old, ignore_errors=True)


def _swap_s3(staging_uri: str, target_uri: str, s3: S3Settings | None) -> None:
    fs, staging = resolve(staging_uri, s3)
    _, target = resolve(target_uri, s3)
    if fs.get_file_info(target).type != pafs.FileType.NotFound:
        marker = f"{target}/{MARKER}"
        if fs.get_file_info(marker).type == pafs.FileType.File:
            fs.delete_file(marker)  # from here on readers refuse the folder
        fs.delete_dir_contents(target, missing_dir_ok=True)
    files = [p for p in list_paths(fs, staging) if not p.endswith("/" + MARKER)]
    for src in files:
        fs.copy_file(src, target + src[len(staging) :])
    fs.copy_file(f"{staging}/{MARKER}", f"{target}/{MARKER}")  # last
    fs.delete_dir(staging)
