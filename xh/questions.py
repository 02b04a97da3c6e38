"""Question files -> `questions` rows, and HotpotQA context paragraphs -> a wiki dump.

    rows, quarantined = read_hotpot_questions("hotpot_train_sample500.json")
    rows, quarantined = parse_question_file("incoming/2026-11-22.jsonl", data)   # bytes of any question file
    write_context_dump("hotpot_train_sample500.json", "runs/hotpot500/wiki/contexts.jsonl.bz2")

This is the one place that reads question records. A HotpotQA question file is the official JSON
array (`_id, question, answer?, type?, level?, supporting_facts?, context?`); batch scoring also
reads JSON lines and Parquet (`QUESTION_FILES`), one record per line or row, with `qid` (or `_id`,
`id`) and `question` (FEVER's `claim`). Records that cannot be used are quarantined with the reason, never dropped:

    not JSON: ...                   a JSON-lines line (or a whole JSON file) that does not parse
    unreadable Parquet file: ...    a Parquet file that does not open (one row for the file)
    invalid record: not an object   a record that is not a JSON object
    missing id / empty question / duplicate id / invalid supporting facts: ...

Positions count from 1 (the line of a JSON-lines file, the record of an array, the row of a Parquet
file); -1 stands for the whole file. Supporting-fact titles go through the one title normalisation,
so they meet the `docs` table's titles.

`write_context_dump` turns the union of the file's context paragraphs into the HotpotQA
processed-Wikipedia format, so the distractor setting's paragraphs become a corpus that
`xh wiki process` reads like any other dump.
"""

from __future__ import annotations

import bz2
import json
from collections.abc import Sequence
from typing import Any

from xh.jsonfiles import json_lines, read_json
from xh.schemas import RAW_LIMIT
from xh.storage import S3Settings, list_files, open_output
from xh.wiki.titles import normalize_title

# What batch scoring takes as question files (Ray decompresses .gz and .bz2 by extension).
QUESTION_FILES = (".jsonl", ".json", ".parquet", ".jsonl.gz", ".jsonl.bz2")


def _quarantine(source: str, position: int, reason: str, record: Any) -> dict:
    """A QUARANTINE row; `record` is the parsed record, or the text that could not be parsed."""
    raw = record if isinstance(record, str) else json.dumps(record, default=str)
    return {"source": source, "position": position, "reason": reason, "raw": raw[:RAW_LIMIT]}


def _supporting_facts(value: Any) -> list[dict] | None:
    if value is None:
        return None
    facts = []
    for fact in value:
        if not (isinstance(fact, (list, tuple)) and len(fact) == 2 and isinstance(fact[1], int)):
            raise ValueError(f"supporting fact {fact!r} is not [title, sentence index]")
        facts.append({"title": normalize_title(str(fact[0])), "sent": fact[1]})
    return facts


# The one JSON loader, under the name this module's users know.
load_json = read_json


def record_id(record: dict):
    """A question record's id: `_id` (HotpotQA), `qid` (batch scoring's files) or `id`."""
    return record.get("_id") or record.get("qid") or record.get("id")


def question_rows(records: list, source: str, positions: Sequence[int] | None = None) -> tuple[list[dict], list[dict]]:
    """Question records -> (QUESTIONS rows, QUARANTINE rows); every record lands in exactly one.

    `positions`: each record's position in its file (default: 1, 2, ...)."""
    rows, quarantined, seen = [], [], set()
    for position, record in zip(positions or range(1, len(records) + 1), records):
        if not isinstance(record, dict):
            quarantined.append(_quarantine(source, position, "invalid record: not an object", record))
            continue
        qid, question = record_id(record), record.get("question", record.get("claim"))  # FEVER: claim
        if not qid:
            quarantined.append(_quarantine(source, position, "missing id", record))
        elif not isinstance(question, str) or not question.strip():
            quarantined.append(_quarantine(source, position, "empty question", record))
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
            rows.append(
                {
                    "qid": str(qid),
                    "question": question.strip(),
                    "answer": None if answer is None else str(answer),
                    "type": record.get("type"),
                    "level": record.get("level"),
                    "supporting_facts": facts,
                }
            )
    return rows, quarantined


def read_hotpot_questions(uri: str, s3: S3Settings | None = None) -> tuple[list[dict], list[dict]]:
    """A HotpotQA question file (a JSON array); a file that is not one is an error, not quarantine."""
    records = read_json(uri, s3)
    if not isinstance(records, list):
        raise ValueError(f"{uri} is not a HotpotQA question file (a JSON array of questions)")
    return question_rows(records, uri)


def question_files(uri: str, s3: S3Settings | None = None) -> list[str]:
    """The question files (`QUESTION_FILES`) at or under a URI; finding none is a FileNotFoundError."""
    files = [f for f in list_files(uri, s3) if f.endswith(QUESTION_FILES)]
    if not files:
        raise FileNotFoundError(f"no .jsonl or .parquet question files at {uri}")
    return files


def parse_question_file(source: str, data: bytes) -> tuple[list[dict], list[dict]]:
    """The bytes of one question file (`QUESTION_FILES`) -> (QUESTIONS rows, QUARANTINE rows).

    Parquet by its name; otherwise JSON, an array when it starts with `[`, else JSON lines. A file
    that cannot be read at all becomes one quarantine row, so that the other files go on."""
    if source.endswith(".parquet"):
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            records = pq.read_table(pa.BufferReader(data)).to_pylist()
        except (pa.ArrowException, OSError) as e:
            return [], [_quarantine(source, -1, f"unreadable Parquet file: {e}", f"<{len(data)} bytes>")]
        return question_rows(records, source)
    text = data.decode("utf-8", errors="replace")  # a bad byte spoils one question, not the file
    if text.lstrip().startswith("["):
        try:
            records = json.loads(text)
        except json.JSONDecodeError as e:
            return [], [_quarantine(source, -1, f"not JSON: {e.msg}", text)]
        return question_rows(records, source)
    parsed, unparsed = [], []
    for number, record, error in json_lines(text):
        if error is None:
            parsed.append((number, record))
        else:
            unparsed.append(_quarantine(source, number, f"not JSON: {error.msg}", record))
    rows, quarantined = question_rows([r for _, r in parsed], source, [n for n, _ in parsed])
    return rows, sorted(unparsed + quarantined, key=lambda row: row["position"])


def write_context_dump(questions_uri: str, dump_uri: str, s3: S3Settings | None = None) -> int:
    """The union of the questions' context paragraphs as one bz2 JSON-lines shard; returns its page count.

    Ids are `ctx-<n>` in order of first appearance; a title seen twice keeps its first paragraph.
    """
    seen: set[str] = set()
    lines = []
    for record in read_json(questions_uri, s3):
        for title, sentences in record.get("context") or []:
            key = normalize_title(title)
            if key in seen or not sentences:
                continue
            seen.add(key)
            lines.append(
                json.dumps({"id": f"ctx-{len(lines)}", "title": title, "text": sentences, "text_with_links": sentences})
            )
    with open_output(dump_uri, s3) as f:
        f.write(bz2.compress(("\n".join(lines) + "\n").encode("utf-8")))
    return len(lines)
