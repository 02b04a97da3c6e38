"""Scheduled scoring against the real services (MLflow server, S3 endpoint, the Ray cluster): a run with
`score.incremental=true` scores only the input files the model version has not scored, and
`score.input` takes `{run_date}`."""

from __future__ import annotations

import json
import uuid

import pyarrow.dataset as pads

from tests.integration.test_score import _champion, _register, _score_overrides, scoring_world  # noqa: F401 (a fixture)
from xh.config import load_config


def _write(uri: str, questions: list[dict], prefix: str) -> set[str]:
    from xh.storage.uris import open_output

    rows = [{"qid": f"{prefix}-{i}", "question": q["question"]} for i, q in enumerate(questions)]
    with open_output(uri) as out:
        out.write(("\n".join(json.dumps(r) for r in rows) + "\n").encode())
    return {r["qid"] for r in rows}


def test_a_second_scheduled_run_over_the_same_folder_scores_only_the_new_file(
    scoring_world,  # noqa: F811
    tiny_backbone,
    mlflow_server,
    s3_endpoint,
):
    from workflows import score

    name = _champion("xh-incr", tiny_backbone, scoring_world, mlflow_server, seed=3)
    questions = scoring_world["questions"]
    incoming = f"s3://xh-test/incoming-{uuid.uuid4().hex[:6]}"
    output = f"s3://xh-test/predictions-{uuid.uuid4().hex[:6]}"
    _write(f"{incoming}/2026-11-23/a.jsonl", questions[:3], "a")
    _write(f"{incoming}/2026-11-23/b.jsonl", questions[3:5], "b")

    def run(run_date: str, *extra: str) -> dict:
        overrides = [*_score_overrides(scoring_world, mlflow_server, name, incoming, output, run_date), *extra]
        return score.run(load_config(None, overrides))

    def qids(run_date: str) -> list[str]:
        partition = f"{output}/run_date={run_date}/model={name}/version=1"[len("s3://") :]
        table = pads.dataset(partition, filesystem=s3_endpoint.pyarrow_fs(), format="parquet").to_table()
        return sorted(table["qid"].to_pylist())

    first = run("2026-11-23", "score.incremental=true")
    assert first["scored_files"] == 2 and first["skipped_files"] == 0 and first["predictions"] > 0
    scored_first = qids("2026-11-23")

    new = _write(f"{incoming}/2026-11-24/c.jsonl", questions[5:7], "c")  # the next night's delivery
    second = run("2026-11-24", "score.incremental=true")
    assert second["scored_files"] == 1 and second["skipped_files"] == 2
    assert second["records"] == len(new) and second["predictions"] > 0
    assert set(qids("2026-11-24")) <= new and len(qids("2026-11-24")) == second["predictions"]
    assert qids("2026-11-23") == scored_first  # the first night's partition untouched

    # nothing new: no stage runs, no partition is made for the date
    third = run("2026-11-25", "score.incremental=true")
    assert third["skipped_files"] == 3 and third["scored_files"] == third["predictions"] == 0
    assert third["seconds"] == {} and third["partition_rows"] == 0

    # without the flag, the folder of the run date: the day's file again, its rows replaced
    dated = run("2026-11-24", f"score.input={incoming}/{{run_date}}/")
    assert dated["scored_files"] == 1 and dated["skipped_files"] == 0
    assert dated["replaced_rows"] == second["predictions"] == dated["predictions"]
    assert dated["partition_rows"] == second["predictions"] and set(qids("2026-11-24")) <= new


def test_after_a_promotion_the_new_champion_scores_only_files_delivered_since_unless_told_to_rescore(
    scoring_world,  # noqa: F811
    tiny_backbone,
    mlflow_server,
    s3_endpoint,
):
    """The backlog rule: v1 scored a.jsonl; b.jsonl arrived before v2 became champion (v1's backlog, which
    v1 no longer scores); c.jsonl after. v2's nightly run scores c only; `score.rescore=true` the rest."""
    import time

    import mlflow

    from workflows import score

    name = _champion("xh-promoted", tiny_backbone, scoring_world, mlflow_server, seed=3)
    questions = scoring_world["questions"]
    incoming = f"s3://xh-test/incoming-{uuid.uuid4().hex[:6]}"
    output = f"s3://xh-test/predictions-{uuid.uuid4().hex[:6]}"

    def run(run_date: str, *extra: str) -> dict:
        overrides = _score_overrides(scoring_world, mlflow_server, name, incoming, output, run_date)
        return score.run(load_config(None, [*overrides, "score.incremental=true", *extra]))

    _write(f"{incoming}/a.jsonl", questions[:2], "a")
    assert run("2026-11-23")["scored_files"] == 1  # v1: the model's first version has no watermark
    _write(f"{incoming}/b.jsonl", questions[2:4], "b")
    time.sleep(1.5)  # delivery times are kept to the second
    assert _register(name, tiny_backbone, scoring_world["graphs"], mlflow_server, seed=4) == 2
    mlflow.MlflowClient().set_registered_model_alias(name, "champion", "2")
    time.sleep(1.5)
    _write(f"{incoming}/c.jsonl", questions[4:6], "c")

    night = run("2026-11-24")
    assert night["model"]["version"] == "2"
    assert (night["scored_files"], night["backlog_files"], night["skipped_files"]) == (1, 2, 0)
    assert {r.split("-")[0] for r in qids_of(output, name, "2026-11-24", 2, s3_endpoint)} <= {"c"}
    rescored = run("2026-11-24", "score.rescore=true")  # the explicit flag: the backlog too, c not again
    assert (rescored["scored_files"], rescored["backlog_files"], rescored["skipped_files"]) == (2, 0, 1)
    assert rescored["records"] == 4 and rescored["predictions"] > 0  # a's and b's questions
    assert {r.split("-")[0] for r in qids_of(output, name, "2026-11-24", 2, s3_endpoint)} - {"c"} <= {"a", "b"}
    since = run("2026-11-25", "score.since=2000-01-01")  # an explicit watermark: everything scored already
    assert since["scored_files"] == 0 and since["skipped_files"] == 3


def qids_of(output: str, name: str, run_date: str, version: int, s3_endpoint) -> list[str]:
    partition = f"{output}/run_date={run_date}/model={name}/version={version}"[len("s3://") :]
    return pads.dataset(partition, filesystem=s3_endpoint.pyarrow_fs(), format="parquet").to_table()["qid"].to_pylist()
