"""One version = one pipeline, against the real services (MLflow server, S3 endpoint, the Ray cluster):
a registered version carries its retrieval and graph settings; scoring with a graph setting unlike the
version's is refused in one line naming it, and opting in (`score.allow_drift=true`) scores and
records the drift in the predictions and the scoring run. A version registered without a pipeline
record still scores, with the config's settings."""

from __future__ import annotations

import json
import tempfile
import uuid

import mlflow
import pyarrow.dataset as pads
import pytest

from tests.integration.test_score import _champion, _register, _score_overrides, scoring_world  # noqa: F401 (a fixture)
from xh.config import load_config


def test_a_graph_setting_unlike_the_versions_is_refused_and_opting_in_records_the_drift(
    scoring_world,  # noqa: F811
    tiny_backbone,
    mlflow_server,
    s3_endpoint,
):
    from workflows import score
    from xh.pipeline_record import PipelineDrift
    from xh.registry.register import pipeline_of
    from xh.storage.uris import open_output

    name = _champion("xh-pipe", tiny_backbone, scoring_world, mlflow_server, seed=5)
    with tempfile.TemporaryDirectory() as dst:
        record, _ = pipeline_of(name, "1", dst)
    assert record["graphs"]["edge_mode"] == "hyperlink"  # what the world's graphs were built with
    assert record["index"] is None  # distractor-setting graphs: built from no index

    incoming = f"s3://xh-test/incoming-{uuid.uuid4().hex[:6]}"
    with open_output(f"{incoming}/q.jsonl") as out:
        lines = [json.dumps({"qid": q["_id"], "question": q["question"]}) for q in scoring_world["questions"][:4]]
        out.write(("\n".join(lines) + "\n").encode())
    output = f"s3://xh-test/predictions-{uuid.uuid4().hex[:6]}"
    overrides = [*_score_overrides(scoring_world, mlflow_server, name, incoming, output), "graphs.edge_mode=full"]

    with pytest.raises(PipelineDrift) as refused:
        score.run(load_config(None, overrides))
    assert str(refused.value).startswith("graphs.edge_mode='full' differs from the model version's 'hyperlink'")
    assert "\n" not in str(refused.value)

    summary = score.run(load_config(None, [*overrides, "score.allow_drift=true"]))
    drift = {"graphs.edge_mode": {"version": "hyperlink", "used": "full"}}
    assert summary["pipeline"] == "version" and summary["pipeline_drift"] == drift
    partition = f"{output}/run_date=2026-11-23/model={name}/version=1"[len("s3://") :]
    table = pads.dataset(partition, filesystem=s3_endpoint.pyarrow_fs(), format="parquet").to_table()
    assert table.num_rows == summary["predictions"] > 0
    assert {json.dumps(drift, sort_keys=True)} == set(table["pipeline_drift"].to_pylist())
    tags = mlflow.MlflowClient().get_run(summary["mlflow_run_id"]).data.tags
    assert json.loads(tags["pipeline_drift"]) == drift and tags["pipeline"] == "version"


def test_a_version_registered_without_a_pipeline_record_is_refused_in_one_line(
    scoring_world,  # noqa: F811
    tiny_backbone,
    mlflow_server,
    s3_endpoint,
):
    """Logged as versions were before they kept a pipeline: the model folder alone as the pyfunc's data. The
    one rule of `xh.pipeline.version_pipeline` (scoring, serving and the pyfunc): no pipeline to answer with."""
    from xh.model.xh import XHModel
    from xh.pipeline import NoPipelineRecord
    from xh.registry.pyfunc import LOADER_MODULE
    from xh.registry.versions import resolve_model
    from xh.stages.score import version_pipeline
    from xh.storage.store import Store

    mlflow.set_tracking_uri(mlflow_server)
    mlflow.set_experiment("score-tests")
    name = f"xh-old-{uuid.uuid4().hex[:6]}"
    cfg = load_config(None, [f"model.backbone={tiny_backbone}", "model.max_node_tokens=64"])
    with tempfile.TemporaryDirectory() as folder, mlflow.start_run():
        XHModel.from_backbone(cfg.model).save_pretrained(folder)
        info = mlflow.pyfunc.log_model(name="model", loader_module=LOADER_MODULE, data_path=folder)
    mlflow.register_model(info.model_uri, name)
    overrides = _score_overrides(scoring_world, mlflow_server, name, "unused", "unused")
    scoring = load_config(None, [*overrides, "score.model=models:/" + name + "/1", "graphs.edge_mode=full"])
    store = Store(root=scoring.storage.root, s3=s3_endpoint)
    with pytest.raises(NoPipelineRecord, match=f"^{name} v1 was registered without a pipeline record"):
        version_pipeline(scoring, resolve_model(scoring.score.model), store)
