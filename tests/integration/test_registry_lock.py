"""The registry lock of promotions against the real `mlflow server` and an embedded SQLite store, with real
processes: exactly one holder whatever the latency of each one's writes, no crash when writes are
simultaneous, a dead holder's lock expires, and two concurrent promotions leave the better model champion
with every replaced version in the history.

Latency is real: a loopback proxy in front of the server that holds each POST of one process for 2 s
before passing it on (a slow network or a loaded server), so that its writes land late.
"""

from __future__ import annotations

import http.server
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from pathlib import Path

import mlflow
import pytest

ROOT = Path(__file__).resolve().parents[2]
DELAY_S = 2.0

pytestmark = pytest.mark.integration


@pytest.fixture
def slow_proxy(mlflow_server, tmp_path):
    """A proxy to the MLflow server that holds every POST for DELAY_S before forwarding it; it touches
    `posted` when the first POST arrives. Yields (proxy URL, the `posted` file)."""
    posted = tmp_path / "slow-posted"

    class Handler(http.server.BaseHTTPRequestHandler):
        def _forward(self, body: bytes | None) -> None:
            request = urllib.request.Request(
                mlflow_server + self.path,
                data=body,
                method=self.command,
                headers={k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length")},
            )
            try:
                with urllib.request.urlopen(request, timeout=60) as response:
                    status, headers, payload = response.status, response.headers, response.read()
            except urllib.error.HTTPError as e:
                status, headers, payload = e.code, e.headers, e.read()
            self.send_response(status)
            for key, value in headers.items():
                if key.lower() not in ("transfer-encoding", "connection", "content-length", "date", "server"):
                    self.send_header(key, value)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def do_GET(self):
            self._forward(None)

        def do_DELETE(self):
            self._forward(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or None)

        def do_PATCH(self):
            self._forward(self.rfile.read(int(self.headers.get("Content-Length") or 0)))

        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            posted.touch()
            time.sleep(DELAY_S)
            self._forward(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", posted
    finally:
        server.shutdown()
        server.server_close()


# A process that holds the lock for `hold` seconds and writes when it held it.
HOLDER = """
import json, os, sys, time, uuid
import mlflow
from xh.registry import lock

uri, name, log, wait_for, hold = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], float(sys.argv[5])
lock.LEASE_TTL_S = float(os.environ.get("XH_TEST_TTL", lock.LEASE_TTL_S))
client = mlflow.MlflowClient(uri)
deadline = time.monotonic() + 120
while wait_for != "-" and not os.path.exists(wait_for):
    assert time.monotonic() < deadline, "never released"
    time.sleep(0.02)
barrier = os.environ.get("XH_TEST_BARRIER")
for round in range(int(os.environ.get("XH_TEST_ROUNDS", "1"))):
    if barrier:  # every process asks at the same instant, once all are ready
        open(os.path.join(barrier, f"ready-{round}-{os.getpid()}"), "w").close()
        go = os.path.join(barrier, f"go-{round}")
        while not os.path.exists(go):
            assert time.monotonic() < deadline, "never started"
            time.sleep(0.01)
        time.sleep(max(0.0, float(open(go).read()) - time.time()))  # the start time the test wrote in it
    owner = uuid.uuid4().hex
    lock.acquire_lease(client, name, owner, 120)
    start = time.time()
    if os.environ.get("XH_TEST_DIE"):
        os.kill(os.getpid(), 9)  # a holder that dies without giving the lock back
    time.sleep(hold)
    end = time.time()
    lock.release_lease(client, name, owner)
    with open(log, "a") as f:
        f.write(json.dumps([start, end]) + "\\n")
"""


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    return env | {"PYTHONPATH": str(ROOT)} | extra


def _holder(uri: str, name: str, log: Path, wait_for: str, hold: float, **env: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", HOLDER, uri, name, str(log), wait_for, str(hold)],
        env=_env(**env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _finish(procs: list[subprocess.Popen]) -> list[str]:
    errors = []
    for proc in procs:
        out, err = proc.communicate(timeout=240)
        if proc.returncode != 0:
            errors.append(err[-3000:])
    return errors


def _disjoint(log: Path, count: int) -> None:
    spans = sorted(json.loads(line) for line in log.read_text().splitlines())
    assert len(spans) == count, spans
    for (_, end), (start, _) in zip(spans, spans[1:]):
        assert start >= end, f"two processes held the lock at once: {spans}"


def test_a_competitor_whose_lock_write_lands_late_does_not_hold_the_lock_too(
    mlflow_server, s3_endpoint, slow_proxy, tmp_path
):
    """The slow process asks first (its write is held by the proxy); the fast one asks next, holds the lock
    for 4 s, and the slow write lands in the middle of it."""
    proxy, posted = slow_proxy
    name = f"xh-lock-{uuid.uuid4().hex[:6]}"
    mlflow.MlflowClient(mlflow_server).create_registered_model(name)
    log = tmp_path / "spans"
    slow = _holder(proxy, name, log, "-", 1.0)
    fast = _holder(mlflow_server, name, log, str(posted), 4.0)
    assert not _finish([slow, fast])
    _disjoint(log, 2)
    assert name + ".promotion-lock" not in {
        m.name for m in mlflow.MlflowClient(mlflow_server).search_registered_models()
    }


def test_simultaneous_lock_writes_on_an_embedded_sqlite_store_do_not_crash(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    name = "xh-sqlite"
    mlflow.MlflowClient(uri).create_registered_model(name)  # the schema exists before the processes start
    log, barrier = tmp_path / "spans", tmp_path / "barrier"
    barrier.mkdir()
    procs, rounds = 8, 4
    started = [
        _holder(uri, name, log, "-", 0.1, XH_TEST_BARRIER=str(barrier), XH_TEST_ROUNDS=str(rounds))
        for _ in range(procs)
    ]
    deadline = time.monotonic() + 180
    for round in range(rounds):
        while len(list(barrier.glob(f"ready-{round}-*"))) < procs and all(p.poll() is None for p in started):
            assert time.monotonic() < deadline, "the processes did not get ready"
            time.sleep(0.05)
        if any(p.poll() is not None for p in started):  # one crashed: the others would wait in vain
            for p in started:
                if p.poll() is None:
                    p.kill()
            break
        (barrier / "go.tmp").write_text(str(time.time() + 1.0))
        (barrier / "go.tmp").rename(barrier / f"go-{round}")
    errors = _finish(started)
    assert not errors, max(errors, key=len)
    _disjoint(log, procs * rounds)


def test_the_lock_of_a_holder_that_died_expires(mlflow_server, s3_endpoint, tmp_path):
    name = f"xh-dead-{uuid.uuid4().hex[:6]}"
    mlflow.MlflowClient(mlflow_server).create_registered_model(name)
    log = tmp_path / "spans"
    dead = _holder(mlflow_server, name, log, "-", 0.0, XH_TEST_TTL="3", XH_TEST_DIE="1")
    dead.communicate(timeout=120)
    assert dead.returncode == -signal.SIGKILL
    started = time.time()
    assert not _finish([_holder(mlflow_server, name, log, "-", 0.1)])
    _disjoint(log, 1)
    assert time.time() - started < 60


# A promotion whose evaluation is a fixed table (the models' quality is not what is tested here).
PROMOTER = """
import json, os, sys, time
import mlflow
from xh.registry.champion import promote

uri, name, version, out, wait_for = sys.argv[1:6]
f1 = {"1": 0.30, "2": 0.50, "3": 0.80}
table = lambda model, v, rows, task, missed=(): {"f1": f1[v]}
mlflow.set_tracking_uri(uri)
deadline = time.monotonic() + 120
while wait_for != "-" and not os.path.exists(wait_for):
    assert time.monotonic() < deadline
    time.sleep(0.02)
decision = promote(name, [], metric="f1", min_delta=0.5, challenger_version=version, evaluate=table)
open(out, "w").write(json.dumps(decision))
"""


@pytest.mark.parametrize("slow", ["worse", "better"])
def test_two_concurrent_promotions_leave_the_better_model_champion_and_lose_no_version(
    slow, mlflow_server, s3_endpoint, slow_proxy, tmp_path
):
    """v1 is champion; v2 (worse) and v3 (better) are promoted by two processes at once, one of them behind
    the slow proxy. Whatever the order, v3 ends champion and every version that was champion is in the history."""
    proxy, posted = slow_proxy
    client = mlflow.MlflowClient(mlflow_server)
    name = f"xh-race-{uuid.uuid4().hex[:6]}"
    client.create_registered_model(name)
    for _ in range(3):
        client.create_model_version(name, source="s3://xh-test/no-model-needed")
    client.set_registered_model_alias(name, "champion", "1")
    slow_version, fast_version = ("2", "3") if slow == "worse" else ("3", "2")
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", PROMOTER, uri, name, version, str(tmp_path / f"v{version}.json"), wait_for],
            env=_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for uri, version, wait_for in [(proxy, slow_version, "-"), (mlflow_server, fast_version, str(posted))]
    ]
    assert not _finish(procs)
    decisions = {v: json.loads((tmp_path / f"v{v}.json").read_text()) for v in ("2", "3")}
    assert client.get_model_version_by_alias(name, "champion").version == "3", decisions
    history = json.loads(client.get_registered_model(name).tags["champion_history"])
    promoted = [v for v in ("2", "3") if decisions[v]["promoted"]]
    assert history == ["1"] + [v for v in promoted if v != "3"], (history, decisions)
    assert decisions["3"]["promoted"]
    if decisions["2"]["promoted"]:  # v2 first, then v3 judged against it
        assert decisions["3"]["champion"] == "2"
    else:
        assert decisions["2"]["champion"] == "3" and "vs champion 80.00" in decisions["2"]["reason"]
    assert name + ".promotion-lock" not in {m.name for m in client.search_registered_models()}
