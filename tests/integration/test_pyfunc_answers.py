"""The registered pyfunc answers questions, against the real services (MLflow server, S3 endpoint, the Ray
cluster for the stages that build the world and for batch scoring). A tiny untrained XH model is registered
on graphs of retrieved documents, so that its version names the BM25 index its graphs came from:

- `mlflow.pyfunc.load_model(...).predict` on raw questions gives batch scoring's answers (same version);
- a moved copy of the index on S3 (`XH_INDEX`) answers the same, an index of another snapshot is refused;
- a FEVER version answers raw claims with a label and [page id, line] evidence, its docs table on S3;
- `mlflow models serve` with its default environment manager rebuilds the version's environment offline from
  a local wheel folder and answers JSON questions over HTTP on loopback; `generate-dockerfile` installs the same;
- promotion refuses an evaluation set whose graphs were built with another graph setting, unless opted in.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import mlflow
import pandas as pd
import pyarrow.dataset as pads
import pytest

from tests.conftest import _stop
from xh.config import load_config

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
QUESTIONS = 20  # of the generated world's: retrieved, built into graphs, trained on (0 steps) and asked


def _register(overrides: list[str], graphs_uri: str, name: str, backbone: str, seed: int = 0) -> dict:
    """A real untrained model registered by `log_and_register` (as training does) with the config `overrides`."""
    import tempfile

    import torch

    from xh.model.xh import XHModel
    from xh.registry.register import log_and_register

    cfg = load_config(
        None, [*overrides, f"model.backbone={backbone}", "model.max_node_tokens=64", f"train.register_as={name}"]
    )
    torch.manual_seed(seed)
    mlflow.set_tracking_uri(cfg.mlflow.tracking_uri)
    mlflow.set_experiment(cfg.mlflow.experiment)
    with mlflow.start_run() as run, tempfile.TemporaryDirectory() as folder:
        XHModel.from_backbone(cfg.model).save_pretrained(folder)
        mlflow.end_run()
        return log_and_register(folder, run_id=run.info.run_id, cfg=cfg, metrics={}, graphs_uri=graphs_uri)


@pytest.fixture(scope="module")
def world(synth_tables, ray_cluster, mlflow_server, s3_endpoint, tiny_backbone, tmp_path_factory) -> dict:
    """The generated world's BM25 index, the retrieval and graphs of its first questions (and the same graphs
    in edge mode `full`), and a version registered on those graphs, made `@champion`."""
    from workflows import graphs, retrieve

    tables, questions = synth_tables
    root = tmp_path_factory.mktemp("pyfunc-world")
    asked = questions[:QUESTIONS]
    (root / "questions.json").write_text(json.dumps(asked))
    base = [
        f"storage.root={root}",
        f"retrieve.tables={tables}",
        f"graphs.tables={tables}",
        f"retrieve.questions={root / 'questions.json'}",
        "retrieve.shards=2",
        f"mlflow.tracking_uri={mlflow_server}",
        "mlflow.experiment=pyfunc-tests",
        "mlflow.artifact_location=null",
        "graphs.workers=1",
    ]
    retrieve.all_steps(load_config(None, base))
    built = graphs.build(load_config(None, base))
    assert built["graphs"] >= QUESTIONS // 2, built
    full = root / "graphs-full"
    graphs.build(
        load_config(None, [*base, "graphs.edge_mode=full", f"graphs.output={full}", f"graphs.quarantine={full}-q"])
    )
    name = f"xh-pyfunc-{uuid.uuid4().hex[:6]}"
    registered = _register(base, built["output"], name, tiny_backbone)
    mlflow.MlflowClient().set_registered_model_alias(name, "champion", str(registered["version"]))
    return {
        "root": root,
        "tables": tables,
        "base": base,
        "questions": asked,
        "graphs": built["output"],
        "full_graphs": str(full),
        "name": name,
    }


@pytest.fixture(scope="module")
def classifier(make_tiny_backbone, tmp_path_factory) -> str:
    """A question-type classifier (tiny backbone, templated questions): the version records none."""
    from tests.unit.model.test_qtype import templated
    from xh.model.qtype import QuestionTypeClassifier

    questions, types = templated(120, seed=1)
    folder = tmp_path_factory.mktemp("qtype") / "classifier"
    backbone = make_tiny_backbone(layers=2, max_positions=128)
    QuestionTypeClassifier.train(questions, types, backbone, seed=0).save(folder)
    return str(folder)


def _asked(world: dict, n: int = 8) -> pd.DataFrame:
    return pd.DataFrame(
        {"id": [q["_id"] for q in world["questions"][:n]], "question": [q["question"] for q in world["questions"][:n]]}
    )


def _by_id(frame: pd.DataFrame) -> dict[str, dict]:
    return {row["id"]: row for row in frame.to_dict("records")}


def test_the_version_names_the_index_its_graphs_came_from(world):
    import tempfile

    from xh.registry.register import pipeline_of

    with tempfile.TemporaryDirectory() as dst:
        record, _ = pipeline_of(world["name"], "1", dst)
    assert record["index"]["uri"] == str((world["root"] / "index" / "bm25").resolve())


def test_predict_on_raw_questions_gives_the_answers_of_batch_scoring(
    world, mlflow_server, s3_endpoint, monkeypatch, classifier
):
    """With the same question-type classifier (the version records none: `XH_QUESTION_CLASSIFIER` here,
    `score.question_classifier` there), the pyfunc and batch scoring answer alike; each row says its type came
    from the classifier, and the scoring summary names it."""
    from mlflow.exceptions import MlflowException

    from workflows import score
    from xh.storage.uris import open_output

    monkeypatch.delenv("XH_INDEX", raising=False)
    monkeypatch.delenv("XH_TABLES", raising=False)
    monkeypatch.setenv("XH_QUESTION_CLASSIFIER", classifier)
    mlflow.set_tracking_uri(mlflow_server)
    model = mlflow.pyfunc.load_model(f"models:/{world['name']}@champion")
    asked = _asked(world)
    answered = model.predict(asked)
    assert list(answered["id"]) == list(asked["id"])  # one row per question, in order

    incoming = f"s3://xh-test/pyfunc-incoming-{uuid.uuid4().hex[:6]}"
    with open_output(f"{incoming}/q.jsonl") as out:
        out.write(
            "".join(
                json.dumps({"qid": i, "question": q}) + "\n" for i, q in zip(asked["id"], asked["question"])
            ).encode()
        )
    output = f"s3://xh-test/pyfunc-predictions-{uuid.uuid4().hex[:6]}"
    summary = score.run(
        load_config(
            None,
            [
                *world["base"],
                f"score.input={incoming}",
                f"score.model=models:/{world['name']}@champion",
                f"score.output={output}",
                "score.run_date=2026-11-26",
                "score.batch_size=4",
                f"score.question_classifier={classifier}",
            ],
        )
    )
    assert summary["question_classifier"] == classifier
    partition = f"{output}/run_date=2026-11-26/model={world['name']}/version=1"[len("s3://") :]
    scored = pads.dataset(partition, filesystem=s3_endpoint.pyarrow_fs(), format="parquet").to_table().to_pylist()
    assert summary["pipeline"] == "version" and len(scored) == summary["predictions"] >= 4

    by_id = _by_id(answered)
    answered_rows = [row for row in by_id.values() if row["reason"] is None]
    assert answered_rows and {row["question_type_source"] for row in answered_rows} == {"classifier"}
    assert {r["qid"] for r in scored} == {i for i, row in by_id.items() if row["reason"] is None}
    for row in scored:
        mine = by_id[row["qid"]]
        assert mine["answer"] == row["answer"] and mine["answer_doc_id"] == row["answer_doc_id"]
        facts = [[f["title"], f["sent"]] for f in row["supporting_facts"]]
        assert json.loads(mine["supporting_facts"]) == facts
        assert mine["node_score"] == pytest.approx(row["score"], rel=1e-4, abs=1e-5)

    # prebuilt graph rows are still answered, beside raw questions
    from xh.registry.pyfunc import graph_input

    rows = pads.dataset(world["graphs"], format="parquet").head(2).to_pylist()
    mixed = pd.concat([graph_input(rows), _asked(world, 1)], ignore_index=True)
    both = model.predict(mixed)
    assert list(both["qid"]) == [rows[0]["qid"], rows[1]["qid"], asked["id"][0]]

    # MLflow validates the rows against predict's type hints before anything runs
    with pytest.raises(MlflowException, match="needs an id"):
        model.predict(pd.DataFrame({"question": ["Who?"]}))


def test_a_moved_index_on_s3_answers_the_same_and_another_snapshot_is_refused(
    world, mlflow_server, s3_endpoint, monkeypatch, tmp_path
):
    from pyarrow import fs as pafs

    from workflows import retrieve
    from xh.pipeline_record import PipelineDrift

    mlflow.set_tracking_uri(mlflow_server)
    monkeypatch.delenv("XH_TABLES", raising=False)
    monkeypatch.delenv("XH_INDEX", raising=False)
    monkeypatch.delenv("XH_QUESTION_CLASSIFIER", raising=False)
    here = mlflow.pyfunc.load_model(f"models:/{world['name']}@champion").predict(_asked(world, 4))
    # no classifier anywhere: every answer says its question was taken as a bridge question (#44 defect 1)
    assert set(here["question_type_source"].dropna()) == {"default"} and set(here["question_type"].dropna()) == {
        "bridge"
    }

    moved = f"xh-test/moved-index-{uuid.uuid4().hex[:6]}/bm25"
    pafs.copy_files(
        str(world["root"] / "index" / "bm25"),
        moved,
        source_filesystem=pafs.LocalFileSystem(),
        destination_filesystem=s3_endpoint.pyarrow_fs(),
    )
    monkeypatch.setenv("XH_INDEX", f"s3://{moved}")
    there = mlflow.pyfunc.load_model(f"models:/{world['name']}@champion").predict(_asked(world, 4))
    assert there.to_dict("records") == here.to_dict("records")

    other = load_config(None, [f"storage.root={tmp_path}", f"retrieve.tables={world['tables']}", "retrieve.shards=1"])
    retrieve.index(other)  # the same docs in one shard: another manifest, another snapshot
    monkeypatch.setenv("XH_INDEX", str(tmp_path / "index" / "bm25"))
    with pytest.raises(
        PipelineDrift, match=r"^XH_INDEX=.* differs from the model version's .*\(snapshot sha256:.*\(unset it"
    ):
        mlflow.pyfunc.load_model(f"models:/{world['name']}@champion").predict(_asked(world, 1))


def _port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(url: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


@pytest.fixture(scope="module")
def local_index(tmp_path_factory) -> Path:
    """A wheel folder standing in for the team's index (`tests/wheelhouse.py`): the project's wheel from this
    checkout and a wheel of everything a version's requirements install, offline. Kept between runs under
    `XH_TEST_WHEELHOUSE` when set (the installed packages' wheels do not change; the project's is rebuilt)."""
    from tests.wheelhouse import wheelhouse
    from xh.registry.register import pip_requirements, project_distribution

    folder = Path(os.environ.get("XH_TEST_WHEELHOUSE") or tmp_path_factory.mktemp("wheelhouse"))
    return wheelhouse(ROOT, pip_requirements(), folder, project_distribution())


def _serve(model_uri: str, env: dict, cwd: Path, log: Path, extra: list[str] = ()) -> tuple[subprocess.Popen, int]:
    port = _port()
    command = [str(BIN / "mlflow"), "models", "serve", "-m", model_uri, "-h", "127.0.0.1", "-p", str(port), "-w", "1"]
    with open(log, "w") as out:
        return subprocess.Popen([*command, *extra], stdout=out, stderr=out, env=env, cwd=cwd), port


def _wait_ping(server: subprocess.Popen, port: int, log: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        assert server.poll() is None, log.read_text()[-3000:]
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=2):
                return
        except OSError:
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(1)


# Opt-in: the wheel folder is 1.9 GB of repacked wheels and the new environment installs all of them: 14 minutes
# on 2 cores under load (docs/testing.md), half of CI's budget for the whole suite. XH_TEST_WHEELHOUSE=DIR runs
# it (and keeps the folder between runs).
@pytest.mark.skipif(
    not os.environ.get("XH_TEST_WHEELHOUSE"),
    reason="opt-in (about 14 minutes): set XH_TEST_WHEELHOUSE=DIR to rebuild a version's environment from wheels",
)
@pytest.mark.timeout(3000)
def test_mlflow_models_serve_with_its_default_environment_manager_rebuilds_the_version_and_answers(
    world, mlflow_server, s3_endpoint, tmp_path, monkeypatch, local_index
):
    """`mlflow models serve` as a user runs it (the default `virtualenv` manager: pyenv's Python, a new venv,
    the version's requirements.txt installed by pip) from a folder outside the checkout, offline: pip finds
    every wheel in the local wheel folder (`PIP_NO_INDEX`, `PIP_FIND_LINKS`). The rebuilt environment answers
    raw questions as `mlflow.pyfunc` does here, refuses a call over the row limit, and answers a bad row with
    its reason beside the good ones."""
    monkeypatch.delenv("XH_INDEX", raising=False)
    monkeypatch.delenv("XH_TABLES", raising=False)
    mlflow.set_tracking_uri(mlflow_server)
    asked = _asked(world, 3)
    expected = mlflow.pyfunc.load_model(f"models:/{world['name']}@champion").predict(asked)

    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env |= {
        "MLFLOW_TRACKING_URI": mlflow_server,
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": str(local_index),
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "MLFLOW_ENV_ROOT": str(tmp_path / "envs"),  # a new environment: the version's requirements alone
    }
    log = tmp_path / "serve.log"
    server, port = _serve(f"models:/{world['name']}@champion", env, tmp_path, log)
    try:
        _wait_ping(server, port, log, 2400)
        text = log.read_text()
        assert "virtualenv" in text.lower() or "Installing dependencies" in text, text[-2000:]
        rows = [{"id": i, "question": q} for i, q in zip(asked["id"], asked["question"])]
        status, body = _post(f"http://127.0.0.1:{port}/invocations", {"inputs": rows})
        assert status == 200, body
        served = {p["id"]: p for p in body["predictions"]}
        for row in expected.to_dict("records"):
            assert served[row["id"]]["answer"] == row["answer"] and served[row["id"]]["reason"] == row["reason"]
            assert served[row["id"]]["supporting_facts"] == row["supporting_facts"]
        claim = [*rows[:1], {"id": "c", "claim": "Telemundo is owned by NBCUniversal."}]
        status, body = _post(f"http://127.0.0.1:{port}/invocations", {"inputs": claim})
        assert status == 200 and body["predictions"][1]["reason"].startswith("a claim to a HotpotQA version"), body
        assert body["predictions"][0]["answer"] == served[rows[0]["id"]]["answer"]
        many = [{"id": str(i), "question": "Who?"} for i in range(65)]
        status, body = _post(f"http://127.0.0.1:{port}/invocations", {"inputs": many})
        assert status == 400 and "65 rows, more than 64 a call" in body["message"], body
        status, body = _post(f"http://127.0.0.1:{port}/invocations", {"inputs": [{"question": "Who?"}]})
        assert status == 400 and "needs an id" in body["message"]
    finally:
        _stop(server)
    installed = list((tmp_path / "envs").rglob("site-packages/xh/pyfunc_entry.py"))
    assert installed, "the loader module came from the project's wheel, installed in the new environment"


def test_mlflow_models_generate_dockerfile_gives_an_image_that_installs_the_project_and_its_loaders_packages(
    world, mlflow_server, tmp_path
):
    """`mlflow models build-docker`'s build context (`generate-dockerfile`): the version's requirements name
    the project's distribution and every package its loader imports, pinned, and the Dockerfile installs them."""
    from xh.registry.register import pip_requirements

    env = {**os.environ, "MLFLOW_TRACKING_URI": mlflow_server}
    out = tmp_path / "docker"
    done = subprocess.run(
        [
            str(BIN / "mlflow"),
            "models",
            "generate-dockerfile",
            "-m",
            f"models:/{world['name']}@champion",
            "-d",
            str(out),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    dockerfile = (out / "Dockerfile").read_text()
    (model_dir,) = {f.parent for f in (out / "model_dir").rglob("MLmodel")}
    requirements = (model_dir / "requirements.txt").read_text().split()
    assert sorted(requirements) == sorted(pip_requirements())
    assert any(r.startswith("transformer-xh-ray==") for r in requirements)
    assert any(r.startswith("PyStemmer==") for r in requirements)
    assert "model_dir" in dockerfile and "install" in dockerfile, dockerfile
    example = json.loads((model_dir / "input_example.json").read_text())
    assert "question" in json.dumps(example)


@pytest.fixture(scope="module")
def fever_version(fever_docs, s3_endpoint, mlflow_server, tiny_backbone, tmp_path_factory) -> dict:
    """A FEVER version registered on graphs of a small hand-made corpus, whose docs table is on S3."""
    from tests.unit.graph.test_graph_fever import PAGES, SOUL_FOOD, TELEMUNDO, UNVERIFIABLE
    from xh.graph.fever import FeverGraphBuilder, FeverGraphSettings
    from xh.graph.store import write_shard
    from xh.storage.store import Store
    from xh.storage.uris import open_output

    docs = fever_docs(PAGES)
    tables = f"s3://xh-test/fever-tables-{uuid.uuid4().hex[:6]}"
    write_shard(docs.to_pylist(), Store(s3=s3_endpoint).at(f"{tables}/docs"), 0, docs.schema)
    rows, quarantined = FeverGraphBuilder(docs, FeverGraphSettings()).build([SOUL_FOOD, TELEMUNDO, UNVERIFIABLE])
    assert rows and not quarantined
    folder = str(tmp_path_factory.mktemp("fever-graphs") / "fever")
    write_shard(rows, Store().at(folder), 0)
    cfg = load_config(None, ["graphs.task=fever"])
    summary = {"task": "fever", "setting": "retrieval", "edge_mode": cfg.graphs.edge_mode}
    summary["settings"] = cfg.graphs.model_dump(
        mode="json", exclude={"questions", "retrieval", "tables", "output", "quarantine"}
    )
    with open_output(f"{folder}/_summary.json") as out:
        out.write(json.dumps(summary).encode())
    name = f"xh-fever-{uuid.uuid4().hex[:6]}"
    overrides = [
        f"mlflow.tracking_uri={mlflow_server}",
        "mlflow.experiment=pyfunc-tests",
        "mlflow.artifact_location=null",
        "graphs.task=fever",
        "model.task=fever",
        f"retrieve.tables={tables}",
    ]
    _register(overrides, folder, name, tiny_backbone)
    return {"name": name, "tables": tables, "pages": PAGES}


def test_a_fever_version_answers_raw_claims_with_a_label_and_page_line_evidence(
    fever_version, mlflow_server, monkeypatch
):
    monkeypatch.delenv("XH_INDEX", raising=False)
    monkeypatch.delenv("XH_TABLES", raising=False)
    mlflow.set_tracking_uri(mlflow_server)
    model = mlflow.pyfunc.load_model(f"models:/{fever_version['name']}/1")
    claims = ["Soul Food was produced by Kenneth Edmonds.", "Telemundo is owned by NBCUniversal."]
    answered = model.predict(pd.DataFrame({"id": [75397, 150448], "claim": claims}))
    assert list(answered["id"]) == ["75397", "150448"]
    for row in answered.to_dict("records"):
        assert row["reason"] is None
        assert row["label"] in {"SUPPORTS", "REFUTES", "NOT ENOUGH INFO"}
        assert sum(json.loads(row["label_probs"]).values()) == pytest.approx(1.0, abs=1e-4)
        evidence = json.loads(row["evidence"])
        assert evidence and all(0 <= line < len(fever_version["pages"][page]) for page, line in evidence)
    soul, telemundo = (json.loads(e) for e in answered["evidence"])
    assert {p for p, _ in soul} & {"Soul_Food_-LRB-film-RRB-", "Kenneth_Edmonds"}  # retrieved for its own claim
    assert "Telemundo" in {p for p, _ in telemundo}


def test_promotion_refuses_an_eval_set_built_with_another_graph_setting_unless_opted_in(
    world, tiny_backbone, mlflow_server, s3_endpoint
):
    from workflows import promote
    from xh.pipeline_record import PipelineDrift

    name = f"xh-pyfunc-promote-{uuid.uuid4().hex[:6]}"
    _register(world["base"], world["graphs"], name, tiny_backbone, seed=1)  # a run without a recorded split
    overrides = [*world["base"], f"promote.model={name}", "promote.floor=0.01"]

    with pytest.raises(PipelineDrift) as refused:
        promote.run(load_config(None, [*overrides, f"promote.eval_set={world['full_graphs']}"]))
    message = str(refused.value)
    assert message.startswith(f"graphs.edge_mode='full' of the evaluation set {world['full_graphs']} differs")
    assert f"{name} version 1's 'hyperlink'" in message and "\n" not in message
    assert mlflow.MlflowClient().get_model_version(name, "1").tags.get("promotion_decision") is None  # no decision

    decision = promote.run(
        load_config(None, [*overrides, f"promote.eval_set={world['full_graphs']}", "score.allow_drift=true"])
    )
    assert decision["pipeline_drift"] == {"graphs.edge_mode": {"version": "hyperlink", "used": "full"}}
    assert json.loads(mlflow.MlflowClient().get_run(decision["decision_run_id"]).data.tags["pipeline_drift"]) == {
        "graphs.edge_mode": {"version": "hyperlink", "used": "full"}
    }
    # graphs built as the version's were: no drift to record
    same = promote.run(load_config(None, [*overrides, f"promote.eval_set={world['graphs']}"]))
    assert "pipeline_drift" not in same and same["decision_run_id"]
