"""The official metrics of HotpotQA and FEVER, re-implemented so that they give the same numbers.

    hotpot.py   `hotpot_evaluate_v1.py`: answer EM / F1, supporting-fact EM / F1, joint; per question type
    fever.py    the FEVER scorer (`fever_score`, at most 5 evidence): FEVER score, label accuracy,
                evidence precision / recall / F1; per single- / multi-evidence claims

    from xh.eval.hotpot import evaluate_hotpot_files
    evaluate_hotpot_files("hotpot_dev_distractor_v1.json", "pred.json")   # {"em": ..., "joint_f1": ...}

Both read local paths or s3:// URIs. A file that cannot be read or does not have the expected shape
raises `EvalInputError` with a one-line message (the `xh eval` CLI prints it and exits with 2).
Importing this package loads nothing else.
"""

from __future__ import annotations

import json
from typing import Any


class EvalInputError(ValueError):
    """A gold or prediction file that is missing or malformed, explained in one line."""


def read_json(uri: str) -> Any:
    """One JSON document (local path or s3://)."""
    text = _read_text(uri)
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise EvalInputError(f"{uri} is not valid JSON ({e})") from None


def read_jsonl(uri: str) -> list[tuple[int, Any]]:
    """JSON lines as (line number, record); blank lines are skipped, so numbers follow the file."""
    records = []
    for number, line in enumerate(_read_text(uri).splitlines(), start=1):
        if not line.strip():
            continue
        try:
            records.append((number, json.loads(line)))
        except json.JSONDecodeError as e:
            raise EvalInputError(f"{uri} line {number} is not valid JSON ({e})") from None
    return records


def _read_text(uri: str) -> str:
    from xh.storage import open_input  # pyarrow only when a file is read

    try:
        with open_input(uri) as stream:
            data = stream.read()
    except FileNotFoundError:
        raise EvalInputError(f"no such file: {uri}") from None
    except OSError as e:
        raise EvalInputError(f"cannot read {uri}: {str(e).splitlines()[0]}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise EvalInputError(f"{uri} is not UTF-8 text ({e.reason} at byte {e.start})") from None
