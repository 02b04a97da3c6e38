"""JSON and JSON-lines files, local or s3:// (plain or bz2), with one-line errors.

    records = read_json("hotpot_dev_distractor_v1.json")       # one JSON document
    numbered = read_jsonl("pred.jsonl")                          # [(line number, record)]; a bad line is an error
    if not is_utf8_text(record): ...                             # a string Arrow would refuse (not UTF-8)
    for number, record, error in json_lines(text): ...           # a bad line is yielded, not raised

Each reader takes a path or URI (read with the environment's S3 settings) or an `xh.storage.store.Location`
(read with its store's). A file that is missing, unreadable, not UTF-8 or not valid JSON raises `InputFileError` (a
`ValueError`) whose message is one line naming the file; a missing file's error is also a
`FileNotFoundError`, so drivers report it like any other missing input. Importing this module loads
nothing else (pyarrow only when a file is read).
"""

from __future__ import annotations

import bz2
import json
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from xh.storage.store import Location


class InputFileError(ValueError):
    """An input file that is missing or malformed, explained in one line."""


class MissingInputFile(InputFileError, FileNotFoundError):
    """An input file that does not exist."""


def read_json(file: str | Location) -> Any:
    """One JSON document."""
    try:
        return json.loads(read_text(file))
    except json.JSONDecodeError as e:
        raise InputFileError(f"{file} is not valid JSON ({e})") from None


def read_jsonl(file: str | Location) -> list[tuple[int, Any]]:
    """JSON lines as (line number, record); blank lines are skipped, so numbers follow the file."""
    records = []
    for number, record, error in json_lines(read_text(file)):
        if error:
            raise InputFileError(f"{file} line {number} is not valid JSON ({error})")
        records.append((number, record))
    return records


def json_lines(text: str) -> Iterator[tuple[int, Any, json.JSONDecodeError | None]]:
    """(line number, record, None) per non-blank line; a line that is not JSON: (line number, the line, the error)."""
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            yield number, json.loads(line), None
        except json.JSONDecodeError as e:
            yield number, line, e


def read_text(file: str | Location) -> str:
    """A file's text; bz2 files (by their magic bytes) are decompressed."""
    return decode_text(str(file), read_bytes(file))


def read_bytes(file: str | Location) -> bytes:
    """A file's raw bytes (nothing decompressed)."""
    from xh.storage.store import located  # pyarrow only when a file is read

    try:
        return located(file).read_bytes()
    except FileNotFoundError:
        raise MissingInputFile(f"no such file: {file}") from None
    except OSError as e:
        raise InputFileError(f"cannot read {file}: {str(e).splitlines()[0]}") from None


def is_utf8_text(record: Any) -> bool:
    """Whether every string in a parsed record can be written as UTF-8 (what Arrow and Parquet demand):
    false for bytes that were not UTF-8 (decoded with "surrogateescape") and for JSON's escaped half
    surrogate pairs ("\\ud800")."""
    try:
        json.dumps(record, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def decode_text(source: str, data: bytes) -> str:
    """Bytes read from `source` as text (bz2 decompressed first); not UTF-8 is an InputFileError."""
    if data[:3] == b"BZh":
        try:
            data = bz2.decompress(data)
        except (OSError, ValueError) as e:
            raise InputFileError(f"{source} is not a readable bz2 file ({e})") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputFileError(f"{source} is not UTF-8 text ({e.reason} at byte {e.start})") from None
