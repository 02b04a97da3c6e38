"""`xh serve` against the real services (MLflow server, S3 endpoint, the two-node Ray cluster), over real HTTP
on loopback: the Serve app answers one question and a list with the answers `Pipeline` gives for the version
served; it follows `@champion` when the alias moves (forced with `xh serve reload`, and on its own every
`serve.alias_check_s`)."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile

import mlflow
import pytest

from tests.conftest import _free_port
from tests.integration.test_score import _champion, _register, scoring_world  # noqa: F401 (a fixture)
from xh.config import load_config

pytestmark = pytest.mark.slow


def _overrides(scoring_world, mlflow_server: str, name: str, check_s: float) -> list[str]:  # noqa: F811
    return [
        f"storage.root={scoring_world['root']}",
        f"retrieve.tables={scoring_world['tables']}",
        f"mlflow.tracking_uri={mlflow_server}",
        f"serve.model=models:/{name}@champion",
        f"serve.port={_free_port()}",
        f"serve.alias_check_s={check_s}",
        "serve.max_batch_size=4",
        "serve.graph_cpus=0.25",
        "serve.model_cpus=0.25",
    ]


def _expected(cfg, name: str, version: str, questions: list[dict]) -> dict[str, dict]:
    """What `Pipeline` answers for `questions` with version `version`: its recorded graph half, then its model."""
    from xh.pipeline import Pipeline
    from xh.serve import answer, graph_half
    from xh.store import Store

    model = {"name": name, "version": version, "run_id": ""}
    with tempfile.TemporaryDirectory() as folder:
        graphs, _ = graph_half(cfg, Store.from_config(cfg), model, folder).graphs(
            [{"qid": q["_id"], "question": q["question"], "type": None} for q in questions]
        )
    predictions = Pipeline.load(model=f"models:/{name}/{version}").predict(graphs)
    text = {q["_id"]: q["question"] for q in questions}
    return {p["qid"]: answer(text[p["qid"]], p, model) for p in predictions}


def _same(served: dict, expected: dict) -> None:
    assert {k: v for k, v in served.items() if k != "score"} == {k: v for k, v in expected.items() if k != "score"}
    assert served["score"] == pytest.approx(expected["score"], abs=1e-4)


@pytest.fixture(scope="module")
def two_versions(scoring_world, tiny_backbone, mlflow_server, s3_endpoint):  # noqa: F811
    """A registered model whose @champion is v1, and a v2 of other weights."""
    name = _champion("xh-serve", tiny_backbone, scoring_world, mlflow_server, seed=3)
    assert _register(name, tiny_backbone, scoring_world["graphs"], mlflow_server, seed=11) == 2
    return name


def test_the_served_champion_answers_like_pipeline_and_serves_the_new_version_after_a_reload(
    scoring_world,  # noqa: F811
    two_versions,
    mlflow_server,
    ray_cluster,
):
    from workflows.serve import serving
    from xh.serve import call

    name, questions = two_versions, scoring_world["questions"][:3]
    cfg = load_config(None, _overrides(scoring_world, mlflow_server, name, check_s=3600))
    expected = {version: _expected(cfg, name, version, questions) for version in ("1", "2")}
    assert any(expected["1"][q["_id"]]["answer"] != expected["2"][q["_id"]]["answer"] for q in questions) or any(
        expected["1"][q["_id"]]["score"] != expected["2"][q["_id"]]["score"] for q in questions
    ), "the two versions must answer differently for the test to tell them apart"

    with serving(cfg) as served:
        url = served["url"]
        assert served["model"]["version"] == "1"
        status, one = call(f"{url}/answer", {"id": questions[0]["_id"], "question": questions[0]["question"]})
        assert status == 200, one
        _same(one, expected["1"][questions[0]["_id"]])

        # a list, in order, with a record that is no question answered by its reason
        batch = [{"id": q["_id"], "question": q["question"]} for q in questions] + [{"question": "no id"}]
        status, many = call(f"{url}/answer", batch)
        assert status == 200 and len(many) == 4, many
        for q, got in zip(questions, many):
            _same(got, expected["1"][q["_id"]])
        assert many[3] == {"id": None, "answer": None, "error": "missing id"}
        status, refused = call(f"{url}/answer", {"id": "x", "question": " "})
        assert status == 400 and refused["error"] == "empty question"

        mlflow.MlflowClient().set_registered_model_alias(name, "champion", "2")
        reloaded = subprocess.run(
            [sys.executable, "-m", "workflows.cli", "serve", "reload", "--url", url],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert reloaded.returncode == 0, reloaded.stderr
        done = json.loads(reloaded.stdout)
        assert done["version"] == "2" and done["previous"] == "1" and done["reloaded"] is True, done
        assert call(f"{url}/healthz")[1]["version"] == "2"
        status, many = call(f"{url}/answer", batch[:3])
        for q, got in zip(questions, many):
            _same(got, expected["2"][q["_id"]])


def test_the_app_follows_the_alias_on_its_own(scoring_world, two_versions, mlflow_server, ray_cluster):  # noqa: F811
    import time

    from workflows.serve import serving
    from xh.serve import call

    name, question = two_versions, scoring_world["questions"][0]
    client = mlflow.MlflowClient()
    client.set_registered_model_alias(name, "champion", "2")
    cfg = load_config(None, _overrides(scoring_world, mlflow_server, name, check_s=1))
    with serving(cfg) as served:
        url = served["url"]
        assert call(f"{url}/healthz")[1]["version"] == "2"
        client.set_registered_model_alias(name, "champion", "1")
        deadline = time.monotonic() + 120
        while call(f"{url}/healthz")[1]["version"] != "1":
            assert time.monotonic() < deadline, call(f"{url}/healthz")[1]
            time.sleep(1)
        status, got = call(f"{url}/answer", {"id": question["_id"], "question": question["question"]})
        assert status == 200 and got["version"] == "1", got


def test_xh_serve_refuses_a_malformed_model_uri_and_reload_without_an_app_in_one_line(tmp_path):
    for args, message in (
        (["serve", "--model", "xh-hotpot@champion"], "error: serve.model must be models:/"),
        (["serve", "reload", "--url", f"http://127.0.0.1:{_free_port()}"], "error: no xh Serve application at"),
    ):
        done = subprocess.run(
            [sys.executable, "-m", "workflows.cli", *args, "--set", f"mlflow.tracking_uri=sqlite:///{tmp_path}/m.db"]
            if args[1] != "reload"
            else [sys.executable, "-m", "workflows.cli", *args],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            timeout=120,
        )
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and len(lines) == 1 and lines[0].startswith(message), done.stderr


def test_the_rayservice_serve_config_is_a_valid_serve_deploy_config():
    """infra/k8s/rayservice-serve.yaml's serveConfigV2 as Ray Serve reads it (the RayService hands it over as is)."""
    from pathlib import Path

    import yaml
    from ray.serve.schema import ServeDeploySchema

    manifest = Path(__file__).resolve().parents[2] / "infra" / "k8s" / "rayservice-serve.yaml"
    config = ServeDeploySchema.model_validate(
        yaml.safe_load(yaml.safe_load(manifest.read_text())["spec"]["serveConfigV2"])
    )
    (app,) = config.applications
    assert app.import_path == "xh.serve:app_builder" and app.route_prefix == "/"
    assert config.http_options.host == "0.0.0.0" and config.http_options.port == 8000
