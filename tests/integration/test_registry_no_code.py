"""A registered version is data only, and loading it runs no code from the artifact store.

Against the real `mlflow server` (artifacts proxied to the S3 endpoint): a real XH model (tiny backbone,
untrained) is registered; its stored files hold no Python and no pickle. Then the store is tampered with as
anyone with write access to the artifact bucket could: every stored Python file gets a payload, a payload module
is added under `code/`, and the MLmodel is rewritten to name it as the loader and `code/` as the code path.
Loading the version the way promotion, rollback and scoring do (in a fresh process, as a job's driver) runs
none of it, and still predicts with the version's weights.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import mlflow
import pytest
import yaml

from xh.config import load_config

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.integration

PAYLOAD = "\nimport pathlib as _p, os as _o\n_p.Path(_o.environ['XH_TAMPER_MARKER']).write_text('artifact code ran')\n"


@pytest.fixture(scope="module")
def graphs_folder(tmp_path_factory) -> str:
    """Three HotpotQA distractor graphs, built in this process (no Ray), as a graphs folder."""
    from tests.unit.graph.test_hotpot_paper import distractor_rows
    from xh.graph.store import write_shard
    from xh.storage.store import Store

    folder = tmp_path_factory.mktemp("graphs") / "hotpot"
    write_shard(distractor_rows()[:2], Store().at(str(folder)), 0)
    return str(folder)


@pytest.fixture(scope="module")
def registered(mlflow_server, s3_endpoint, tiny_backbone, graphs_folder, tmp_path_factory) -> str:
    """Version 1 of a new registered model, logged by `log_and_register` as training does."""
    import torch

    from xh.model.xh import XHModel
    from xh.registry.register import log_and_register

    name = f"xh-nocode-{uuid.uuid4().hex[:6]}"
    cfg = load_config(
        None,
        [
            f"mlflow.tracking_uri={mlflow_server}",
            "mlflow.experiment=no-code-tests",
            "mlflow.artifact_location=null",
            f"model.backbone={tiny_backbone}",
            "model.max_node_tokens=64",
            f"train.register_as={name}",
        ],
    )
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("model")
    XHModel.from_backbone(cfg.model).save_pretrained(folder)
    mlflow.set_tracking_uri(mlflow_server)
    mlflow.set_experiment("no-code-tests")
    with mlflow.start_run() as run:
        pass
    assert (
        log_and_register(str(folder), run_id=run.info.run_id, cfg=cfg, metrics={}, graphs_uri=graphs_folder)["version"]
        == 1
    )
    return name


def _stored(name: str, version: str, s3_endpoint) -> tuple[object, str, list[str]]:
    """(filesystem, the version's folder in the bucket, its files relative to that folder)."""
    from pyarrow import fs as pafs

    uri = mlflow.MlflowClient().get_model_version_download_uri(name, version)
    assert uri.startswith("mlflow-artifacts:/"), uri
    s3 = s3_endpoint.pyarrow_fs()
    base = f"xh-test/mlflow-artifacts/{uri[len('mlflow-artifacts:/') :].strip('/')}"
    infos = s3.get_file_info(pafs.FileSelector(base, recursive=True))
    return s3, base, sorted(i.path[len(base) + 1 :] for i in infos if i.type == pafs.FileType.File)


def test_a_registered_version_stores_no_code(registered, mlflow_server, s3_endpoint):
    _, _, files = _stored(registered, "1", s3_endpoint)
    assert "MLmodel" in files and any(f.endswith("model.safetensors") for f in files), files
    code = [f for f in files if f.endswith((".py", ".pkl", ".pickle", ".cloudpickle")) or f.startswith("code/")]
    assert not code, f"the version stores code: {code}"
    flavor = yaml.safe_load(mlflow.artifacts.load_text(f"models:/{registered}/1/MLmodel"))["flavors"]
    assert flavor["python_function"]["loader_module"] == "xh.pyfunc_entry"
    assert not any(flavor["python_function"].get(k) for k in ("code", "python_model", "cloudpickle_version"))


def test_mlflow_loads_the_version_with_the_installed_loader_and_predicts(registered, mlflow_server, graphs_folder):
    """`mlflow.pyfunc.load_model` (what `mlflow models serve` does) imports `xh.pyfunc_entry` from this package."""
    import pyarrow.dataset as pads

    from xh.registry.pyfunc import graph_input

    model = mlflow.pyfunc.load_model(f"models:/{registered}/1")
    assert model.loader_module == "xh.pyfunc_entry"
    rows = pads.dataset(graphs_folder).to_table().to_pylist()
    predictions = model.predict(graph_input(rows))
    assert list(predictions["qid"]) == [r["qid"] for r in rows]
    assert all(isinstance(json.loads(sf), list) for sf in predictions["supporting_facts"])


def test_loading_a_tampered_version_runs_no_code_from_the_artifact_store(
    registered, mlflow_server, s3_endpoint, graphs_folder, tmp_path
):
    s3, base, files = _stored(registered, "1", s3_endpoint)
    for path in [f for f in files if f.endswith(".py")]:  # every stored code file gets the payload
        with s3.open_input_stream(f"{base}/{path}") as f:
            original = f.read()
        with s3.open_output_stream(f"{base}/{path}") as f:
            f.write(original + PAYLOAD.encode())
    loader = PAYLOAD + "\ndef _load_pyfunc(path, *args):\n    raise RuntimeError('the tampered loader ran')\n"
    for path in ["code/xh_tampered_loader.py", "pyfunc_entry.py", "python_model.py"]:
        with s3.open_output_stream(f"{base}/{path}") as f:
            f.write(loader.encode())
    with s3.open_input_stream(f"{base}/MLmodel") as f:
        meta = yaml.safe_load(f.read())
    meta["flavors"]["python_function"].update(loader_module="xh_tampered_loader", code="code")
    with s3.open_output_stream(f"{base}/MLmodel") as f:
        f.write(yaml.safe_dump(meta).encode())

    marker = tmp_path / "ran"
    script = (
        "import json, sys\n"
        "import pyarrow.dataset as pads\n"
        "from xh.inference import load_model\n"
        "from xh.registry.evaluation import evaluate_version\n"
        "from xh.registry.versions import model_folder, version_loads\n"
        "name, graphs = sys.argv[1], sys.argv[2]\n"
        "model, tokenizer = load_model(model_folder(f'models:/{name}/1'))\n"
        "metrics = evaluate_version(name, '1', pads.dataset(graphs).to_table().to_pylist(), 'hotpot')\n"
        "print(json.dumps({'loads': version_loads(name, '1'), 'metrics': sorted(metrics), "
        "'model': type(model).__module__}))\n"
    )
    env = {**os.environ, "MLFLOW_TRACKING_URI": mlflow_server, "XH_TAMPER_MARKER": str(marker), "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", script, registered, graphs_folder],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert not marker.exists(), "code from the artifact store ran on load"
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["loads"] is None and "f1" in result["metrics"] and result["model"].startswith("xh.")
