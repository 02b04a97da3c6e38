"""Rules every serving path shares: a record for the other task (or with both fields) is refused by
`question_rows`, the index manifest names its tables folder absolutely, and the Serve app's deployments
autoscale as the config says."""

from __future__ import annotations

import json
import os

from xh.config import load_config
from xh.inputs.questions import question_rows


def test_question_rows_refuse_the_other_tasks_field_and_a_record_with_both():
    records = [
        {"id": "a", "question": "Who?", "claim": "A claim."},
        {"id": "b", "claim": "A claim."},
        {"id": "c", "question": "Who?"},
    ]
    rows, refused = question_rows(records, "request", task="hotpot")
    assert [r["qid"] for r in rows] == ["c"]
    assert [r["reason"] for r in refused] == [
        "both a question and a claim: give one",
        "a claim to a HotpotQA version: it answers questions (give `question`)",
    ]
    rows, refused = question_rows(records, "request", task="fever")
    assert [r["qid"] for r in rows] == ["b"] and refused[1]["reason"].startswith("a question to a FEVER version")
    assert len(question_rows(records, "request")[0]) == 3  # batch scoring's files: no task check


def test_the_index_manifest_names_a_relative_tables_folder_by_its_absolute_path(tmp_path, monkeypatch):
    from xh.retrieval.bm25 import CorpusStats
    from xh.retrieval.index import read_manifest, write_manifest

    monkeypatch.chdir(tmp_path)
    stats = CorpusStats(num_docs=1, total_length=3, doc_freqs={"a": 1})
    write_manifest(str(tmp_path / "index"), stats, [], docs_uri="runs/tables", index_titles=True)
    monkeypatch.chdir(os.sep)  # read from another working folder, as a served version is
    assert read_manifest(str(tmp_path / "index"))["docs"] == str(tmp_path / "runs" / "tables")
    write_manifest(str(tmp_path / "s3index"), stats, [], docs_uri="s3://bucket/tables", index_titles=True)
    assert json.loads((tmp_path / "s3index" / "manifest.json").read_text())["docs"] == "s3://bucket/tables"


def test_the_graph_and_model_deployments_autoscale_between_the_configured_replicas():
    from xh.serve import deployment_options

    fixed = deployment_options(load_config())
    assert fixed["graphs"]["num_replicas"] == 1 and "autoscaling_config" not in fixed["graphs"]
    scaled = deployment_options(
        load_config(None, ["serve.graph_replicas=2", "serve.graph_max_replicas=6", "serve.model_max_replicas=3"]),
        use_gpu=True,
    )
    assert scaled["graphs"]["autoscaling_config"] == {
        "min_replicas": 2,
        "max_replicas": 6,
        "target_ongoing_requests": 2.0,
    }
    assert scaled["model"]["autoscaling_config"]["max_replicas"] == 3
    assert scaled["model"]["ray_actor_options"]["num_gpus"] == 1 and "num_replicas" not in scaled["model"]


def test_the_served_config_names_local_places_absolutely_for_replicas_started_elsewhere(tmp_path, monkeypatch):
    """A relative `storage.root` (and index, tables, classifier) is resolved in the driver's folder before the
    replicas build the version's pipeline in theirs (a cluster started in another folder)."""
    from xh.stages.serve import absolute_places

    monkeypatch.chdir(tmp_path)
    cfg = load_config(
        None,
        ["storage.root=runs/demo", "retrieve.tables=runs/demo/tables", "serve.question_classifier=models/qt"],
    )
    used = absolute_places(cfg)
    assert used.storage.root == str(tmp_path / "runs" / "demo")
    assert used.retrieve.tables == str(tmp_path / "runs" / "demo" / "tables") and used.retrieve.index is None
    assert used.serve.question_classifier == str(tmp_path / "models" / "qt")
    s3 = absolute_places(load_config(None, ["storage.root=s3://bucket/xh"]))
    assert s3.storage.root == "s3://bucket/xh"
