"""Tables handed on whole or not at all: staged writes, a completion marker, a reader check.

    with staged("runs/demo/graphs/hotpot", s3, kind=GRAPHS, stage="graphs", inputs={...}) as stage:
        write_everything_under(stage.uri)      # a hidden sibling: <parent>/.hotpot.staging
        stage.rows = 500
    # here: the folder holds the new table and `_complete.json`; on an exception the previous table is untouched

    require_complete("runs/demo/graphs/hotpot", s3)   # a reader: one-line error unless the marker is there

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
"""

from __future__ import annotations

import contextlib
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
OWNER = "_staging.json"  # the first file of a staging folder: which kind and target it is being built for

# The kinds of table the stages write; a marker names one, and a stage replaces only its own kind.
WIKI_TABLES = "wiki tables"
RETRIEVAL = "retrieval output"
BM25_INDEX = "bm25 index"
GRAPHS = "graphs"
GRAPHS_QUARANTINE = "graphs quarantine"


class IncompleteTableError(FileNotFoundError):
    """A table folder without its completion marker (a run that failed, was killed, or never ran)."""


class ForeignFolderError(ConfigError):
    """An output folder the stage may not replace: files the project did not write, or another kind of table."""


def fingerprint(inputs: object) -> str:
    """A short stable hash of what a table was built from (paths, settings, upstream markers)."""
    return hashlib.sha256(json.dumps(inputs, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _read_json(uri: str, s3: S3Settings | None) -> dict | None:
    try:
        with open_input(uri, s3) as f:
            found = json.loads(f.read())
    except (FileNotFoundError, OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def read_marker(uri: str, s3: S3Settings | None = None) -> dict | None:
    """The folder's `_complete.json`, or None when it has none."""
    return _read_json(join(uri, MARKER), s3)


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


def check_replaceable(uri: str, s3: S3Settings | None = None, kind: str | None = None) -> None:
    """Raise `ForeignFolderError` unless `uri` is missing, empty, or a table of `kind` the project marked,
    and lies inside no other table."""
    fs, path = resolve(uri, s3)
    info = fs.get_file_info(path)
    for parent in _parents(uri):
        marker = read_marker(parent, s3)
        if marker is not None:
            raise ForeignFolderError(
                f"output {uri} lies inside {_written_by(marker)} at {parent}: refusing to write into it; "
                "choose a folder outside it"
            )
    if info.type == pafs.FileType.NotFound:
        return
    if info.type == pafs.FileType.File:
        raise ForeignFolderError(f"output {uri} is a file, not a table folder: refusing to replace it")
    marker = read_marker(uri, s3)
    if marker is None:
        if list_paths(fs, path):
            raise ForeignFolderError(
                f"output {uri} holds files this project did not write (no {MARKER}): refusing to delete them; "
                "choose an empty or new folder"
            )
        return
    if kind is not None and (marker.get("kind") or _legacy_kind(uri, s3)) != kind:
        raise ForeignFolderError(
            f"output {uri} holds {_written_by(marker)}, not the {kind}: refusing to replace it; "
            "choose another folder (or delete that one yourself)"
        )


def _legacy_kind(uri: str, s3: S3Settings | None) -> str | None:
    """The kind of a table whose marker names none (written before markers named kinds), from its layout;
    None when the layout says nothing: such a folder is then refused, not guessed at."""
    fs, path = resolve(uri, s3)
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


def _sibling(uri: str, suffix: str) -> str:
    stripped = uri.rstrip("/")
    if is_s3(stripped):
        parent, name = posixpath.split(stripped[len("s3://") :])
        return "s3://" + posixpath.join(parent, f".{name}.{suffix}")
    parent, name = os.path.split(resolve(stripped)[1])
    return os.path.join(parent, f".{name}.{suffix}")


def _where(uri: str) -> str:
    """`uri` as a staging folder's `_staging.json` records it: the same folder whatever the working directory."""
    return uri.rstrip("/") if is_s3(uri) else resolve(uri)[1]


@dataclass
class Stage:
    """Where a run writes its table before it is published; set `rows` (and `detail`) before the end."""

    uri: str
    target: str
    kind: str
    stage: str | None = None
    inputs: object = None
    rows: int | None = None
    detail: dict = field(default_factory=dict)


def _exists(uri: str, s3: S3Settings | None) -> bool:
    fs, path = resolve(uri, s3)
    return fs.get_file_info(path).type != pafs.FileType.NotFound


def _delete(uri: str, s3: S3Settings | None) -> None:
    fs, path = resolve(uri, s3)
    if fs.get_file_info(path).type != pafs.FileType.NotFound:
        fs.delete_dir(path)


def _ours(uri: str, target: str, kind: str, s3: S3Settings | None) -> bool:
    """Whether a `.<name>.staging` / `.<name>.old` sibling may be deleted: empty, or carrying this kind's
    own proof (a staging folder's `_staging.json` naming `target`, or a marker of `kind`)."""
    fs, path = resolve(uri, s3)
    if fs.get_file_info(path).type == pafs.FileType.File:
        return False
    owner = _read_json(join(uri, OWNER), s3)
    if owner is not None and owner.get("kind") == kind and owner.get("target") == _where(target):
        return True
    marker = read_marker(uri, s3)
    if marker is not None:
        return marker.get("kind") == kind
    return not list_paths(fs, path)


def _clear_sibling(uri: str, target: str, kind: str, s3: S3Settings | None) -> None:
    """Delete a leftover sibling of a killed run, but only one that is provably this kind's own."""
    if not _exists(uri, s3):
        return
    if not _ours(uri, target, kind, s3):
        raise ForeignFolderError(
            f"{uri} is in the way of the {kind} at {target} and holds no {OWNER} or {MARKER} of the {kind}: "
            "refusing to delete it; move it away"
        )
    _delete(uri, s3)


@contextmanager
def staged(
    uri: str, s3: S3Settings | None = None, *, kind: str, stage: str | None = None, inputs: object = None
) -> Iterator[Stage]:
    """Build a table of `kind` in a staging sibling of `uri`; on success mark it complete and swap it into place.

    Refuses up front (before any work) to replace a folder the project did not write, a table of
    another kind, or a sibling it cannot prove its own. On any exception the staging folder is removed
    and the previous table at `uri` is left as it was.
    """
    if not is_s3(uri):
        _recover_local(uri, kind)
    check_replaceable(uri, s3, kind)
    staging = Stage(uri=_sibling(uri, "staging"), target=uri, kind=kind, stage=stage, inputs=inputs)
    _clear_sibling(staging.uri, uri, kind, s3)  # a leftover of a killed run
    if not is_s3(uri):
        _clear_sibling(_sibling(uri, "old"), uri, kind, s3)
    # the proof that this folder is ours, first: a later run deletes it only with this in it
    with open_output(join(staging.uri, OWNER), s3) as f:
        f.write(json.dumps({"kind": kind, "stage": stage, "target": _where(uri)}).encode())
    try:
        yield staging
    except BaseException:
        try:
            _delete(staging.uri, s3)
        finally:
            raise
    publish(staging, s3)


def _recover_local(uri: str, kind: str) -> None:
    """A run killed between the two renames of a swap left the previous table aside: put it back."""
    target, old = resolve(uri)[1], _sibling(uri, "old")
    if not os.path.exists(target) and (read_marker(old) or {}).get("kind") == kind:
        os.rename(old, target)


def publish(stage: Stage, s3: S3Settings | None = None) -> dict:
    """Write the marker into the staging folder (its last file), then swap the folder into place."""
    marker = {
        "kind": stage.kind,
        **({"stage": stage.stage} if stage.stage else {}),
        "rows": stage.rows,
        "written_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "inputs": fingerprint(stage.inputs),
        **({"detail": stage.detail} if stage.detail else {}),
    }
    with open_output(join(stage.uri, MARKER), s3) as f:
        f.write(json.dumps(marker, indent=1, default=str).encode())
    check_replaceable(stage.target, s3, stage.kind)  # again: someone may have written there meanwhile
    if is_s3(stage.target):
        _swap_s3(stage.uri, stage.target, s3)
    else:
        # the marker of our kind is proof enough from here on (see `_ours`)
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(resolve(stage.uri)[1], OWNER))
        _swap_local(resolve(stage.uri)[1], resolve(stage.target)[1], stage.kind)
    return marker


def _swap_local(staging: str, target: str, kind: str) -> None:
    old = _sibling(target, "old")
    _clear_sibling(old, target, kind, None)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    if os.path.exists(target):
        os.rename(target, old)
    os.rename(staging, target)
    shutil.rmtree(old, ignore_errors=True)  # the table just renamed aside: checked by `check_replaceable`


def _swap_s3(staging_uri: str, target_uri: str, s3: S3Settings | None) -> None:
    fs, staging = resolve(staging_uri, s3)
    _, target = resolve(target_uri, s3)
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
