"""Bytes in, shared by every format: bz2 detection and decompression, lines, JSON-lines records.

    for line in lines(decompressed(stream)):  # raw bytes in; bz2 ("BZh...") is detected and undone
        ...
    # a cut or corrupt bz2 tail raises `Truncated` (after the complete lines): the reader turns it
    # into one last record, `truncated.record(source, position)`, quarantined

    read_json_lines(stream, source, counts, to_doc)  # hotpot, fever: one record per non-blank line

Everything streams through bounded buffers (never a whole file); a bz2 "bomb" stays bounded too.
"""

from __future__ import annotations

import bz2
import json
from collections.abc import Callable, Iterable, Iterator
from typing import BinaryIO

from xh.storage.jsonfiles import is_utf8_text
from xh.wiki.records import Doc, Quarantine, ReadCounts, Record, Unreadable, clip_raw

__all__ = ["Truncated", "decompressed", "lines", "non_utf8", "read_json_lines", "id_of"]

READ_SIZE = 1 << 20  # compressed bytes read per call
OUT_SIZE = 1 << 22  # most decompressed bytes produced per call (a bz2 "bomb" stays bounded)


class Truncated(Exception):
    """The bz2 stream ended early or is corrupt; `partial` is the incomplete record that was cut."""

    def __init__(self, detail: str):
        super().__init__(detail)
        self.partial = b""

    def record(self, source: str, position: int) -> Quarantine:
        """The file's last record: its cut tail, quarantined."""
        partial = self.partial.decode("utf-8", "replace")
        return Quarantine(source, position, f"truncated bz2 stream: {self}", clip_raw(partial))


def non_utf8(data: bytes, error: UnicodeDecodeError, source: str, position: int) -> Quarantine:
    """The quarantine row of a record whose bytes are not UTF-8."""
    reason = f"non-utf8 bytes: {error.reason} at byte {error.start}"
    return Quarantine(source, position, reason, clip_raw(data.decode("utf-8", "replace")))


# --- bz2 detection and decompression -------------------------------------------------------------


def decompressed(stream: BinaryIO) -> Iterator[bytes]:
    """The file's bytes in chunks, bz2-decompressed when the file starts with bz2's magic "BZh"."""
    head = b""
    while len(head) < 3:
        more = stream.read(READ_SIZE)
        if not more:
            break
        head += more
    if head.startswith(b"BZh"):
        yield from _bunzip2(head, stream)
        return
    if head:
        yield head
    while chunk := stream.read(READ_SIZE):
        yield chunk


def _bunzip2(data: bytes, stream: BinaryIO) -> Iterator[bytes]:
    """Incremental bz2 decompression of one or more concatenated streams (as pbzip2 writes them)."""
    decompressor = bz2.BZ2Decompressor()
    streams_done = 0
    produced = False  # has the current stream produced output yet?
    while True:
        try:
            out = decompressor.decompress(data, OUT_SIZE)
        except OSError as error:
            if streams_done and not produced:
                return  # trailing garbage after a complete stream: ignored, as bz2.BZ2File does
            raise Truncated(f"corrupt data ({error})") from None
        data = b""
        if out:
            produced = True
            yield out
        if decompressor.eof:
            data = decompressor.unused_data or stream.read(READ_SIZE)
            if not data:
                return
            decompressor, streams_done, produced = bz2.BZ2Decompressor(), streams_done + 1, False
        elif decompressor.needs_input:
            data = stream.read(READ_SIZE)
            if not data:
                raise Truncated("the file ends before the end-of-stream marker")


# --- lines ---------------------------------------------------------------------------------------


def lines(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """Split byte chunks into lines (without the newline); a cut line is kept on `Truncated.partial`."""
    pending: list[bytes] = []
    try:
        for chunk in chunks:
            if b"\n" not in chunk:
                pending.append(chunk)
                continue
            split = chunk.split(b"\n")
            if pending:
                pending.append(split[0])
                split[0] = b"".join(pending)
                pending = []
            tail = split.pop()
            yield from split
            if tail:
                pending.append(tail)
    except Truncated as truncated:
        truncated.partial = b"".join(pending)
        raise
    if pending:
        yield b"".join(pending)


# --- JSON lines (hotpot, fever) ------------------------------------------------------------------


def read_json_lines(
    stream: BinaryIO, source: str, counts: ReadCounts, to_doc: Callable[[dict, str], Doc]
) -> Iterator[Record]:
    """One record per non-blank line; `to_doc` turns a parsed object into a Doc or raises `Unreadable`."""
    seen_ids: set[str] = set()
    number = 0
    try:
        for line in lines(decompressed(stream)):
            number += 1
            if not line or line.isspace():
                counts.skipped += 1
                continue
            counts.records += 1
            record = _json_line_record(line, number, source, to_doc, seen_ids)
            yield record
            if record.kind == "doc" and record.lost:
                raw = clip_raw(line.decode("utf-8", "replace"))
                yield Quarantine(source, number, record.lost, raw, partial=True)
    except Truncated as truncated:
        counts.records += 1
        yield truncated.record(source, number + 1)


def _json_line_record(
    line: bytes, number: int, source: str, to_doc: Callable[[dict, str], Doc], seen_ids: set[str]
) -> Record:
    if line.endswith(b"\r"):
        line = line[:-1]
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as error:
        return non_utf8(line, error, source, number)
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError) as error:  # RecursionError: absurdly deep nesting
        return Quarantine(source, number, f"invalid json: {getattr(error, 'msg', error)}", clip_raw(text))
    try:
        if not isinstance(obj, dict):
            raise Unreadable(f"invalid record: a JSON {type(obj).__name__}, not an object")
        if ("\\ud" in text or "\\uD" in text) and not is_utf8_text(obj):
            # JSON may escape half a surrogate pair ("\\ud800"), which no UTF-8 writer (Parquet) accepts
            raise Unreadable("invalid record: unpaired surrogate in a string")
        doc = to_doc(obj, source)
    except Unreadable as unreadable:
        return Quarantine(source, number, str(unreadable), clip_raw(text))
    if doc.doc_id in seen_ids:
        return Quarantine(source, number, f"duplicate id: {doc.doc_id}", clip_raw(text))
    seen_ids.add(doc.doc_id)
    return doc


def id_of(obj: dict, key: str = "id") -> str:
    """The record's id (a non-blank string or integer, as a stripped string), else `Unreadable("missing id")`."""
    value = obj.get(key)
    if isinstance(value, bool) or not isinstance(value, (str, int)) or not str(value).strip():
        raise Unreadable("missing id")
    return str(value).strip()
