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
    from xh.storage.store import Store

    model = {"name": name, "version": version, "run_id": ""}
    with tempfile.TemporaryDirectory() as folder:
        graphs, _ = graph_half(cfg, Store.from_config(cfg), model, folder).graphs(
            [{"qid": q["_id"], "question": q["question"], "type": None} for q in questions]
        )
    predictions = Pipeline.load(model=f"models:/{name}/{version}").predict(graphs)
    text = {q["_id"]: q["question"] for q in questions}
    by_qid = {g["qid"]: g for g in graphs}  # the question type each graph was built with, as served
    return {p["qid"]: answer(text[p["qid"]], p, model, by_qid[p["qid"]]) for p in predictions}


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


def _post_raw(url: str, data: bytes) -> tuple[int, dict]:
    """POST bytes as they are (not necessarily JSON)."""
    import urllib.error
    import urllib.request

    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def _register_without_record(name: str, backbone: str, tracking: str) -> str:
    """A version logged as versions were before they kept a pipeline record (it cannot answer questions)."""
    from xh.model.xh import XHModel
    from xh.registry.pyfunc import LOADER_MODULE

    mlflow.set_tracking_uri(tracking)
    mlflow.set_experiment("score-tests")
    cfg = load_config(None, [f"model.backbone={backbone}", "model.max_node_tokens=64"])
    with tempfile.TemporaryDirectory() as folder, mlflow.start_run():
        XHModel.from_backbone(cfg.model).save_pretrained(folder)
        info = mlflow.pyfunc.log_model(name="model", loader_module=LOADER_MODULE, data_path=folder)
    return str(mlflow.register_model(info.model_uri, name).version)


def test_the_fastapi_app_documents_itself_refuses_bad_bodies_and_answers_each_record_in_its_place(
    scoring_world,  # noqa: F811
    two_versions,
    tiny_backbone,
    mlflow_server,
    ray_cluster,
):
    """OpenAPI at /docs and /openapi.json; 422 for a body that is not question records; a record whose id looks
    like a position keeps its own answer (#44 defect 4); a claim, or a record with a question and a claim,
    to a HotpotQA version is refused (5); a long CJK question without a graph is an answer with its error, not
    a 500 (12); every answer says how its question got its type (1); a reload to a version that does not
    load names the version and the cause, not Ray's wrapper (16)."""
    import urllib.request

    from workflows.serve import serving
    from xh.serve import call

    name, questions = two_versions, scoring_world["questions"][:2]
    client = mlflow.MlflowClient()
    client.set_registered_model_alias(name, "champion", "1")
    cfg = load_config(None, _overrides(scoring_world, mlflow_server, name, check_s=3600))
    expected = _expected(cfg, name, "1", questions)
    with serving(cfg) as served:
        url = served["url"]
        status, spec = call(f"{url}/openapi.json")
        assert status == 200 and {"/answer", "/healthz", "/-/reload"} <= set(spec["paths"]), spec
        assert set(spec["components"]["schemas"]["Question"]["properties"]) == {
            "id",
            "qid",
            "question",
            "claim",
            "type",
        }
        with urllib.request.urlopen(f"{url}/docs", timeout=60) as page:
            assert page.status == 200 and b"swagger" in page.read().lower()
        for body in (b"{not json", b"[1, 2]", b'{"id": "q", "question": 5}', b'{"id": "q", "text": "Who?"}'):
            status, refused = _post_raw(f"{url}/answer", body)
            assert status == 422 and refused["detail"], (body, refused)

        health = call(f"{url}/healthz")[1]
        assert health["task"] == "hotpot" and health["question_types"].startswith("none: "), health
        cjk = "".join(chr(0x4E00 + i) for i in range(600)) + "?"  # no BM25 term: no graph
        batch = [
            {"id": "#2", "question": questions[0]["question"]},
            {"question": "no id"},
            {"id": questions[1]["_id"], "question": questions[1]["question"]},
            {"id": "cjk", "question": cjk},
            {"id": "claim", "claim": "Telemundo is owned by NBCUniversal."},
            {"id": "both", "question": "Who?", "claim": "A claim."},
        ]
        status, many = call(f"{url}/answer", batch)
        assert status == 200 and len(many) == len(batch), many
        first = expected[questions[0]["_id"]] | {"id": "#2"}
        _same(many[0], first)
        assert many[0]["question_type_source"] == "default" and many[0]["question_type"] == "bridge"
        assert many[1] == {"id": None, "answer": None, "error": "missing id"}
        _same(many[2], expected[questions[1]["_id"]])
        assert many[3]["id"] == "cjk" and many[3]["answer"] is None and many[3]["error"], many[3]
        assert many[4]["error"] == "a claim to a HotpotQA version: it answers questions (give `question`)"
        assert many[5]["error"] == "both a question and a claim: give one"

        broken = _register_without_record(name, tiny_backbone, mlflow_server)
        client.set_registered_model_alias(name, "champion", broken)
        status, done = call(f"{url}/-/reload", {})
        assert status == 409 and done["version"] == "1", done
        assert done["reload_error"].startswith(
            f"{name} v{broken} did not load: NoPipelineRecord: {name} v{broken} was registered without"
        ), done
        assert "RayTaskError" not in done["reload_error"] and "ServeReplica" not in done["reload_error"]
    client.set_registered_model_alias(name, "champion", "1")
