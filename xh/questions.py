"""HotpotQA question files -> `questions` rows, and their context paragraphs -> a wiki dump.

    rows, quarantined = read_hotpot_questions("hotpot_train_sample500.json")
    write_context_dump("hotpot_train_sample500.json", "runs/hotpot500/wiki/contexts.jsonl.bz2")

A question file is the official JSON array (`_id, question, answer?, type?, level?,
supporting_facts?, context?`); records that cannot be used (no id, an empty question, a repeated id,
malformed supporting facts) are quarantined with the reason, never dropped. Supporting-fact titles
go through the one title normalisation, so they meet the `docs` table's titles.

`write_context_dump` turns the union of the file's context paragraphs into the HotpotQA
processed-Wikipedia format, so the distractor setting's paragraphs become a corpus that
`xh wiki process` reads like any other dump.
"""

from __future__ import annotations

import bz2
import json
from typing import Any

from xh.schemas import RAW_LIMIT
from xh.storage import S3Settings, open_input, open_output
from xh.wiki.titles import normalize_title


def _quarantine(source: str, position: int, reason: str, record: Any) -> dict:
    return {"source": source, "position": position, "reason": reason, "raw": json.dumps(record)[:RAW_LIMIT]}


def _supporting_facts(value: Any) -> list[dict] | None:
    if value is None:
        return None
    facts = []
    for fact in value:
        if not (isinstance(fact, (list, tuple)) and len(fact) == 2 and isinstance(fact[1], int)):
            raise ValueError(f"supporting fact {fact!r} is not [title, sentence index]")
        facts.append({"title": normalize_title(str(fact[0])), "sent": fact[1]})
    return facts


def load_json(uri: str, s3: S3Settings | None = None) -> Any:
    with open_input(uri, s3) as f:
        data = f.read()
    if data[:3] == b"BZh":
        data = bz2.decompress(data)
    try:
        return json.loads(data)
    except json.JSONDecodeError as e:
        raise ValueError(f"{uri} is not valid JSON: {e}") from None


def question_rows(records: list, source: str) -> tuple[list[dict], list[dict]]:
    """HotpotQA records -> (QUESTIONS rows, QUARANTINE rows); every record lands in exactly one."""
    rows, quarantined, seen = [], [], set()
    for position, record in enumerate(records, start=1):
        if not isinstance(record, dict):
            quarantined.append(_quarantine(source, position, "invalid record: not an object", record))
            continue
        qid, question = record.get("_id") or record.get("id"), record.get("question")
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
    records = load_json(uri, s3)
    if not isinstance(records, list):
        raise ValueError(f"{uri} is not a HotpotQA question file (a JSON array of questions)")
    return question_rows(records, uri)


def write_context_dump(questions_uri: str, dump_uri: str, s3: S3Settings | None = None) -> int:
    """The union of the questions' context paragraphs as one bz2 JSON-lines shard; returns its page count.

    Ids are `ctx-<n>` in order of first appearance; a title seen twice keeps its first paragraph.
    """
    seen: set[str] = set()
    lines = []
    for record in load_json(questions_uri, s3):
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
