"""The re-ranker's Ray Train job on the two-node cluster (2 DDP workers, output on S3, MLflow server),
then retrieval with the trained re-ranker on the query actors."""

from __future__ import annotations

import json
import uuid

import pyarrow.dataset as pads
import pytest

from workflows import rerank, retrieve
from xh.config import load_config
from xh.retrieval.rerank import CONFIG_FILE, CrossEncoder
from xh.storage.store import Store
from xh.storage.uris import list_files


@pytest.mark.multinode
def test_train_on_two_workers_then_retrieve_with_the_reranker(
    ray_cluster, s3_endpoint, mlflow_server, synth_tables, tiny_backbone, tmp_path
):
    import mlflow

    tables, questions = synth_tables
    (tmp_path / "questions.json").write_text(json.dumps(questions))
    output = f"s3://xh-test/reranker-{uuid.uuid4().hex[:8]}"
    cfg = load_config(
        None,
        [
            f"storage.root={tmp_path}",
            f"mlflow.tracking_uri={mlflow_server}",
            "mlflow.experiment=rerank-test",
            f"rerank.questions={tmp_path / 'questions.json'}",
            "rerank.max_questions=40",
            f"rerank.output={output}",
            f"rerank.backbone={tiny_backbone}",
            "rerank.max_length=64",
            "rerank.batch_size=4",
            "rerank.epochs=2",
            "rerank.max_steps=6",
            "rerank.workers=2",
            "rerank.cpus_per_worker=0.5",
            "rerank.threads_per_worker=1",
        ],
    )
    summary = rerank.run(cfg)

    assert summary["output"] == output and summary["steps"] == 6
    assert summary["metrics"]["step"] == 6 and summary["metrics"]["epoch"] >= 1
    files = {f.rsplit("/", 1)[-1] for f in list_files(output, s3_endpoint)}
    assert {CONFIG_FILE, "model.safetensors", "config.json", "tokenizer.json"} <= files
    reranker = CrossEncoder.load(Store(s3=s3_endpoint).at(output))
    assert reranker.max_length == 64 and reranker.score("a question?", ["one", "two"]).shape == (2,)

    mlflow.set_tracking_uri(mlflow_server)
    run = mlflow.get_run(summary["mlflow_run_id"])
    assert run.data.tags["stage"] == "rerank" and run.data.params["rerank.workers"] == "2"
    assert "epoch_loss" in run.data.metrics and "step_loss" in run.data.metrics
    artifacts = {a.path for a in mlflow.MlflowClient().list_artifacts(run.info.run_id, "reranker")}
    assert f"reranker/{CONFIG_FILE}" in artifacts

    # retrieval: the query actors load the re-ranker from S3 once each and every row says so
    retrieve_cfg = load_config(
        None,
        [
            f"storage.root={tmp_path}",
            f"retrieve.tables={tables}",
            f"retrieve.questions={tmp_path / 'questions.json'}",
            "retrieve.shards=2",
            "retrieve.ir_candidates=10",
            f"retrieve.reranker={output}",
            "retrieve.workers=2",
        ],
    )
    retrieve.index(retrieve_cfg)
    result = retrieve.run(retrieve_cfg)
    assert result["ranker"] == f"reranker {output}" and set(result["candidates"]) >= {"ir", "el"}
    candidates = pads.dataset(str(tmp_path / "retrieval" / "candidates")).to_table().to_pylist()
    assert candidates and {row["ranker"] for row in candidates} == {"reranker"}
    first = candidates[0]["qid"]
    ir = sorted((r for r in candidates if r["qid"] == first and r["source"] == "ir"), key=lambda r: r["rank"])
    assert len(ir) == 10 and [r["score"] for r in ir] == sorted((r["score"] for r in ir), reverse=True)
