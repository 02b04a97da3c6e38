"""Batch scoring's inputs and outputs without Ray (#28): the resume fingerprint reads the files' content,
records over the size limits are quarantined, an id in two files is scored from the later one, and a
partitions: tests/unit/test_partitions.py."""

from __future__ import annotations

import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from xh import schemas
from xh.config import ConfigError, load_config
from xh.inputs.questions import InputLimits, later_files, parse_question_file
from xh.storage.store import Store
from xh.storage.tables import fingerprint

# --- the resume fingerprint ------------------------------------------------------------------------


def test_a_file_replaced_by_one_of_the_same_size_with_its_time_set_back_gets_another_fingerprint(tmp_path):
    question_file = tmp_path / "q.jsonl"
    question_file.write_text('{"qid": "1", "question": "Who wrote it?"}\n')
    times = os.stat(question_file)
    before = fingerprint({"batch_graphs": 8}, [Store().at(str(question_file))])

    question_file.write_text('{"qid": "1", "question": "Who drove it?"}\n')  # the same number of bytes
    os.utime(question_file, ns=(times.st_atime_ns, times.st_mtime_ns))
    after = os.stat(question_file)
    assert (after.st_size, after.st_mtime_ns) == (times.st_size, times.st_mtime_ns)
    assert fingerprint({"batch_graphs": 8}, [Store().at(str(question_file))]) != before

    question_file.write_text('{"qid": "1", "question": "Who wrote it?"}\n')  # the first content again
    assert fingerprint({"batch_graphs": 8}, [Store().at(str(question_file))]) == before


# --- size limits -----------------------------------------------------------------------------------

LIMITS = InputLimits(question_chars=100, record_bytes=1_000)


def test_questions_and_records_over_the_limits_are_quarantined_in_every_format():
    records = [
        {"qid": "ok", "question": "Which film came out first?"},
        {"qid": "long", "question": "Which " * 40 + "film?"},  # 245 characters
        {"qid": "big", "question": "Short?", "context": "x" * 5_000},
        {"qid": "edge", "question": "w" * 100},  # at the limit: kept
    ]
    reasons = {
        2: "question too long: 245 characters (limit 100)",
        3: "record too large: ",
    }
    lines = ("\n".join(json.dumps(r) for r in records) + "\n").encode()
    sink = pa.BufferOutputStream()
    pq.write_table(pa.Table.from_pylist([{"qid": r["qid"], "question": r["question"]} for r in records]), sink)
    for name, data in (
        ("in.jsonl", lines),
        ("in.json", json.dumps(records).encode()),
        ("in.parquet", sink.getvalue().to_pybytes()),
    ):
        rows, quarantined = parse_question_file(name, data, LIMITS)
        big = name != "in.parquet"  # the Parquet file holds no context column
        assert [r["qid"] for r in rows] == (["ok", "edge"] if big else ["ok", "big", "edge"]), name
        assert len(rows) + len(quarantined) == len(records)
        assert [q["position"] for q in quarantined] == ([2, 3] if big else [2])
        for q in quarantined:
            assert q["reason"].startswith(reasons[q["position"]]) and q["source"] == name
            assert len(q["raw"]) <= schemas.RAW_LIMIT
        pa.Table.from_pylist(rows, schema=schemas.QUESTIONS)
        pa.Table.from_pylist(quarantined, schema=schemas.QUARANTINE)

    # without limits (the default of the function) nothing is refused for its size
    rows, quarantined = parse_question_file("in.jsonl", lines)
    assert len(rows) == len(records) and not quarantined


def test_a_json_line_over_the_record_limit_is_refused_with_its_size_before_it_is_parsed():
    huge = b'{"qid": "huge", "question": "' + b"a" * 50_000 + b'"'  # not even valid JSON: never parsed
    rows, quarantined = parse_question_file("in.jsonl", b'{"qid": "a", "question": "Who?"}\n' + huge + b"\n", LIMITS)
    assert [r["qid"] for r in rows] == ["a"]
    assert [(q["position"], q["reason"]) for q in quarantined] == [
        (2, f"record too large: {len(huge)} bytes (limit 1000)")
    ]
    assert quarantined[0]["raw"].startswith('{"qid": "huge"') and len(quarantined[0]["raw"]) == schemas.RAW_LIMIT


def test_the_limits_are_config_settings_with_defaults_and_can_be_lifted():
    score = load_config(None, []).score
    assert score.max_question_chars == 2000 and score.max_record_bytes == 1_000_000 and score.replace is False
    lifted = load_config(None, ["score.max_question_chars=null", "score.max_record_bytes=5000"]).score
    assert lifted.max_question_chars is None and lifted.max_record_bytes == 5000
    with pytest.raises(ConfigError, match="fail_before"):  # fault injection is a test fixture, not a setting
        load_config(None, ["score.fail_before=inference"])


# --- ids across files ------------------------------------------------------------------------------


def test_an_id_in_several_files_is_scored_from_the_file_last_in_name_order():
    first, _ = parse_question_file("in/2026-11-21.jsonl", b'{"qid": "a", "question": "A?"}\n', located=True)
    assert first == [
        {
            "qid": "a",
            "question": "A?",
            "answer": None,
            "type": None,
            "level": None,
            "supporting_facts": None,
            "source": "in/2026-11-21.jsonl",
            "position": 1,
        }
    ]
    rows = pa.Table.from_pylist(
        [
            {"qid": "a", "source": "in/2026-11-22.jsonl"},
            {"qid": "a", "source": "in/2026-11-21.jsonl"},
            {"qid": "b", "source": "in/2026-11-21.jsonl"},
            {"qid": "c", "source": "in/2026-11-21.jsonl"},
            {"qid": "c", "source": "in/2026-11-23.jsonl"},
            {"qid": "c", "source": "in/2026-11-22.jsonl"},
        ]
    )
    assert later_files(rows) == {"a": "in/2026-11-22.jsonl", "c": "in/2026-11-23.jsonl"}


# --- graphs of repeated ids ----------------------------------------------------------------------


def test_two_questions_of_one_id_in_a_batch_never_share_evidence(synth_tables):
    """The graph half keys candidates by qid: a repeated id in one call keeps the first question alone."""
    from tests.helpers import tables_retriever
    from xh.pipeline import Pipeline, settings_of

    tables, world = synth_tables
    retrieval, graph = settings_of(load_config(None, []))
    retriever = tables_retriever(tables, retrieval)
    pipeline = Pipeline(retriever, str(tables), graph)

    first, second = world[0]["question"], world[7]["question"]
    graphs, quarantined = pipeline.graphs([{"qid": "x", "question": q, "type": None} for q in (first, second)])
    own = {row["doc_id"] for row in retriever.candidates(["x"], [first])}
    assert [g["question"] for g in graphs] == [first]
    assert {node["doc_id"] for node in graphs[0]["nodes"]} <= own
    assert [(q["reason"], json.loads(q["raw"])["question"]) for q in quarantined] == [("duplicate id", second)]


# --- blocks for the actor pools --------------------------------------------------------------------


def test_a_stage_goes_to_its_pool_in_blocks_of_at_most_the_batch_size_a_multiple_of_the_actors():
    from xh.stages.score_actors import block_count

    assert block_count(1000, 64, 4) == 16  # 16 blocks of at most 64 rows, 4 rounds of 4 actors
    assert block_count(1000, 250, 3) == 6  # 4 blocks would leave one actor working alone in a last round
    assert block_count(5000, 250, 4) == 20
    assert block_count(2, 64, 4) == 2  # never more blocks than rows
    assert block_count(0, 64, 4) == 1  # an empty stage is one (empty) block
