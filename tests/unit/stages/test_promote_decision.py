"""What a promotion decision leaves for a scheduler and a person, without services: its exit code and the
per-question table of both models (xh.stages.promote); the manifests that run it and guard the registry."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from xh.stages.promote import EXIT_KEPT, EXIT_PROMOTED, exit_code, question_table

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[3]
K8S = ROOT / "infra" / "k8s"


@pytest.mark.parametrize(
    "outcome, code",
    [("promoted", EXIT_PROMOTED), ("would promote", EXIT_PROMOTED), ("kept", EXIT_KEPT), ("would keep", EXIT_KEPT)],
)
def test_the_exit_code_is_the_decisions_and_kept_is_neither_success_nor_a_refusal(outcome, code):
    assert exit_code({"outcome": outcome}) == code
    assert EXIT_KEPT not in (0, 1, 2)  # 1: a crash, 2: a refusal (click and `xh`'s own)


def test_the_question_table_has_one_row_per_question_and_version_with_the_official_answer_match():
    rows = [{"qid": "a", "question": "Where?", "answer": "Paris"}, {"qid": "b", "question": "Who?", "answer": "Ann"}]
    table = question_table(
        rows,
        {
            "2": [{"qid": "a", "answer": "the Paris"}, {"qid": "b", "answer": "Bob"}],
            "1": [{"qid": "a", "answer": "x"}, {"qid": "b", "answer": "ann"}],
        },
        challenger="2",
    )
    assert table["qid"] == ["a", "b", "a", "b"] and table["role"] == ["challenger"] * 2 + ["champion"] * 2
    assert table["match"] == [True, False, False, True]  # articles and case normalised away, as officially
    assert table["gold"] == ["Paris", "Ann"] * 2 and table["prediction"][0] == "the Paris"
    fever = question_table(
        [{"qid": 1, "question": "c", "claim_label": "SUPPORTS"}], {"3": [{"qid": 1, "label": "SUPPORTS"}]}, "3"
    )
    assert fever["match"] == [True] and fever["gold"] == ["SUPPORTS"]


def _doc(name: str, kind: str) -> dict:
    return next(d for d in yaml.safe_load_all((K8S / name).read_text()) if d and d["kind"] == kind)


def test_the_promote_rayjob_fails_on_a_kept_champion_without_retrying_and_says_so():
    job = _doc("rayjob-promote.yaml", "RayJob")["spec"]
    assert job["backoffLimit"] == 0 and job["submitterConfig"] == {"backoffLimit": 0}
    comments = (K8S / "rayjob-promote.yaml").read_text()
    assert f"exit {EXIT_KEPT}" in comments and "FAILED" in comments and "SUCCEEDED" in comments


def test_the_mlflow_server_runs_basic_auth_with_its_settings_as_a_mounted_secret_file():
    deployment = _doc("mlflow.yaml", "Deployment")["spec"]["template"]["spec"]
    [container] = deployment["containers"]
    assert container["command"] == ["mlflow", "server"] and container["args"][:2] == ["--app-name", "basic-auth"]
    env = {e["name"]: e for e in container["env"]}
    config = Path(env["MLFLOW_AUTH_CONFIG_PATH"]["value"])
    mount = next(m for m in container["volumeMounts"] if str(config.parent) == m["mountPath"])
    volume = next(v for v in deployment["volumes"] if v["name"] == mount["name"])
    assert mount["readOnly"] and volume["secret"]["secretName"] == "xh-mlflow-auth"
    assert volume["secret"]["items"] == [{"key": config.name, "path": config.name}]
    assert env["MLFLOW_FLASK_SERVER_SECRET_KEY"]["valueFrom"]["secretKeyRef"]["name"] == "xh-mlflow-auth"
    assert not {"MLFLOW_AUTH_ADMIN_PASSWORD", "MLFLOW_TRACKING_PASSWORD"} & set(env)  # a file, not env values
    assert container["readinessProbe"]["httpGet"]["path"] == "/health"  # the one route without a user


def test_every_ray_pod_reads_the_pipelines_mlflow_user_from_a_mounted_credentials_file():
    """MLflow's clients read ~/.mlflow/credentials; the image's user is `ray`, whose home is /home/ray."""
    assert re.search(r"useradd --uid 1000 --create-home .* ray", (ROOT / "infra" / "Dockerfile").read_text())
    cluster = _doc("raycluster.yaml", "RayCluster")["spec"]
    pods = [cluster["headGroupSpec"]["template"]["spec"]] + [g["template"]["spec"] for g in cluster["workerGroupSpecs"]]
    for pod in pods:
        volumes = {v["name"]: v for v in pod["volumes"]}
        for container in pod["containers"]:
            [mount] = [m for m in container["volumeMounts"] if m["mountPath"] == "/home/ray/.mlflow"]
            assert mount["readOnly"]
            secret = volumes[mount["name"]]["secret"]
            assert secret == {
                "secretName": "xh-mlflow-pipeline",
                "items": [{"key": "credentials", "path": "credentials"}],
            }
