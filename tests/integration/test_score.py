"""Promotion and batch scoring against the real services: MLflow server (registry), S3 endpoint,
the two-node Ray cluster. The registered models are real XH models (tiny backbone, untrained):
what is tested here is the registry and the scoring pipeline, not answer quality."""

from __future__ import annotations

import json
import uuid

import mlflow
import pyarrow.dataset as pads
import pytest

from xh.config import load_config


@pytest.fixture(scope="module")
def scoring_world(synth_tables, tmp_path_factory, ray_cluster):
    """The generated world's tables with a BM25 index, and dev graphs with gold labels."""
    from workflows import graphs, retrieve

    tables, questions = synth_tables
    root = tmp_path_factory.mktemp("score-world")
    cfg = load_config(None, [f"storage.root={root}", f"retrieve.tables={tables}", "retrieve.shards=2"])
    retrieve.build_index(cfg)
    graphs_cfg = load_config(
        None,
        [
            f"storage.root={root}",
            "graphs.setting=distractor",
            "graphs.workers=1",
            f"graphs.questions={tables.parent / 'world' / 'hotpot' / 'questions.json'}",
        ],
    )
    graphs.build(graphs_cfg)
    return {"root": root, "tables": tables, "questions": questions, "graphs": str(root / "graphs" / "hotpot")}


def _register(name: str, backbone: str, graphs: str, tracking: str, seed: int) -> int:
    """A real (untrained) XH model logged to a run and registered as @challenger."""
    import tempfile

    import torch

    from xh.model import XHModel
    from xh.registry import log_and_register

    cfg = load_config(
        None,
        [
            f"mlflow.tracking_uri={tracking}",
            "mlflow.experiment=score-tests",
            f"model.backbone={backbone}",
            "model.max_node_tokens=64",
            f"train.register_as={name}",
        ],
    )
    torch.manual_seed(seed)
    model = XHModel.from_backbone(cfg.model)
    mlflow.set_tracking_uri(tracking)
    mlflow.set_experiment("score-tests")
    with mlflow.start_run() as run, tempfile.TemporaryDirectory() as folder:
        model.save_pretrained(folder)
        mlflow.end_run()
        registered = log_and_register(
            folder, run_id=run.info.run_id, cfg=cfg, metrics={"dev_f1": 0.0}, graphs_uri=graphs
        )
    return registered["version"]


def test_promotion_moves_the_champion_only_when_the_challenger_wins_and_rolls_back(
    scoring_world, tiny_backbone, mlflow_server, s3_endpoint
):
    from xh.graph.store import read_eval_set
    from xh.registry import promote, rollback

    mlflow.set_tracking_uri(mlflow_server)
    name = f"xh-promote-{uuid.uuid4().hex[:6]}"
    rows = read_eval_set(scoring_world["graphs"])[:12]

    assert _register(name, tiny_backbone, scoring_world["graphs"], mlflow_server, seed=1) == 1
    first = promote(name, rows, metric="f1", floor=0.0)
    assert first["promoted"] and "first model" in first["reason"]
    client = mlflow.MlflowClient()
    assert client.get_model_version_by_alias(name, "champion").version == "1"

    _register(name, tiny_backbone, scoring_world["graphs"], mlflow_server, seed=2)
    refused = promote(name, rows, metric="f1", min_delta=101.0)  # no model wins by more than 100 points
    assert not refused["promoted"] and "needs +101" in refused["reason"]
    assert client.get_model_version_by_alias(name, "champion").version == "1"
    assert json.loads(client.get_model_version(name, "2").tags["promotion_decision"])["promoted"] is False

    missing = promote(name, rows, metric="no_such_metric")
    assert not missing["promoted"] and "no metric" in missing["reason"]

    accepted = promote(name, rows, metric="f1", min_delta=-101.0)
    assert accepted["promoted"]
    assert client.get_model_version_by_alias(name, "champion").version == "2"
    assert rollback(name) == {"model": name, "champion": "1", "rolled_back_from": "2"}
    assert client.get_model_version_by_alias(name, "champion").version == "1"
    with pytest.raises(ValueError, match="no previous champion"):
        rollback(name)


def test_a_challenger_with_another_signature_is_never_promoted(scoring_world, mlflow_server):
    import pandas as pd

    from xh.registry import promote

    mlflow.set_tracking_uri(mlflow_server)
    mlflow.set_experiment("score-tests")
    name = f"xh-bad-{uuid.uuid4().hex[:6]}"

    class Echo(mlflow.pyfunc.PythonModel):
        def predict(self, context, model_input, params=None):
            return model_input

    example = pd.DataFrame({"text": ["a question"]})
    with mlflow.start_run():
        info = mlflow.pyfunc.log_model(name="model", python_model=Echo(), input_example=example)
    version = mlflow.register_model(info.model_uri, name).version
    mlflow.MlflowClient().set_registered_model_alias(name, "challenger", version)
    decision = promote(name, [], metric="f1")
    assert not decision["promoted"] and "signature mismatch" in decision["reason"]


def test_batch_scoring_writes_one_partition_per_date_and_model_quarantines_bad_rows_and_resumes(
    scoring_world, tiny_backbone, mlflow_server, s3_endpoint
):
    from workflows import score
    from xh.staging import InjectedFailure
    from xh.storage import open_output

    mlflow.set_tracking_uri(mlflow_server)
    name = f"xh-score-{uuid.uuid4().hex[:6]}"
    _register(name, tiny_backbone, scoring_world["graphs"], mlflow_server, seed=3)
    mlflow.MlflowClient().set_registered_model_alias(name, "champion", "1")

    good = [{"qid": q["_id"], "question": q["question"]} for q in scoring_world["questions"][:10]]
    lines = [json.dumps(r) for r in good] + ['{"qid": "empty", "question": "  "}', "{not json"]
    incoming = f"s3://xh-test/incoming-{uuid.uuid4().hex[:6]}"
    with open_output(f"{incoming}/2026-11-22.jsonl") as out:
        out.write(("\n".join(lines) + "\n").encode())
    output = f"s3://xh-test/predictions-{uuid.uuid4().hex[:6]}"
    overrides = [
        f"storage.root={scoring_world['root']}",
        f"retrieve.tables={scoring_world['tables']}",
        f"mlflow.tracking_uri={mlflow_server}",
        f"score.input={incoming}",
        f"score.model=models:/{name}@champion",
        f"score.output={output}",
        "score.run_date=2026-11-22",
        "score.batch_size=4",
    ]

    with pytest.raises(InjectedFailure):
        score.run(load_config(None, [*overrides, "score.fail_before=inference"]))
    summary = score.run(load_config(None, overrides))
    assert summary["resumed_stages"] == ["parse", "graphs"]  # the failed run's finished stages were kept
    assert summary["model"]["version"] == "1"
    assert summary["records"] == len(lines) == summary["predictions"] + sum(summary["quarantined"].values())
    assert summary["quarantined"]["empty question"] == 1
    assert any(reason.startswith("not JSON") for reason in summary["quarantined"])

    partition = f"{output}/run_date=2026-11-22/model={name}/version=1"
    fs = s3_endpoint.pyarrow_fs()
    table = pads.dataset(partition[len("s3://") :], filesystem=fs, format="parquet").to_table()
    assert table.num_rows == summary["predictions"] >= 8
    row = table.slice(0, 1).to_pylist()[0]
    assert row["model_name"] == name and row["model_version"] == "1" and row["run_id"]
    assert row["corpus_snapshot"].startswith(str(scoring_world["root"]))

    again = score.run(load_config(None, overrides))  # same date and model: replaced, not duplicated
    assert again["resumed_stages"] == []
    assert pads.dataset(partition[len("s3://") :], filesystem=fs, format="parquet").count_rows() == table.num_rows
