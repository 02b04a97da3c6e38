"""FEVER claim files -> `claims` rows (`xh.schemas.CLAIMS`), bad records quarantined with the reason.

    rows, quarantined = read_fever_claims("../shared/data/fever/paper_dev_first3000.jsonl")
    rows[0]  # {"qid": "137334", "claim": "Fox 2000 Pictures released the film Soul Food.",
             #  "label": "SUPPORTS", "evidence": [[{"page": "Soul_Food_-LRB-film-RRB-", "line": 0}]]}

    rows, quarantined = claim_rows(lines, source="claims.jsonl")   # lines already in memory (str or bytes)
    claim_split("137334", dev_fraction=0.1, test_fraction=0.1)       # "train", "dev" or "test", by id
    write_claim_split("claims.jsonl", "test", "test.jsonl", 0.1, 0.1, labels=False)  # held-out claims, as new

Splits are a stable hash of the claim id (the same on every machine and run), so that dev and test
claims are built apart from the training claims (`graphs.claims_split`) and never meet gold-first
training graphs.

A claim file is FEVER's JSON lines: `{"id", "claim", "label"?, "evidence"?, "verifiable"?}` where
`evidence` is a list of groups, each a list of `[annotation_id, evidence_id, page, line]`; a claim is
verified by all the sentences of any one group. Not-enough-info claims carry groups of
`[annotation_id, null, null, null]`, which say "no evidence" and become `evidence = []`. Identical
groups (several annotators picking the same sentences) are kept once; a claim without `evidence`
(new claims, FEVER's test set) gets `evidence = None`, and one without `label` gets `label = None`.

Every non-blank line is a record, and each record becomes one row or one quarantine row
(records = rows + quarantined; blank lines are neither). Quarantine reasons start with a stable
prefix: "non-utf8 bytes", "invalid json", "invalid record", "missing id", "duplicate id",
"missing claim", "unknown label", "bad evidence", "truncated bz2 stream" (the cut tail of a .bz2 file;
the lines before it are kept). Positions are 1-based line numbers.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from xh.schemas import RAW_LIMIT
from xh.storage.jsonfiles import is_utf8_text
from xh.storage.store import Location, located
from xh.wiki.streams import Truncated, decompressed, lines

__all__ = [
    "LABELS",
    "SUPPORTS",
    "REFUTES",
    "NOT_ENOUGH_INFO",
    "claim_rows",
    "read_fever_claims",
    "claim_split",
    "write_claim_split",
]

SUPPORTS, REFUTES, NOT_ENOUGH_INFO = "SUPPORTS", "REFUTES", "NOT ENOUGH INFO"
LABELS = (SUPPORTS, REFUTES, NOT_ENOUGH_INFO)  # the order of xh.graph.encoded.CLAIM_LABELS


class _Bad(Exception):
    """A record that cannot be used; the message is the quarantine reason."""


def read_fever_claims(file: str | Location) -> tuple[list[dict], list[dict]]:
    """A FEVER claims file (JSON lines, plain or bz2; local or s3://) -> (CLAIMS rows, QUARANTINE rows)."""
    read: list[bytes] = []
    uri = str(file)
    with located(file).open_input() as f:
        try:
            read.extend(lines(decompressed(f)))
        except Truncated as truncated:  # the lines before the break are kept; the break is quarantined
            rows, quarantined = claim_rows(read, uri)
            cut = _quarantine(
                uri, len(read) + 1, f"truncated bz2 stream: {truncated}", truncated.partial.decode("utf-8", "replace")
            )
            return rows, [*quarantined, cut]
    return claim_rows(read, uri)


def claim_rows(lines: Iterable[str | bytes], source: str) -> tuple[list[dict], list[dict]]:
    """FEVER JSON lines -> (CLAIMS rows, QUARANTINE rows); every non-blank line lands in exactly one."""
    rows: list[dict] = []
    quarantined: list[dict] = []
    seen: set[str] = set()
    for number, line in enumerate(lines, start=1):
        if isinstance(line, bytes):
            try:
                line = line.decode("utf-8")
            except UnicodeDecodeError as e:
                raw = line.decode("utf-8", "replace")
                quarantined.append(_quarantine(source, number, f"non-utf8 bytes: {e.reason} at byte {e.start}", raw))
                continue
        if not line.strip():
            continue
        try:
            row = _claim_row(line)
            if row["qid"] in seen:
                raise _Bad(f"duplicate id: {row['qid']}")
        except _Bad as bad:
            quarantined.append(_quarantine(source, number, str(bad), line))
            continue
        seen.add(row["qid"])
        rows.append(row)
    return rows, quarantined


def _quarantine(source: str, position: int, reason: str, raw: str) -> dict:
    return {"source": source, "position": position, "reason": reason, "raw": raw.rstrip("\r\n")[:RAW_LIMIT]}


def _claim_row(line: str) -> dict:
    try:
        record = json.loads(line)
    except (ValueError, RecursionError) as e:
        raise _Bad(f"invalid json: {getattr(e, 'msg', e)}") from None
    if not isinstance(record, dict):
        raise _Bad(f"invalid record: a JSON {type(record).__name__}, not an object")
    if ("\\ud" in line or "\\uD" in line) and not is_utf8_text(record):
        raise _Bad("non-utf8 bytes: unpaired surrogate in a string")  # JSON's escaped half pair: Parquet refuses it
    qid = record.get("id")
    if isinstance(qid, bool) or not isinstance(qid, (str, int)) or not str(qid).strip():
        raise _Bad("missing id")
    claim = record.get("claim")
    if not isinstance(claim, str) or not claim.strip():
        raise _Bad("missing claim")
    label = record.get("label")
    if label is not None and label not in LABELS:
        raise _Bad(f"unknown label: {str(label)[:40]!r}")
    evidence = _evidence(record["evidence"], label) if record.get("evidence") is not None else None
    return {"qid": str(qid).strip(), "claim": claim.strip(), "label": label, "evidence": evidence}


def _evidence(value: Any, label: str | None) -> list[list[dict]]:
    """FEVER's evidence groups -> [[{page, line}, ...], ...]: groups of null sentences dropped, repeats kept once."""
    if not isinstance(value, list):
        raise _Bad("bad evidence: not a list of groups")
    groups: list[list[dict]] = []
    for group in value:
        if not isinstance(group, list):
            raise _Bad("bad evidence: a group is not a list")
        sentences = [_sentence(item) for item in group]
        known = [s for s in sentences if s is not None]
        if known and len(known) < len(sentences):
            raise _Bad("bad evidence: a group mixes sentences and null entries")
        if known:
            known = list({(s["page"], s["line"]): s for s in known}.values())  # a sentence named twice: once
            if known not in groups:
                groups.append(known)
    if label == NOT_ENOUGH_INFO and groups:
        raise _Bad("bad evidence: a NOT ENOUGH INFO claim with evidence sentences")
    if label in (SUPPORTS, REFUTES) and not groups:
        raise _Bad(f"bad evidence: a {label} claim without evidence sentences")
    return groups


def _sentence(item: Any) -> dict | None:
    """`[annotation_id, evidence_id, page, line]` -> {page, line}, or None for FEVER's "no evidence" entry."""
    if not isinstance(item, list) or len(item) != 4:
        raise _Bad("bad evidence: an entry is not [annotation_id, evidence_id, page, line]")
    page, line = item[2], item[3]
    if page is None and line is None:
        return None
    if not isinstance(page, str) or not page.strip():
        raise _Bad(f"bad evidence: page {page!r} is not a page id")
    if isinstance(line, bool) or not isinstance(line, int) or not 0 <= line < 2**31:
        raise _Bad(f"bad evidence: line {line!r} of {page} is not a line number")
    return {"page": page.strip(), "line": line}


def claim_split(qid: str, dev_fraction: float, test_fraction: float) -> str:
    """ "dev", "test" or "train" for a claim id: the one split rule (`xh.train.split.split_of`), whose
    gate share FEVER calls its test claims."""
    from xh.train.split import split_of

    part = split_of(qid, dev_fraction, test_fraction)
    return "test" if part == "gate" else part


def write_claim_split(
    claims: str | Location,
    split: str,
    out: str | Location,
    dev_fraction: float,
    test_fraction: float,
    *,
    labels: bool = True,
) -> int:
    """The claims of one split as a FEVER JSON-lines file (gold for `xh eval fever`, or without labels
    and evidence as new claims for `xh score`); returns how many. Quarantined records are left out."""
    rows, _ = read_fever_claims(claims)
    lines = []
    for row in rows:
        if claim_split(row["qid"], dev_fraction, test_fraction) != split:
            continue
        record: dict[str, Any] = {"id": row["qid"], "claim": row["claim"]}
        if labels:
            groups = [[[None, None, s["page"], s["line"]] for s in group] for group in row["evidence"] or []]
            record |= {"label": row["label"], "evidence": groups or [[[None, None, None, None]]]}
        lines.append(json.dumps(record))
    located(out).write_bytes("".join(line + "\n" for line in lines).encode("utf-8"))
    return len(lines)
