"""Bad input never fails a whole run (#19): bad records are quarantined with a reason before Arrow sees
them (records = rows + quarantined), and what only a user can fix is one line and exit 2."""

from __future__ import annotations

import bz2
import gzip
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.cli import xh
from xh import schemas
from xh.inputs.claims import read_fever_claims
from xh.inputs.questions import parse_question_file, question_rows, read_hotpot_questions
from xh.storage.store import located
from xh.storage.tables import GRAPHS, staged
from xh.storage.uris import S3Settings, StorageSettingsError, resolve


def _arrow_accepts(rows: list[dict], quarantined: list[dict]) -> None:
    """What the stages do next: both lists become Arrow tables (a wrong type or bad text would raise here)."""
    pa.Table.from_pylist(rows, schema=schemas.QUESTIONS)
    pa.Table.from_pylist(quarantined, schema=schemas.QUARANTINE)


def _question_lines(count: int) -> list[str]:
    return [json.dumps({"qid": f"q{i}", "question": f"Which film came out in {1900 + i}?"}) for i in range(count)]


def test_wrong_typed_fields_are_quarantined_with_their_reason_and_the_rest_kept():
    records = [
        {"_id": "ok", "question": "Who?", "answer": "Ann", "type": "bridge", "level": "hard"},
        {"_id": "num-answer", "question": "How many?", "answer": 3},
        {"_id": "t", "question": "Who?", "type": 5},
        {"_id": "l", "question": "Who?", "level": ["hard"]},
        {"_id": "a", "question": "Who?", "answer": {"text": "x"}},
        {"_id": "b", "question": "Who?", "type": True},
        {"_id": ["x"], "question": "Who?"},
        {"_id": "f", "question": "Who?", "supporting_facts": [[5, 0]]},
        {"_id": "q", "question": 42},
        {"_id": "ok", "question": "Again?"},
    ]
    rows, quarantined = question_rows(records, "q.json")
    assert [r["qid"] for r in rows] == ["ok", "num-answer"] and rows[1]["answer"] == "3"
    reasons = {q["position"]: q["reason"] for q in quarantined}
    assert reasons == {
        3: "invalid type: a number",
        4: "invalid level: an array",
        5: "invalid answer: an object",
        6: "invalid type: a boolean",
        7: "invalid id: an array",
        8: reasons[8],
        9: "empty question",
        10: "duplicate id",
    }
    assert reasons[8].startswith("invalid supporting facts")
    assert len(rows) + len(quarantined) == len(records)
    _arrow_accepts(rows, quarantined)


def test_non_utf8_lines_and_strings_are_quarantined_never_scored_as_replacement_characters():
    lines = [line.encode() for line in _question_lines(4)]
    lines[1] = b'{"qid": "latin1", "question": "Caf\xe9 owner?"}'  # not UTF-8: a Latin-1 byte
    lines[2] = b'{"qid": "half", "question": "A \\ud800 pair?"}'  # JSON's escaped half surrogate pair
    rows, quarantined = parse_question_file("in.jsonl", b"\n".join(lines))
    assert [r["qid"] for r in rows] == ["q0", "q3"]
    assert [(q["position"], q["reason"].split(":")[0]) for q in quarantined] == [
        (2, "non-utf8 bytes"),
        (3, "non-utf8 text"),
    ]
    assert not any("\ufffd" in r["question"] for r in rows)
    _arrow_accepts(rows, quarantined)

    array = b'[{"_id": "a", "question": "Caf\xe9?"}, {"_id": "b", "question": "Fine?"}]'  # one bad record
    rows, quarantined = parse_question_file("in.json", array)
    assert [r["qid"] for r in rows] == ["b"] and [q["reason"] for q in quarantined] == ["non-utf8 text"]
    assert "\\udce9" in quarantined[0]["raw"]  # the bad byte shown escaped in the quarantine table
    _arrow_accepts(rows, quarantined)


def _bz2(data: bytes) -> bytes:
    return bz2.compress(data, compresslevel=1)  # 100 kB blocks: a cut file keeps its first blocks


@pytest.mark.parametrize("compress", [_bz2, gzip.compress], ids=["bz2", "gzip"])
def test_a_truncated_compressed_question_file_keeps_the_lines_before_the_break(compress):
    lines = _question_lines(5_000)
    data = compress(("\n".join(lines) + "\n").encode())
    whole, nothing_lost = parse_question_file("in.jsonl.bz2", data)
    assert len(whole) == len(lines) and not nothing_lost

    rows, quarantined = parse_question_file("in.jsonl.bz2", data[: len(data) * 3 // 4])
    assert 0 < len(rows) < len(lines) and [r["qid"] for r in rows] == [f"q{i}" for i in range(len(rows))]
    assert len(quarantined) == 1 and quarantined[0]["reason"].startswith("truncated stream")
    assert quarantined[0]["position"] == len(rows) + 1  # records read = rows + quarantined
    _arrow_accepts(rows, quarantined)


def test_empty_and_all_bad_files_give_empty_results_not_errors():
    assert parse_question_file("empty.jsonl", b"") == ([], [])
    rows, quarantined = parse_question_file("bad.jsonl", b'{not json\n{"qid": "x", "type": 1}\n')
    assert rows == [] and [q["reason"].split(":")[0] for q in quarantined] == ["not JSON", "empty question"]
    _arrow_accepts(rows, quarantined)


def test_retrieval_question_file_quarantines_bad_records_and_refuses_a_broken_file_in_one_line(
    tmp_path, capsys, monkeypatch
):
    import workflows.retrieve

    good = tmp_path / "q.json"
    good.write_bytes(b'[{"_id": "a", "question": "Caf\xe9?", "level": 3}, {"_id": "b", "question": "Fine?"}]')
    rows, quarantined = read_hotpot_questions(str(good))
    assert [r["qid"] for r in rows] == ["b"] and [q["reason"] for q in quarantined] == ["non-utf8 text"]

    cut = tmp_path / "cut.json.bz2"
    cut.write_bytes(bz2.compress(json.dumps([{"_id": "a", "question": "Q?"}] * 50).encode())[:-20])
    for broken, message in ((cut, "truncated compressed file"), (tmp_path / "obj.json", "not a HotpotQA question")):
        if broken.suffix == ".json":
            broken.write_text('{"_id": "a"}')
        monkeypatch.setattr(workflows.retrieve, "all_steps", lambda cfg, f=broken: read_hotpot_questions(str(f)))
        with pytest.raises(SystemExit) as exit_:
            xh("retrieve", "all")
        assert exit_.value.code == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: ") and message in err and "\n" not in err and "Traceback" not in err


def test_a_truncated_claims_file_keeps_its_good_lines_and_quarantines_the_break(tmp_path):
    nei = {"label": "NOT ENOUGH INFO", "evidence": [[[1, None, None, None]]]}
    claims = [{"id": i, "claim": f"Claim number {i} is here.", **nei} for i in range(5_000)]
    lines = [json.dumps(c) for c in claims]
    lines[2] = '{"id": "half", "claim": "A \\udc80 claim."}'
    data = _bz2(("\n".join(lines) + "\n").encode())
    path = tmp_path / "claims.jsonl.bz2"
    path.write_bytes(data[: len(data) * 3 // 4])
    rows, quarantined = read_fever_claims(str(path))
    assert 0 < len(rows) < len(lines)
    assert [q["reason"].split(":")[0] for q in quarantined] == ["non-utf8 bytes", "truncated bz2 stream"]
    assert quarantined[-1]["position"] == len(rows) + len(quarantined)  # every line read is in one of the two
    pa.Table.from_pylist(rows, schema=schemas.CLAIMS)


def test_s3_without_an_endpoint_or_any_aws_setting_is_a_one_line_error_naming_the_setting(tmp_path):
    nothing = S3Settings.from_env({"HOME": str(tmp_path)})
    with pytest.raises(StorageSettingsError, match="storage.s3_endpoint_url"):
        resolve("s3://bucket/incoming", nothing)
    # public AWS is what is meant once a region or AWS credentials are configured
    for env in ({"AWS_REGION": "eu-west-1"}, {"AWS_WEB_IDENTITY_TOKEN_FILE": "/var/run/token"}):
        assert resolve("s3://bucket/x", S3Settings.from_env({"HOME": str(tmp_path), **env}))[1] == "bucket/x"
    (tmp_path / ".aws").mkdir()
    (tmp_path / ".aws" / "credentials").write_text("[default]\n")
    assert S3Settings.from_env({"HOME": str(tmp_path)}).aws
    assert S3Settings.from_env({"HOME": "/nonexistent", "AWS_ENDPOINT_URL": "http://127.0.0.1:1"}).endpoint_url


def test_the_score_driver_says_which_s3_setting_is_missing_and_exits_2(tmp_path, monkeypatch, capsys):
    for var in ("XH_S3_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "MLFLOW_S3_ENDPOINT_URL"):
        monkeypatch.delenv(var, raising=False)
    for var in ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ACCESS_KEY_ID", "AWS_PROFILE", "AWS_SHARED_CREDENTIALS_FILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(SystemExit) as exit_:
        xh("score", "--set", "score.input=s3://incoming/2026-11-22/", "--set", "score.model=models:/m@champion")
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: s3://incoming/2026-11-22/: no S3 endpoint configured") and "\n" not in err


def _graphs_folder(folder, drop: str | None) -> None:
    schema = schemas.GRAPHS if drop is None else schemas.GRAPHS.remove(schemas.GRAPHS.get_field_index(drop))
    with staged(located(folder), kind=GRAPHS) as stage:
        (folder.parent / stage.uri).mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pylist([], schema=schema), str(folder.parent / stage.uri / "part-00000.parquet"))
        stage.rows = 0


@pytest.mark.parametrize("stage", ["train", "promote"])
def test_a_graphs_folder_missing_a_column_is_refused_in_one_line_before_ray_starts(
    stage, tmp_path, capsys, monkeypatch
):
    import ray

    from workflows import train

    # the whole suite's session cluster may already be up: watch the driver's own calls instead
    monkeypatch.setattr(train, "init_ray", lambda cfg: pytest.fail("Ray started before the schema check"))
    monkeypatch.setattr(ray, "init", lambda *a, **k: pytest.fail("Ray started before the schema check"))

    graphs = tmp_path / "graphs" / "hotpot"
    _graphs_folder(graphs, drop="edges")
    argv = ["--set", f"storage.root={tmp_path}", "--set", f"mlflow.tracking_uri=sqlite:///{tmp_path}/m.db"]
    argv += ["--set", f"promote.eval_set={graphs}"] if stage == "promote" else []  # promotion has no default folder
    with pytest.raises(SystemExit) as exit_:
        xh(stage, *argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "lacks column(s) edges" in err and "\n" not in err
    assert not (tmp_path / "m.db").exists()  # refused before MLflow was touched

    _graphs_folder(graphs, drop=None)  # the complete schema passes the check
    from xh.graph.store import require_graphs

    require_graphs(str(graphs))
