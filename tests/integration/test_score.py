"""Promotion and batch scoring against the real services: MLflow server (registry), S3 endpoint,
the two-node Ray cluster. The registered models are real XH models (tiny backbone, untrained):
what is tested here is the registry and the scoring pipeline, not answer quality."""

from __future__ import annotations

import bz2
import json
import uuid
from contextlib import contextmanager

import mlflow
import pyarrow.dataset as pads
import pytest

from xh.config import load_config
from xh.storage.tables import Stages


class InjectedFailure(RuntimeError):
    """A run stopped before a stage by `fail_before` (tests of resumption)."""


@pytest.fixture
def fail_before(monkeypatch):
    """Fault injection for resumption tests: `with fail_before("inference"): score.run(cfg)` stops the
    run with `InjectedFailure` just before that stage starts, its earlier stages finished in staging.
    In-process (the stages run in the driver's process): no setting or variable in the product for it."""
    run = Stages.run

    @contextmanager
    def failing(stage: str):
        def stopped(self, name, *args, **kwargs):
            if name == stage:
                raise InjectedFailure(f"stopping before the {name} stage")
            return run(self, name, *args, **kwargs)

        with monkeypatch.context() as patch:
            patch.setattr(Stages, "run", stopped)
            with pytest.raises(InjectedFailure):
                yield

    return failing


@pytest.fixture(scope="module")
def scoring_world(synth_tables, world_graphs, tmp_path_factory, ray_cluster):
    """The generated world's tables with a BM25 index, and dev graphs with gold labels (the session's)."""
    from workflows import retrieve

    tables, questions = synth_tables
    root = tmp_path_factory.mktemp("score-world")
    cfg = load_config(None, [f"storage.root={root}", f"retrieve.tables={tables}", "retrieve.shards=2"])
    retrieve.index(cfg)
    return {"root": root, "tables": tables, "questions": questions, "graphs": world_graphs}


def _register(name: str, backbone: str, graphs: str, tracking: str, seed: int) -> int:
    """A real (untrained) XH model logged to a run and registered as @challenger."""
    import tempfile

    import torch

    from xh.model.xh import XHModel
    from xh.registry.register import log_and_register

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
    from xh.registry.champion import promote, rollback

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

    from xh.registry.champion import promote

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
    scoring_world, tiny_backbone, mlflow_server, s3_endpoint, fail_before
):
    from workflows import score
    from xh.storage.uris import open_output

    mlflow.set_tracking_uri(mlflow_server)
    name = f"xh-score-{uuid.uuid4().hex[:6]}"
    _register(name, tiny_backbone, scoring_world["graphs"], mlflow_server, seed=3)
    mlflow.MlflowClient().set_registered_model_alias(name, "champion", "1")

    good = [{"qid": q["_id"], "question": q["question"]} for q in scoring_world["questions"][:10]]
    lines = [json.dumps(r) for r in good] + ['{"qid": "empty", "question": "  "}', "{not json"]
    incoming = f"s3://xh-test/incoming-{uuid.uuid4().hex[:6]}"
    with open_output(f"{incoming}/2026-11-22.jsonl") as out:
        out.write(("\n".join(lines) + "\n").encode())
    # A second file, bz2 in two streams, the second cut off: its first stream's good records are scored,
    # its bad ones (wrong types, not UTF-8, a repeated id) and the break are quarantined, not the run failed.
    late = [json.dumps({"qid": q["_id"], "question": q["question"]}) for q in scoring_world["questions"][10:12]]
    late += ['{"qid": "typed", "question": "Who?", "type": 5}', '{"qid": "levelled", "question": "Who?", "level": []}']
    late += [late[0]]
    late_bytes = ("\n".join(late) + "\n").encode() + b'{"qid": "latin1", "question": "Caf\xe9?"}\n'
    cut = bz2.compress(b'{"qid": "lost", "question": "Cut?"}\n' * 50)
    with open_output(f"{incoming}/2026-11-22-late.jsonl.bz2") as out:
        out.write(bz2.compress(late_bytes) + cut[: len(cut) // 2])
    late_records = len(late) + 1 + 1  # the Latin-1 line and the break
    output = f"s3://xh-test/predictions-{uuid.uuid4().hex[:6]}"
    overrides = _score_overrides(scoring_world, mlflow_server, name, incoming, output, run_date="2026-11-22")

    with fail_before("inference"):
        score.run(load_config(None, overrides))
    summary = score.run(load_config(None, overrides))
    assert summary["resumed_stages"] == ["parse", "graphs"]  # the failed run's finished stages were kept
    assert summary["model"]["version"] == "1"
    records = len(lines) + late_records
    assert summary["records"] == records == summary["predictions"] + sum(summary["quarantined"].values())
    assert summary["quarantined"]["empty question"] == 1
    assert any(reason.startswith("not JSON") for reason in summary["quarantined"])
    for reason in ("invalid type: a number", "invalid level: an array", "duplicate id", "non-utf8 bytes"):
        assert any(r.startswith(reason) for r in summary["quarantined"]), (reason, summary["quarantined"])
    assert any(r.startswith("truncated stream") for r in summary["quarantined"])

    partition = f"{output}/run_date=2026-11-22/model={name}/version=1"
    fs = s3_endpoint.pyarrow_fs()
    table = pads.dataset(partition[len("s3://") :], filesystem=fs, format="parquet").to_table()
    assert table.num_rows == summary["predictions"] >= 8
    assert {q["_id"] for q in scoring_world["questions"][10:12]} <= set(table.column("qid").to_pylist())
    row = table.slice(0, 1).to_pylist()[0]
    assert row["model_name"] == name and row["model_version"] == "1" and row["run_id"]
    assert row["corpus_snapshot"].startswith(str(scoring_world["root"]))
    # no classifier configured: each row says its question was scored as a bridge question by default
    assert {(r["question_type"], r["question_type_source"]) for r in table.to_pylist()} == {("bridge", "default")}

    again = score.run(load_config(None, overrides))  # same date and model: replaced, not duplicated
    assert again["resumed_stages"] == []
    assert pads.dataset(partition[len("s3://") :], filesystem=fs, format="parquet").count_rows() == table.num_rows


def _delete_artifacts(name: str, version: str, s3_endpoint) -> None:
    """Remove a registered version's model files from the artifact store (the registry entry stays)."""
    uri = mlflow.MlflowClient().get_model_version_download_uri(name, version)
    assert uri.startswith("mlflow-artifacts:/"), uri
    s3_endpoint.pyarrow_fs().delete_dir(f"xh-test/mlflow-artifacts/{uri[len('mlflow-artifacts:/') :].strip('/')}")


@pytest.mark.parametrize("first", ["worse", "better"])
def test_two_concurrent_promotions_leave_the_better_model_champion_and_every_replaced_version_in_history(
    first, scoring_world, tiny_backbone, mlflow_server, s3_endpoint, monkeypatch
):
    """Two promotions judge their challengers against the same champion (v1) at the same time; one moves
    @champion first, the other must notice when it writes and judge against the new champion."""
    import threading
    import time

    from xh.registry.champion import promote
    from xh.registry.lock import LOCK_SUFFIX

    mlflow.set_tracking_uri(mlflow_server)
    name = f"xh-race-{uuid.uuid4().hex[:6]}"
    for seed in (1, 2, 3):
        _register(name, tiny_backbone, scoring_world["graphs"], mlflow_server, seed=seed)
    client = mlflow.MlflowClient()
    client.set_registered_model_alias(name, "champion", "1")
    f1 = {"1": 0.30, "2": 0.50, "3": 0.80}  # v3 is the better challenger, v2 the worse
    later = "3" if first == "worse" else "2"  # the promotion that writes second
    evaluated_v1 = threading.Barrier(2, timeout=120)

    def fixed_metrics(model_name, version, rows, task, missed=()):
        if version == "1":
            evaluated_v1.wait()  # both have judged against v1 before either writes
            if str(threading.current_thread().name) == later:
                deadline = time.monotonic() + 120
                while client.get_model_version_by_alias(name, "champion").version == "1":
                    assert time.monotonic() < deadline, "the other promotion never moved @champion"
                    time.sleep(0.2)
        return {"f1": f1[version]}

    decisions: dict[str, dict] = {}

    def run(version: str) -> None:
        decisions[version] = promote(
            name, [], metric="f1", min_delta=0.5, challenger_version=version, evaluate=fixed_metrics
        )

    threads = [threading.Thread(target=run, args=(v,), name=v) for v in ("2", "3")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert set(decisions) == {"2", "3"}

    assert client.get_model_version_by_alias(name, "champion").version == "3"
    history = json.loads(client.get_registered_model(name).tags["champion_history"])
    late = decisions[later]
    assert late["champion"] != "1"  # the later decision names the champion it was really compared against
    if first == "worse":
        assert decisions["2"]["promoted"] and decisions["2"]["champion"] == "1"
        assert late["promoted"] and late["champion"] == "2" and late["champion_score"] == 50.0
        assert history == ["1", "2"]
    else:
        assert decisions["3"]["promoted"] and decisions["3"]["champion"] == "1"
        assert not late["promoted"] and late["champion"] == "3" and "vs champion 80.00" in late["reason"]
        assert history == ["1"]
    recorded = json.loads(client.get_model_version(name, later).tags["promotion_decision"])
    assert recorded["champion"] == late["champion"]
    assert name + LOCK_SUFFIX not in {m.name for m in client.search_registered_models()}  # released


def test_a_promotion_waits_for_a_lease_another_holds_and_gives_up_with_a_decision(
    scoring_world, tiny_backbone, mlflow_server, s3_endpoint, monkeypatch
):
    import time

    from xh.registry.champion import promote
    from xh.registry.lock import LOCK_SUFFIX
    from xh.registry.versions import alias_version

    mlflow.set_tracking_uri(mlflow_server)
    name = f"xh-lease-{uuid.uuid4().hex[:6]}"
    _register(name, tiny_backbone, scoring_world["graphs"], mlflow_server, seed=1)
    client = mlflow.MlflowClient()
    fixed = lambda *a: {"f1": 0.5}  # noqa: E731
    lock = name + LOCK_SUFFIX  # the registry lock, held by another promotion
    client.create_registered_model(lock, tags={"owner": "someone-else", "expires": str(time.time() + 60)})
    blocked = promote(name, [], metric="f1", lease_timeout_s=2.0, evaluate=fixed)
    assert not blocked["promoted"] and "holds" in blocked["reason"]
    assert alias_version(name, "champion") is None

    client.set_registered_model_tag(lock, "expires", str(time.time() - 1))  # an expired lock is broken
    taken = promote(name, [], metric="f1", lease_timeout_s=2.0, evaluate=fixed)
    assert taken["promoted"] and client.get_model_version_by_alias(name, "champion").version == "1"


def test_an_unloadable_champion_is_a_decision_and_rollback_refuses_a_version_that_does_not_load(
    scoring_world, tiny_backbone, mlflow_server, s3_endpoint
):
    from xh.graph.store import read_eval_set
    from xh.registry.champion import promote, rollback

    mlflow.set_tracking_uri(mlflow_server)
    client = mlflow.MlflowClient()
    name = f"xh-gone-{uuid.uuid4().hex[:6]}"
    rows = read_eval_set(scoring_world["graphs"])[:4]
    _register(name, tiny_backbone, scoring_world["graphs"], mlflow_server, seed=1)
    assert promote(name, rows, metric="f1", floor=0.0)["promoted"]
    _register(name, tiny_backbone, scoring_world["graphs"], mlflow_server, seed=2)
    assert promote(name, rows, metric="f1", min_delta=-101.0)["promoted"]  # champion v2, history [1]

    _delete_artifacts(name, "1", s3_endpoint)
    with pytest.raises(ValueError, match="version 1 does not load") as refused:
        rollback(name)
    assert "\n" not in str(refused.value)
    assert client.get_model_version_by_alias(name, "champion").version == "2"

    _delete_artifacts(name, "2", s3_endpoint)
    _register(name, tiny_backbone, scoring_world["graphs"], mlflow_server, seed=3)
    below = promote(name, rows, metric="f1", min_delta=0.0, floor=101.0)  # against nothing: the floor decides
    assert not below["promoted"] and "champion unloadable" in below["reason"] and "floor 101" in below["reason"]
    assert client.get_model_version_by_alias(name, "champion").version == "2"
    passed = promote(name, rows, metric="f1", floor=0.0)
    assert passed["promoted"] and passed["champion"] == "2" and "champion unloadable" in passed["reason"]
    assert client.get_model_version_by_alias(name, "champion").version == "3"
    assert json.loads(client.get_registered_model(name).tags["champion_history"]) == ["1", "2"]


def _champion(prefix: str, backbone: str, scoring_world, mlflow_server: str, seed: int) -> str:
    """A tiny model registered under a new name and made its `@champion`; its name."""
    mlflow.set_tracking_uri(mlflow_server)
    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    _register(name, backbone, scoring_world["graphs"], mlflow_server, seed=seed)
    mlflow.MlflowClient().set_registered_model_alias(name, "champion", "1")
    return name


def _score_overrides(
    scoring_world, mlflow_server, name: str, incoming: str, output: str, run_date: str = "2026-11-23"
) -> list[str]:
    """Scoring `incoming` into `output` with `name`'s champion over the scoring world's tables."""
    return [
        f"storage.root={scoring_world['root']}",
        f"retrieve.tables={scoring_world['tables']}",
        f"mlflow.tracking_uri={mlflow_server}",
        f"score.input={incoming}",
        f"score.model=models:/{name}@champion",
        f"score.output={output}",
        f"score.run_date={run_date}",
        "score.batch_size=4",
    ]


def _write_questions(uri: str, lines: list[str]) -> None:
    from xh.storage.uris import open_output

    with open_output(uri) as out:
        out.write(("\n".join(lines) + "\n").encode())


def test_a_failed_run_re_run_on_other_input_for_the_same_date_does_not_resume_the_first_inputs_stages(
    scoring_world, tiny_backbone, mlflow_server, s3_endpoint, fail_before
):
    from workflows import score

    mlflow.set_tracking_uri(mlflow_server)
    name = f"xh-key-{uuid.uuid4().hex[:6]}"
    _register(name, tiny_backbone, scoring_world["graphs"], mlflow_server, seed=3)
    mlflow.MlflowClient().set_registered_model_alias(name, "champion", "1")
    questions = scoring_world["questions"]
    first = [json.dumps({"qid": f"a-{q['_id']}", "question": q["question"]}) for q in questions[:4]]
    second = [json.dumps({"qid": f"b-{q['_id']}", "question": q["question"]}) for q in questions[4:9]]
    input_a, input_b = (f"s3://xh-test/incoming-{uuid.uuid4().hex[:6]}" for _ in range(2))
    _write_questions(f"{input_a}/q.jsonl", first)
    _write_questions(f"{input_b}/q.jsonl", second)
    output = f"s3://xh-test/predictions-{uuid.uuid4().hex[:6]}"

    with fail_before("inference"):
        score.run(load_config(None, _score_overrides(scoring_world, mlflow_server, name, input_a, output)))
    summary = score.run(load_config(None, _score_overrides(scoring_world, mlflow_server, name, input_b, output)))
    assert summary["resumed_stages"] == [] and summary["staging_discarded"]
    partition = f"{output}/run_date=2026-11-23/model={name}/version=1"
    fs = s3_endpoint.pyarrow_fs()
    table = pads.dataset(partition[len("s3://") :], filesystem=fs, format="parquet").to_table()
    qids = set(table["qid"].to_pylist())
    assert qids and all(q.startswith("b-") for q in qids)

    # the same input and settings still resume; another scoring setting does not
    overrides_a = _score_overrides(scoring_world, mlflow_server, name, input_a, output)
    with fail_before("inference"):
        score.run(load_config(None, overrides_a))
    with fail_before("inference"):
        score.run(load_config(None, [*overrides_a, "score.batch_graphs=2"]))
    resumed = score.run(load_config(None, [*overrides_a, "score.batch_graphs=2"]))
    assert resumed["resumed_stages"] == ["parse", "graphs"] and not resumed["staging_discarded"]


def test_an_input_whose_every_record_is_bad_gives_an_empty_complete_output_and_later_runs_still_work(
    scoring_world, tiny_backbone, mlflow_server, s3_endpoint
):
    from workflows import score

    mlflow.set_tracking_uri(mlflow_server)
    name = f"xh-bad-input-{uuid.uuid4().hex[:6]}"
    _register(name, tiny_backbone, scoring_world["graphs"], mlflow_server, seed=3)
    mlflow.MlflowClient().set_registered_model_alias(name, "champion", "1")
    incoming = f"s3://xh-test/incoming-{uuid.uuid4().hex[:6]}"
    _write_questions(f"{incoming}/bad.jsonl", ["{not json", '{"qid": "e", "question": " "}'])
    _write_questions(f"{incoming}/empty.jsonl", [])  # an empty file adds no record
    output = f"s3://xh-test/predictions-{uuid.uuid4().hex[:6]}"
    overrides = _score_overrides(scoring_world, mlflow_server, name, incoming, output)

    for _ in range(2):  # the second run for the date must not trip over what the first left
        summary = score.run(load_config(None, overrides))
        assert summary["predictions"] == 0 and summary["records"] == 2
        assert sum(summary["quarantined"].values()) == 2
    partition = f"{output}/run_date=2026-11-23/model={name}/version=1"
    fs = s3_endpoint.pyarrow_fs()
    assert pads.dataset(partition[len("s3://") :], filesystem=fs, format="parquet").count_rows() == 0


@pytest.fixture(scope="module")
def typed_graphs(scoring_world) -> str:
    """The generated world's graphs in edge mode `typed` (GESA reads the types; DocHopper ignores edges)."""
    from workflows import graphs

    out = scoring_world["root"] / "typed"
    questions = scoring_world["tables"].parent / "world" / "hotpot" / "questions.json"
    cfg = load_config(
        None,
        [
            f"storage.root={out}",
            "graphs.setting=distractor",
            "graphs.edge_mode=typed",
            "graphs.workers=1",
            f"graphs.questions={questions}",
        ],
    )
    graphs.build(cfg)
    return str(out / "graphs" / "hotpot")


def tiny_training(root, ray_cluster, mlflow_server: str, experiment: str, backbone: str) -> list[str]:
    """Overrides of a 2-step training run of a tiny backbone on the session cluster (a quarter held out)."""
    return [
        f"storage.root={root}",
        f"ray.address={ray_cluster.address}",
        f"mlflow.tracking_uri={mlflow_server}",
        f"mlflow.experiment={experiment}",
        f"model.backbone={backbone}",
        "model.max_node_tokens=64",
        "train.workers=1",
        "train.batch_graphs=2",
        "train.cpus_per_worker=0.5",
        "train.max_steps=2",
        "train.dev_fraction=0.25",
        "train.eval_batch_graphs=16",
    ]


@pytest.fixture(scope="module", params=["model.hop_variant=gesa", "model.architecture=dochopper"])
def trained_variant(request, typed_graphs, tiny_backbone, ray_cluster, mlflow_server, s3_endpoint, tmp_path_factory):
    """Each variant trained (2 steps) and registered by the same driver and settings as XH."""
    from workflows import train

    mlflow.set_tracking_uri(mlflow_server)
    name = f"xh-variant-{uuid.uuid4().hex[:6]}"
    summary = train.run(
        load_config(
            None,
            [
                *tiny_training(
                    tmp_path_factory.mktemp("variant"), ray_cluster, mlflow_server, "variant-tests", tiny_backbone
                ),
                request.param,
                f"train.graphs={typed_graphs}",
                f"train.register_as={name}",
            ],
        )
    )
    architecture = "dochopper" if "dochopper" in request.param else "xh"
    return {"name": name, "summary": summary, "architecture": architecture}


def test_each_variant_trains_registers_with_its_flavour_and_is_promoted(trained_variant, typed_graphs, mlflow_server):
    from xh.graph.store import read_eval_set
    from xh.registry.champion import promote

    name, architecture = trained_variant["name"], trained_variant["architecture"]
    assert trained_variant["summary"]["step"] == 2 and trained_variant["summary"]["registered"]["version"] == 1
    mlflow.set_tracking_uri(mlflow_server)
    client = mlflow.MlflowClient()
    tags = client.get_model_version(name, "1").tags
    assert tags["architecture"] == architecture and (architecture == "dochopper" or tags["hop_variant"] == "gesa")

    decision = promote(name, read_eval_set(typed_graphs)[:8], metric="f1", floor=0.0)
    assert decision["promoted"] and client.get_model_version_by_alias(name, "champion").version == "1"


def test_each_variant_batch_scores_with_the_xh_command(trained_variant, scoring_world, mlflow_server, s3_endpoint):
    from workflows import score
    from xh.storage.uris import list_files, open_output

    name, architecture = trained_variant["name"], trained_variant["architecture"]
    mlflow.set_tracking_uri(mlflow_server)
    mlflow.MlflowClient().set_registered_model_alias(name, "champion", "1")
    incoming = f"s3://xh-test/incoming-{uuid.uuid4().hex[:6]}"
    with open_output(f"{incoming}/2026-11-23.jsonl") as out:
        questions = scoring_world["questions"][:6]
        out.write("".join(json.dumps({"qid": q["_id"], "question": q["question"]}) + "\n" for q in questions).encode())
    output = f"s3://xh-test/predictions-{uuid.uuid4().hex[:6]}"
    scored = score.run(
        load_config(
            None,
            [
                f"storage.root={scoring_world['root']}",
                f"retrieve.tables={scoring_world['tables']}",
                f"mlflow.tracking_uri={mlflow_server}",
                "graphs.edge_mode=typed",
                f"score.input={incoming}",
                f"score.model=models:/{name}@champion",
                f"score.output={output}",
                "score.run_date=2026-11-23",
                "score.batch_size=3",
            ],
        )
    )
    assert scored["predictions"] >= 4 and scored["records"] == 6
    table = pads.dataset(
        f"{output}/run_date=2026-11-23/model={name}/version=1"[len("s3://") :],
        filesystem=s3_endpoint.pyarrow_fs(),
        format="parquet",
    ).to_table()
    assert table.num_rows == scored["predictions"] and all(isinstance(a, str) for a in table["answer"].to_pylist())
    if architecture == "dochopper":  # its paragraph embeddings, stored per model version and corpus snapshot
        assert list_files(f"{output}/_cache/{name}-v1", s3_endpoint, suffix=".safetensors")


def _partition_table(output: str, name: str, s3_endpoint, run_date: str = "2026-11-23"):
    partition = f"{output}/run_date={run_date}/model={name}/version=1"
    return pads.dataset(partition[len("s3://") :], filesystem=s3_endpoint.pyarrow_fs(), format="parquet").to_table()


def test_an_id_in_two_input_files_is_scored_once_from_the_later_file_with_its_own_evidence(
    scoring_world, tiny_backbone, mlflow_server, s3_endpoint
):
    """Two dated files of one run share four ids, each with another question: the later file's records
    are scored, the earlier ones quarantined, and no prediction uses the other question's documents.
    A question over score.max_question_chars is quarantined too."""
    import pyarrow.parquet as pq

    from workflows import score
    from xh.pipeline import settings_of
    from xh.retrieval.candidates import Retriever

    name = _champion("xh-dup", tiny_backbone, scoring_world, mlflow_server, seed=3)
    questions = scoring_world["questions"]
    earlier = {f"id-{i}": questions[i]["question"] for i in range(6)}
    later = {f"id-{i}": questions[20 + i]["question"] for i in range(4)} | {"id-late": questions[30]["question"]}
    incoming = f"s3://xh-test/incoming-{uuid.uuid4().hex[:6]}"
    _write_questions(
        f"{incoming}/2026-11-21.jsonl", [json.dumps({"qid": q, "question": t}) for q, t in earlier.items()]
    )
    long_question = json.dumps({"qid": "long", "question": "Which film came out first? " * 100})  # 2,700 characters
    _write_questions(
        f"{incoming}/2026-11-22.jsonl",
        [json.dumps({"qid": q, "question": t}) for q, t in later.items()] + [long_question],
    )
    output = f"s3://xh-test/predictions-{uuid.uuid4().hex[:6]}"
    cfg = load_config(None, _score_overrides(scoring_world, mlflow_server, name, incoming, output))
    summary = score.run(cfg)

    assert summary["records"] == len(earlier) + len(later) + 1  # in = out + quarantined
    assert summary["records"] == summary["predictions"] + sum(summary["quarantined"].values())
    assert summary["quarantined"][f"duplicate id: superseded by {incoming}/2026-11-22.jsonl"] == 4
    assert summary["quarantined"]["question too long: 2699 characters (limit 2000)"] == 1
    table = _partition_table(output, name, s3_endpoint)
    qids = table["qid"].to_pylist()
    assert len(qids) == len(set(qids)) == summary["predictions"] >= 6  # one prediction per id
    expected = earlier | later  # the later file's question where both have the id
    assert all(row["question"] == expected[row["qid"]] for row in table.to_pylist())

    # each prediction's answer document and supporting facts come from its own question's candidates
    retrieval, _ = settings_of(cfg)
    retriever = Retriever.load(str(scoring_world["root"] / "index" / "bm25"), str(scoring_world["tables"]), retrieval)
    docs = pq.read_table(scoring_world["tables"] / "docs", columns=["doc_id", "title"])
    title_of = dict(zip(docs["doc_id"].to_pylist(), docs["title"].to_pylist()))
    checked = 0
    for row in table.to_pylist():
        own = {c["doc_id"] for c in retriever.candidates([row["qid"]], [row["question"]])}
        used = {fact["title"] for fact in row["supporting_facts"]} | {title_of.get(row["answer_doc_id"])} - {None}
        assert used <= {title_of[d] for d in own}, row["qid"]
        checked += len(used)
    assert checked


def test_a_partition_holds_every_input_scored_for_its_date_and_model_and_is_replaced_only_with_the_flag(
    scoring_world, tiny_backbone, mlflow_server, s3_endpoint
):
    from workflows import score

    name = _champion("xh-keep", tiny_backbone, scoring_world, mlflow_server, seed=3)
    questions = scoring_world["questions"]
    output = f"s3://xh-test/predictions-{uuid.uuid4().hex[:6]}"

    def run(lines: list[str], *extra: str) -> dict:
        incoming = f"s3://xh-test/incoming-{uuid.uuid4().hex[:6]}"
        _write_questions(f"{incoming}/q.jsonl", lines)
        overrides = _score_overrides(scoring_world, mlflow_server, name, incoming, output)
        return score.run(load_config(None, [*overrides, *extra]))

    first = run([json.dumps({"qid": f"a-{i}", "question": questions[i]["question"]}) for i in range(4)] + ["{bad"])
    second = run([json.dumps({"qid": f"b-{i}", "question": questions[10 + i]["question"]}) for i in range(3)])
    both = first["predictions"] + second["predictions"]
    assert first["predictions"] and second["predictions"]
    assert second["partition_rows"] == both == _partition_table(output, name, s3_endpoint).num_rows

    nothing = run(["{bad"])  # an input with nothing to score changes nothing
    assert nothing["predictions"] == 0 and nothing["partition_rows"] == both
    table = _partition_table(output, name, s3_endpoint)
    assert table.num_rows == both and {q[0] for q in table["qid"].to_pylist()} == {"a", "b"}

    # one qid scored again (with a question known to give a graph): its row replaced, the others kept
    scored = dict(zip(table["qid"].to_pylist(), table["question"].to_pylist()))
    a_qid, b_qid = min(q for q in scored if q.startswith("a-")), min(q for q in scored if q.startswith("b-"))
    again = run([json.dumps({"qid": a_qid, "question": scored[b_qid]})])
    assert again["predictions"] == 1 and again["replaced_rows"] == 1 and again["partition_rows"] == both
    rows = {r["qid"]: r["question"] for r in _partition_table(output, name, s3_endpoint).to_pylist()}
    assert rows == scored | {a_qid: scored[b_qid]}

    # every run's quarantined records are kept beside its inputs' folder
    quarantine = f"{output}/quarantine/run_date=2026-11-23/model={name}/version=1"[len("s3://") :]
    bad = pads.dataset(quarantine, filesystem=s3_endpoint.pyarrow_fs(), format="parquet").to_table()
    assert bad.num_rows == 2 and set(bad["raw"].to_pylist()) == {"{bad"}

    replaced = run([json.dumps({"qid": "c-0", "question": scored[b_qid]})], "score.replace=true")
    assert replaced["replaced_rows"] == both and replaced["partition_rows"] == 1
    assert _partition_table(output, name, s3_endpoint)["qid"].to_pylist() == ["c-0"]


def test_the_resume_fingerprint_of_an_s3_input_follows_its_content(s3_endpoint):
    from xh.storage.store import Store
    from xh.storage.tables import fingerprint

    uri = f"s3://xh-test/incoming-{uuid.uuid4().hex[:6]}/q.jsonl"
    files = [Store(s3=s3_endpoint).at(uri)]
    _write_questions(uri, ['{"qid": "1", "question": "Who wrote it?"}'])
    before = fingerprint({}, files)
    _write_questions(uri, ['{"qid": "1", "question": "Who drove it?"}'])  # the same size
    assert fingerprint({}, files) != before
    _write_questions(uri, ['{"qid": "1", "question": "Who wrote it?"}'])  # written again: a later time, same bytes
    assert fingerprint({}, files) == before
