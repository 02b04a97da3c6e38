"""Who may move `@champion` on an MLflow server with auth on, as `infra/k8s/mlflow.yaml` runs it: a real
`mlflow server --app-name basic-auth` on loopback (`default_permission = READ`). Without credentials an
alias move is refused (401), a READ user's too (403); the pipeline's user, which created the registered
model, promotes through `xh.registry.champion.promote` (its registry lock included).

It needs MLflow's basic-auth extra (`mlflow[auth]`: Flask-WTF); where `import mlflow.server.auth` fails the
tests skip, naming what is missing.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
import uuid

import pytest

from tests.conftest import BIN, _free_port, _stop, _wait_http

pytestmark = pytest.mark.integration

# MLflow wants passwords of at least 12 characters
ADMIN, PIPELINE, READER = (
    ("admin", "admin-secret-01"),
    ("xh-pipeline", "pipeline-secret-02"),
    ("reader", "reader-secret-03"),
)


def _auth_importable() -> str | None:
    """None when the basic-auth app imports (in a child process: nothing of it is loaded here), else why not."""
    found = subprocess.run([sys.executable, "-c", "import mlflow.server.auth"], capture_output=True, text=True)
    return None if found.returncode == 0 else (found.stderr.strip().splitlines() or ["?"])[-1]


@pytest.fixture(scope="module")
def auth_server(tmp_path_factory):
    missing = _auth_importable()
    if missing is not None:
        pytest.skip(f"MLflow's basic-auth extra is not installed: {missing}")
    work = tmp_path_factory.mktemp("mlflow-auth")
    ini = work / "basic_auth.ini"
    ini.write_text(
        "[mlflow]\ndefault_permission = READ\n"
        f"database_uri = sqlite:///{work / 'auth.db'}\n"
        f"admin_username = {ADMIN[0]}\nadmin_password = {ADMIN[1]}\n"
        "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
    )
    port, log = _free_port(), work / "server.log"
    cmd = [str(BIN / "mlflow"), "server", "--app-name", "basic-auth", "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["--backend-store-uri", f"sqlite:///{work / 'mlflow.db'}", "--default-artifact-root", str(work / "art")]
    cmd += ["--workers", "1"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    env |= {"MLFLOW_AUTH_CONFIG_PATH": str(ini), "MLFLOW_FLASK_SERVER_SECRET_KEY": uuid.uuid4().hex}
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=out, env=env, cwd=work)
    try:
        uri = f"http://127.0.0.1:{port}"
        _wait_http(f"{uri}/health", proc, 300, log)  # /health needs no user, as the manifest's probes rely on
        for user in (PIPELINE, READER):
            created = _call(uri, "2.0/mlflow/users/create", {"username": user[0], "password": user[1]}, ADMIN)
            assert created[0] == 200, created
        yield uri
    finally:
        _stop(proc)


def _call(uri: str, path: str, body: dict, user: tuple[str, str] | None) -> tuple[int, str]:
    request = urllib.request.Request(
        f"{uri}/api/{path}", data=json.dumps(body).encode(), method="POST", headers={"Content-Type": "application/json"}
    )
    if user is not None:
        token = base64.b64encode(f"{user[0]}:{user[1]}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_only_the_pipelines_user_moves_the_champion(auth_server, monkeypatch):
    import mlflow

    from xh.registry.champion import promote

    name = f"xh-auth-{uuid.uuid4().hex[:6]}"
    assert _call(auth_server, "2.0/mlflow/registered-models/create", {"name": name}, PIPELINE)[0] == 200
    for _ in range(2):
        created = _call(auth_server, "2.0/mlflow/model-versions/create", {"name": name, "source": "s3://b/m"}, PIPELINE)
        assert created[0] == 200, created
    move = {"name": name, "alias": "champion", "version": "2"}
    assert _call(auth_server, "2.0/mlflow/registered-models/alias", move | {"version": "1"}, PIPELINE)[0] == 200

    assert _call(auth_server, "2.0/mlflow/registered-models/alias", move, None)[0] == 401  # nobody
    assert _call(auth_server, "2.0/mlflow/registered-models/alias", move, READER)[0] == 403  # a READ user

    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", PIPELINE[0])
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", PIPELINE[1])
    mlflow.set_tracking_uri(auth_server)
    f1 = {"1": 0.3, "2": 0.5}
    decision = promote(name, [], challenger_version="2", evaluate=lambda model, v, *a: {"f1": f1[v]})
    assert decision["promoted"], decision
    assert mlflow.MlflowClient().get_model_version_by_alias(name, "champion").version == "2"
    assert json.loads(mlflow.MlflowClient().get_registered_model(name).tags["champion_history"]) == ["1"]
