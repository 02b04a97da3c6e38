"""`infra/submit.sh` against a real Ray cluster: `ray job submit --working-dir` of the synth stage.

The test starts its own one-node cluster (`ray start --head --block`) with token authentication, its
own token file, its own ports and its own temp dir, so that it neither touches nor is reached by the
session's `ray_cluster` fixture or anyone else's Ray on this machine (a `ray.init()` without an address
joins the cluster recorded in /tmp/ray; `ray stop` would kill every Ray on the machine). It stops the
cluster by signalling the process it started.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
SECRET = "not-a-real-key-" + secrets.token_hex(8)

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _get_json(url: str, token: str, timeout: float = 3) -> dict:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


def _base_env(token_file: Path) -> dict[str, str]:
    """This venv's tools first; no address, token or credentials inherited from the test session."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "AWS_", "MLFLOW_", "XH_"))}
    env.update(
        PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}", RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(token_file)
    )
    return env


@pytest.fixture
def job_cluster():
    """A one-node Ray cluster (1 CPU, dashboard with the job server) of this test only: (dashboard URL, token file)."""
    # A short temp dir: Ray's unix sockets live under it and their paths are limited to ~107 characters.
    work = Path(tempfile.mkdtemp(prefix="xhjob-", dir="/tmp"))
    token_file = work / "auth_token"
    token_file.write_text(secrets.token_hex(32))
    token_file.chmod(0o600)
    gcs, dashboard, client, agent_http, agent_grpc, metrics, runtime_env_agent, node_manager, object_manager = (
        _free_ports(9)
    )
    cmd = [
        str(BIN / "ray"),
        "start",
        "--head",
        "--block",
        "--disable-usage-stats",
        "--temp-dir",
        str(work / "ray"),
        "--num-cpus",
        "1",
        "--object-store-memory",
        str(256 * 1024**2),
        "--port",
        str(gcs),
        "--include-dashboard",
        "true",
        "--dashboard-host",
        "127.0.0.1",
        "--dashboard-port",
        str(dashboard),
        "--ray-client-server-port",
        str(client),
        "--dashboard-agent-listen-port",
        str(agent_http),
        "--dashboard-agent-grpc-port",
        str(agent_grpc),
        "--metrics-export-port",
        str(metrics),
        "--runtime-env-agent-port",
        str(runtime_env_agent),
        "--node-manager-port",
        str(node_manager),
        "--object-manager-port",
        str(object_manager),
    ]
    log = work / "ray-start.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=_base_env(token_file), cwd=work)
    url = f"http://127.0.0.1:{dashboard}"
    try:
        deadline = time.monotonic() + 180  # wide: the second test process shares the CPUs with this start
        while True:
            if proc.poll() is not None:
                pytest.fail(f"ray start exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
            try:
                _get_json(f"{url}/api/version", token_file.read_text())
                break
            except (OSError, ValueError):
                if time.monotonic() > deadline:
                    pytest.fail(f"the dashboard at {url} did not answer within 180 s:\n{log.read_text()[-3000:]}")
                time.sleep(0.5)
        yield url, token_file, work
    finally:
        # `ray start --block` stops the processes it started when it gets SIGTERM
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(work, ignore_errors=True)


def test_submit_sh_runs_synth_as_a_ray_job(job_cluster, tmp_path):
    url, token_file, work = job_cluster
    out = tmp_path / "out"
    config = tmp_path / "synth.yaml"
    config.write_text(
        f"storage:\n  root: {out}\n"
        "synth:\n  num_docs: 60\n  docs_per_shard: 30\n  num_questions: 8\n  num_claims: 6\n  seed: 5\n"
    )
    submission_id = f"xh-test-{uuid.uuid4().hex[:8]}"
    env = _base_env(token_file) | {
        "RAY_ADDRESS": url,
        "AWS_REGION": "eu-west-3",
        "AWS_SECRET_ACCESS_KEY": SECRET,
        "MLFLOW_TRACKING_PASSWORD": SECRET,
        "XH_SUBMIT_OPTS": f"--submission-id {submission_id}",
    }
    start = time.perf_counter()
    done = subprocess.run(
        ["bash", str(ROOT / "infra" / "submit.sh"), "synth", "--config", str(config)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=360,  # wide: a loaded machine or a second test process slows the job's start
    )
    seconds = time.perf_counter() - start
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    assert SECRET not in output, "a credential was printed"

    # The job succeeded, on the cluster's record too, and received the settings by name, never a secret:
    # not in what a token holder reads (`ray job list`, the jobs API) and not in Ray's session logs.
    info = _get_json(f"{url}/api/jobs/{submission_id}", token_file.read_text())
    assert info["status"] == "SUCCEEDED", info
    env_vars = info["runtime_env"]["env_vars"]
    assert env_vars["AWS_REGION"] == "eu-west-3"
    assert not {"AWS_SECRET_ACCESS_KEY", "MLFLOW_TRACKING_PASSWORD", "RAY_AUTH_TOKEN_PATH", "PATH"} & set(env_vars)
    listed = subprocess.run(
        [str(BIN / "ray"), "job", "list", "--address", url],
        env=_base_env(token_file),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert listed.returncode == 0 and submission_id in listed.stdout, listed.stderr[-2000:]
    assert SECRET not in listed.stdout + listed.stderr and SECRET not in json.dumps(info)
    leaked = [str(p) for p in (work / "ray").rglob("*") if p.is_file() and SECRET.encode() in p.read_bytes()]
    assert not leaked, f"the probe secret reached Ray's files: {leaked}"
    outputs = [str(p) for p in out.rglob("*") if p.is_file() and SECRET.encode() in p.read_bytes()]
    assert not outputs, f"the probe secret reached the stage's outputs: {outputs}"

    # Its summary line (the job's stdout, streamed back by `ray job submit`) and its files.
    summary = json.loads(next(line for line in reversed(done.stdout.splitlines()) if line.startswith("{")))
    assert (summary["docs"], summary["shards"], summary["questions"]["total"]) == (60, 2, 8)
    world = out / "world"
    assert len(list((world / "wiki").rglob("wiki_*.bz2"))) == 2
    assert len(json.loads((world / "hotpot" / "questions.json").read_text())) == 8
    assert json.loads((world / "truth" / "summary.json").read_text())["num_docs"] == 60
    print(f"\nsubmit.sh synth: {seconds:.1f}s from submission to SUCCEEDED")


# What every stage does with its config and MLflow (`xh synth` reads the config, `xh.tracking.stage_run`):
# the copy's synth driver, replaced by a probe that opens one run and says where it went.
PROBE = '''"""Test probe: one MLflow run the way every stage opens one."""
import mlflow

from xh.tracking import stage_run


def run(cfg):
    with stage_run(cfg, "synth") as active:
        experiment = mlflow.get_experiment(active.info.experiment_id)
        return {
            "run_id": active.info.run_id,
            "tracking_uri": mlflow.get_tracking_uri(),
            "artifact_location": experiment.artifact_location,
        }
'''


def test_submit_sh_job_runs_go_to_mlflow_tracking_uri_and_no_credential_file_is_uploaded(
    job_cluster, mlflow_server, tmp_path
):
    """A checkout with the README's `aws-credentials` and a `.env` lying untracked in it: neither reaches the
    cluster; the job's run goes to the MLFLOW_TRACKING_URI given to submit.sh, not to the config's SQLite file,
    and the experiment it creates keeps its artifacts under the server's root, not in the job's temporary
    copy of the code (#44, 6: the config's `mlflow.artifact_location` is relative)."""
    url, token_file, work = job_cluster
    checkout = tmp_path / "checkout"
    tracked = (
        subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True, check=True)
        .stdout.decode()
        .split("\0")
    )
    for path in filter(None, tracked):
        if (ROOT / path).is_file():
            (checkout / path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / path, checkout / path)
    (checkout / "workflows" / "synth.py").write_text(PROBE)
    git = ["git", "-C", str(checkout), "-c", "user.name=t", "-c", "user.email=t@example.invalid"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "copy"], check=True)
    (checkout / "aws-credentials").write_text(f"[default]\naws_secret_access_key = {SECRET}\n")
    (checkout / ".env").write_text(f"MLFLOW_TRACKING_PASSWORD={SECRET}\n")

    submission_id = f"xh-test-{uuid.uuid4().hex[:8]}"
    env = _base_env(token_file) | {
        "RAY_ADDRESS": url,
        "MLFLOW_TRACKING_URI": mlflow_server,
        "XH_WORKING_DIR": str(checkout),
        "XH_SUBMIT_OPTS": f"--submission-id {submission_id}",
    }
    experiment = f"probe-{uuid.uuid4().hex[:8]}"  # new: the job creates it
    probe = ["synth", "--config", "configs/demo.yaml", "--set", f"mlflow.experiment={experiment}"]
    done = subprocess.run(
        ["bash", str(checkout / "infra" / "submit.sh"), *probe],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    summary = json.loads(next(line for line in reversed(done.stdout.splitlines()) if line.startswith("{")))
    assert summary["tracking_uri"] == mlflow_server
    assert summary["artifact_location"].startswith("mlflow-artifacts:"), summary  # the server's proxied root
    assert str(work) not in summary["artifact_location"] and "runs/mlflow" not in summary["artifact_location"]
    import mlflow

    run = mlflow.MlflowClient(mlflow_server).get_run(summary["run_id"])
    assert run.data.params["mlflow.tracking_uri"] == mlflow_server
    leaked = [str(p) for p in (work / "ray").rglob("*") if p.is_file() and SECRET.encode() in p.read_bytes()]
    assert not leaked, f"a credential file reached the cluster: {leaked}"
    packages = [p for p in (work / "ray").rglob("synth.py") if "Test probe" in p.read_text()]
    assert packages, "the job's working directory was not found under Ray's temp dir"
    assert not list((work / "ray").rglob("aws-credentials")) and not list((work / "ray").rglob(".env"))
