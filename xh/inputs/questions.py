"""Question files -> `questions` rows, and HotpotQA context paragraphs -> a wiki dump.

    rows, quarantined = read_hotpot_questions("hotpot_train_sample500.json")
    rows, quarantined = parse_question_file("incoming/2026-11-22.jsonl", data)   # bytes of any question file
    write_context_dump("hotpot_train_sample500.json", "runs/hotpot500/wiki/contexts.jsonl.bz2")

This is the one place that reads question records. A HotpotQA question file is the official JSON
array (`_id, question, answer?, type?, level?, supporting_facts?, context?`); batch scoring also
reads JSON lines and Parquet (`QUESTION_FILES`), one record per line or row, with `qid` (or `_id`,
`id`) and `question` (FEVER's `claim`). Records that cannot be used are quarantined with the reason, never dropped:

    not JSON: ...                   a JSON-lines line (or a whole JSON file) that does not parse
    non-utf8 bytes: ...             a JSON-lines line whose bytes are not UTF-8
    non-utf8 text                   a record with a string that is not UTF-8 (never scored as U+FFFD)
    truncated stream: ...           the cut tail of a .bz2 or .gz file (JSON lines: the lines before it are kept)
    unreadable Parquet file: ...    a Parquet file that does not open (one row for the file)
    invalid record: not an object   a record that is not a JSON object
    missing id / invalid id / empty question / duplicate id (within a file: the first record is kept)
    record too large: N bytes (limit M)          a record over `InputLimits.record_bytes` (its JSON text)
    question too long: N characters (limit M)    a question over `InputLimits.question_chars`
    invalid answer / invalid type / invalid level: a number   a field of the wrong JSON type
    invalid supporting facts: ...

Across the files of one scoring run an id is kept once too (`later_files`): the record of the file
last in name order is scored (dated files: the latest delivery), the others are quarantined by the
driver with `duplicate id: superseded by FILE`.

The size limits (batch scoring's `score.max_question_chars` and `score.max_record_bytes`) keep one
oversized record from exhausting the worker that retrieves for it; a JSON line over the record limit is
refused before it is parsed.

Files may be bz2- or gzip-compressed (detected by their magic bytes, whatever their name). Positions count
from 1 (the line of a JSON-lines file, the record of an array, the row of a Parquet file); -1 stands
for the whole file. `read_hotpot_questions` (retrieval's one question file) treats a file that is
not a readable JSON array as a user error instead (`InputFileError`, one line). Supporting-fact titles go through the one title normalisation,
so they meet the `docs` table's titles.

`write_context_dump` turns the union of the file's context paragraphs into the HotpotQA
processed-Wikipedia format, so the distractor setting's paragraphs become a corpus that
`xh wiki process` reads like any other dump.
"""

from __future__ import annotations

import bz2
import io
import json
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from xh.schemas import RAW_LIMIT
from xh.storage.jsonfiles import InputFileError, is_utf8_text, read_bytes, read_json
from xh.storage.store import Location, located
from xh.wiki.streams import Truncated, decompressed, lines
from xh.wiki.titles import normalize_title

# What batch scoring takes as question files (`parse_question_file` undoes bz2 and gzip).
QUESTION_FILES = (".jsonl", ".json", ".parquet", ".jsonl.gz", ".jsonl.bz2")


@dataclass(frozen=True)
class InputLimits:
    """Size limits on question records (None: no limit): the question's length in characters, and the
    record's size as JSON text in UTF-8 bytes (a JSON line's own bytes)."""

    question_chars: int | None = None
    record_bytes: int | None = None


NO_LIMITS = InputLimits()


def _quarantine(source: str, position: int, reason: str, record: Any) -> dict:
    """A QUARANTINE row; `record` is the parsed record, or the text that could not be parsed."""
    raw = record if isinstance(record, str) else json.dumps(record, default=str)
    raw = raw.encode("utf-8", "backslashreplace").decode("utf-8")  # bytes that were not UTF-8, shown escaped
    return {"source": source, "position": position, "reason": reason, "raw": raw[:RAW_LIMIT]}


def _supporting_facts(value: Any) -> list[dict] | None:
    if value is None:
        return None
    facts = []
    for fact in value:
        if not (
            isinstance(fact, (list, tuple))
            and len(fact) == 2
            and isinstance(fact[0], str)
            and isinstance(fact[1], int)
            and not isinstance(fact[1], bool)
            and 0 <= fact[1] < 2**31
        ):
            raise ValueError(f"supporting fact {fact!r} is not [title, sentence index]")
        facts.append({"title": normalize_title(fact[0]), "sent": fact[1]})
    return facts


# The one JSON loader, under the name this module's users know.
load_json = read_json


def record_id(record: dict):
    """A question record's id: `_id` (HotpotQA), `qid` (batch scoring's files) or `id`."""
    return record.get("_id") or record.get("qid") or record.get("id")


def _record_bytes(record: Any) -> int:
    """A parsed record's size as JSON text in UTF-8 bytes (lone surrogates counted, not refused here)."""
    return len(json.dumps(record, ensure_ascii=False, default=str).encode("utf-8", "surrogatepass"))


def _too_large(size: int, limits: InputLimits) -> str | None:
    if limits.record_bytes is not None and size > limits.record_bytes:
        return f"record too large: {size} bytes (limit {limits.record_bytes})"
    return None


def question_rows(
    records: list,
    source: str,
    positions: Sequence[int] | None = None,
    *,
    limits: InputLimits = NO_LIMITS,
    located: bool = False,
    task: str | None = None,
) -> tuple[list[dict], list[dict]]:
    """Question records -> (QUESTIONS rows, QUARANTINE rows); every record lands in exactly one.

    `positions`: each record's position in its file (default: 1, 2, ...). `limits`: see `InputLimits`.
    `located`: each row also carries its `source` and `position` (batch scoring resolves ids repeated
    across files by them). `task` ("hotpot" or "fever"): the task of the version that will answer; then a
    record with both a `question` and a `claim`, or the other task's field, is refused (`wrong_field`)."""
    rows, quarantined, seen = [], [], set()
    for position, record in zip(positions or range(1, len(records) + 1), records):
        if not isinstance(record, dict):
            quarantined.append(_quarantine(source, position, "invalid record: not an object", record))
            continue
        too_large = _too_large(_record_bytes(record), limits) if limits.record_bytes is not None else None
        if too_large:  # before any other check reads the whole record
            quarantined.append(_quarantine(source, position, too_large, _head(record)))
            continue
        qid, question = record_id(record), record.get("question", record.get("claim"))  # FEVER: claim
        wrong = _wrong_type(record) or (wrong_field(record, task) if task else None)
        if not qid:
            quarantined.append(_quarantine(source, position, "missing id", record))
        elif isinstance(qid, bool) or not isinstance(qid, (str, int)):
            quarantined.append(_quarantine(source, position, f"invalid id: {_json_type(qid)}", record))
        elif not is_utf8_text(record):
            quarantined.append(_quarantine(source, position, "non-utf8 text", record))
        elif not isinstance(question, str) or not question.strip():
            quarantined.append(_quarantine(source, position, "empty question", record))
        elif limits.question_chars is not None and len(question.strip()) > limits.question_chars:
            reason = f"question too long: {len(question.strip())} characters (limit {limits.question_chars})"
            quarantined.append(_quarantine(source, position, reason, _head(record)))
        elif wrong:
            quarantined.append(_quarantine(source, position, wrong, record))
        elif str(qid) in seen:
            quarantined.append(_quarantine(source, position, "duplicate id", record))
        else:
            try:
                facts = _supporting_facts(record.get("supporting_facts"))
            except (TypeError, ValueError) as e:
                quarantined.append(_quarantine(source, position, f"invalid supporting facts: {e}", record))
                continue
            seen.add(str(qid))
            answer = record.get("answer")
            row = {
                "qid": str(qid),
                "question": question.strip(),
                "answer": None if answer is None else str(answer),  # a number's text
                "type": record.get("type"),
                "level": record.get("level"),
                "supporting_facts": facts,
            }
            rows.append(row | {"source": source, "position": position} if located else row)
    return rows, quarantined


def wrong_field(record: dict, task: str) -> str | None:
    """Why a record is not for a version of `task`: both a question and a claim (one would be dropped
    silently), a claim to a HotpotQA version or a question to a FEVER one; None when it is."""
    question, claim = record.get("question") is not None, record.get("claim") is not None
    if question and claim:
        return "both a question and a claim: give one"
    if task == "fever" and question:
        return "a question to a FEVER version: it verifies claims (give `claim`)"
    if task != "fever" and claim:
        return "a claim to a HotpotQA version: it answers questions (give `question`)"
    return None


def _head(record: Any) -> str:
    """The start of an oversized record's text for its quarantine row, without writing all of it out."""
    if isinstance(record, dict):  # the id and the question's start first: what finds the record again
        head = {k: record[k] for k in ("_id", "qid", "id") if k in record}
        text = record.get("question", record.get("claim"))
        head["question"] = text[:RAW_LIMIT] if isinstance(text, str) else None
        return json.dumps(head, default=str)
    return str(record)[:RAW_LIMIT]


def later_files(rows) -> dict[str, str]:
    """The usable rows of one scoring run (an Arrow table with `qid` and `source`) -> {qid: the file
    whose record is scored} for each id found in more than one file: the file last in name order
    (dated files: the latest delivery). Ids in one file only are not returned."""
    import pyarrow.compute as pc

    per_id = rows.group_by("qid").aggregate([("source", "count_distinct"), ("source", "max")])
    repeated = per_id.filter(pc.greater(per_id["source_count_distinct"], 1))
    return dict(zip(repeated["qid"].to_pylist(), repeated["source_max"].to_pylist()))


def superseded_by(source: str) -> str:
    """The quarantine reason of a record whose id a later file of the same run also has."""
    return f"duplicate id: superseded by {source}"


# Fields read besides the id and the question, and the JSON types each may have (null always may).
_FIELD_TYPES = {"answer": (str, int, float), "type": (str,), "level": (str,)}


def _json_type(value: Any) -> str:
    """The JSON type of a parsed value, with its article ("an array")."""
    names = {
        dict: "an object",
        list: "an array",
        str: "a string",
        bool: "a boolean",
        int: "a number",
        float: "a number",
    }
    return names.get(type(value), f"a {type(value).__name__}")


def _wrong_type(record: dict) -> str | None:
    """The quarantine reason of the first field of the wrong type, or None."""
    for name, types in _FIELD_TYPES.items():
        value = record.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, types)):
            return f"invalid {name}: {_json_type(value)}"
    return None


def read_hotpot_questions(file: str | Location) -> tuple[list[dict], list[dict]]:
    """A HotpotQA question file (a JSON array, plain, bz2 or gzip); a file that is not one is an
    `InputFileError` (one line), a bad record in it is quarantined."""
    uri = str(file)
    numbered, truncated = _lines(read_bytes(file))
    if truncated:
        raise InputFileError(f"{uri} is a truncated compressed file ({truncated}): no question read")
    records = _json_array(numbered)
    if records is None or not isinstance(records, list):
        raise InputFileError(f"{uri} is not a HotpotQA question file (a JSON array of questions)")
    return question_rows(records, uri)


def _lines(data: bytes) -> tuple[list[tuple[int, bytes]], Truncated | None]:
    """The (decompressed) bytes as numbered lines; a cut or corrupt bz2 or gzip tail ends them, returned
    as the `Truncated` error (its `partial` is the cut line)."""
    numbered: list[tuple[int, bytes]] = []
    gzip_error = None
    if data[:2] == b"\x1f\x8b":
        data, gzip_error = _gunzip(data)
    try:
        for line in lines(decompressed(io.BytesIO(data))):
            numbered.append((len(numbered) + 1, line))
    except Truncated as truncated:
        return numbered, truncated
    if gzip_error:
        truncated = Truncated(gzip_error)
        if numbered and not data.endswith(b"\n"):
            truncated.partial = numbered.pop()[1]
        return numbered, truncated
    return numbered, None


def _gunzip(data: bytes) -> tuple[bytes, str | None]:
    """gzip's bytes (every member) undone, and what went wrong where the stream breaks off."""
    out, decompressor = [], zlib.decompressobj(wbits=31)
    try:
        while True:
            out.append(decompressor.decompress(data))
            if not decompressor.eof:
                return b"".join(out), "gzip: the file ends before the end of the stream"
            data = decompressor.unused_data
            if not data:
                return b"".join(out), None
            decompressor = zlib.decompressobj(wbits=31)
    except zlib.error as e:
        return b"".join(out), f"gzip: corrupt data ({e})"


def _is_array(numbered: list[tuple[int, bytes]]) -> bool:
    return next((line.lstrip() for _, line in numbered if line.strip()), b"").startswith(b"[")


def _json_array(numbered: list[tuple[int, bytes]]) -> Any:
    """A whole file as one JSON document, or None when it is not JSON. Bytes that are not UTF-8 are
    kept as lone surrogates ("surrogateescape"), so that only the records holding them are refused."""
    try:
        return json.loads(b"\n".join(line for _, line in numbered).decode("utf-8", "surrogateescape"))
    except (ValueError, RecursionError):
        return None


def question_files(where: str | Location) -> list[str]:
    """The question files (`QUESTION_FILES`) at or under a place, as URIs; finding none is a FileNotFoundError."""
    files = [f for f in located(where).files() if f.endswith(QUESTION_FILES)]
    if not files:
        raise FileNotFoundError(f"no .jsonl or .parquet question files at {where}")
    return files


def parse_question_file(
    source: str, data: bytes, limits: InputLimits = NO_LIMITS, located: bool = False
) -> tuple[list[dict], list[dict]]:
    """The bytes of one question file (`QUESTION_FILES`) -> (QUESTIONS rows, QUARANTINE rows).

    Parquet by its name; otherwise JSON (bz2 by its magic bytes), an array when it starts with `[`,
    else JSON lines. A file that cannot be read at all becomes one quarantine row, so that the other
    files go on; a truncated JSON-lines file keeps the lines before the break. `limits`, `located`:
    see `question_rows`."""
    kw = {"limits": limits, "located": located}
    if source.endswith(".parquet"):
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            records = pq.read_table(pa.BufferReader(data)).to_pylist()
        except (pa.ArrowException, OSError) as e:
            return [], [_quarantine(source, -1, f"unreadable Parquet file: {e}", f"<{len(data)} bytes>")]
        return question_rows(records, source, **kw)
    numbered, truncated = _lines(data)
    cut = []
    if truncated:
        partial = truncated.partial.decode("utf-8", "replace")
        cut = [_quarantine(source, len(numbered) + 1, f"truncated stream: {truncated}", partial)]
    if _is_array(numbered):
        records = None if truncated else _json_array(numbered)
        if records is None:
            text = b"\n".join(line for _, line in numbered).decode("utf-8", "replace")
            reason = "not JSON: a truncated stream" if truncated else "not JSON: not a valid JSON array"
            return [], [_quarantine(source, -1, reason, text)]
        return question_rows(records if isinstance(records, list) else [records], source, **kw)
    parsed, unparsed = [], []
    for number, line in numbered:
        if not line.strip():
            continue
        too_large = _too_large(len(line), limits)
        if too_large:  # never parsed: a huge line costs several times its size as Python objects
            unparsed.append(_quarantine(source, number, too_large, line[:RAW_LIMIT].decode("utf-8", "replace")))
            continue
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError as e:
            reason = f"non-utf8 bytes: {e.reason} at byte {e.start}"
            unparsed.append(_quarantine(source, number, reason, line.decode("utf-8", "replace")))
            continue
        try:
            parsed.append((number, json.loads(text)))
        except json.JSONDecodeError as e:
            unparsed.append(_quarantine(source, number, f"not JSON: {e.msg}", text))
        except RecursionError:
            unparsed.append(_quarantine(source, number, "not JSON: nested too deeply", text))
    # the lines' sizes were checked above: the records are not measured again
    line_limits = InputLimits(question_chars=limits.question_chars)
    rows, quarantined = question_rows(
        [r for _, r in parsed], source, [n for n, _ in parsed], limits=line_limits, located=located
    )
    return rows, sorted(unparsed + quarantined, key=lambda row: row["position"]) + cut


def write_context_dump(questions: str | Location, dump: str | Location) -> int:
    """The union of the questions' context paragraphs as one bz2 JSON-lines shard; returns its page count.

    Ids are `ctx-<n>` in order of first appearance; a title seen twice keeps its first paragraph.
    """
    seen: set[str] = set()
    lines = []
    for record in read_json(questions):
        for title, sentences in record.get("context") or []:
            key = normalize_title(title)
            if key in seen or not sentences:
                continue
            seen.add(key)
            lines.append(
                json.dumps({"id": f"ctx-{len(lines)}", "title": title, "text": sentences, "text_with_links": sentences})
            )
    located(dump).write_bytes(bz2.compress(("\n".join(lines) + "\n").encode("utf-8")))
    return len(lines)
