"""Promotion on held-out data and dataset lineage, against the real services: one short training run (the
session's generated-world graphs, the two-node Ray cluster, the MLflow server) records its three-way split
(train, dev that picks the checkpoint, gate that picks nothing) and logs its train and dev graphs as inputs;
`xh promote` evaluates on the gate split by default, logs it as the decision's input, and refuses an eval
set that shares questions with the training set; a scoring run logs its input files and the predictions
partition. Exit codes, dry runs, the per-question table and a champion's own training set:
test_promotion_decisions.py."""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path

import mlflow
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest

from tests.integration import test_score
from xh.config import load_config

scoring_world = test_score.scoring_world  # the scoring tests' world (tables and BM25 index), as a fixture here


@pytest.fixture(scope="module")
def trained(world_graphs, tiny_backbone, ray_cluster, mlflow_server, s3_endpoint, tmp_path_factory):
    """A model trained for 2 steps with a quarter of the questions held out for dev and a tenth (the default)
    for the gate, registered as @challenger."""
    from workflows import train

    mlflow.set_tracking_uri(mlflow_server)
    name = f"xh-heldout-{uuid.uuid4().hex[:6]}"
    root = tmp_path_factory.mktemp("heldout")
    summary = train.run(
        load_config(
            None,
            [
                *test_score.tiny_training(root, ray_cluster, mlflow_server, "heldout-tests", tiny_backbone),
                f"train.graphs={world_graphs}",
                f"train.register_as={name}",
            ],
        )
    )
    return {"name": name, "summary": summary, "root": root}


def _inputs(run_id: str) -> dict[str, mlflow.entities.Dataset]:
    """A run's dataset inputs by their context tag."""
    found = {}
    for dataset_input in mlflow.MlflowClient().get_run(run_id).inputs.dataset_inputs:
        context = {t.key: t.value for t in dataset_input.tags}["mlflow.data.context"]
        found[context] = dataset_input.dataset
    return found


def split_parts(world_graphs: str) -> tuple[set[str], set[str], set[str]]:
    """(train, dev, gate) qids of the world's graphs as the trained run splits them (dev 0.25, gate 0.1)."""
    from xh.train.split import split_of

    qids = set(pads.dataset(world_graphs, format="parquet").to_table(columns=["qid"])["qid"].to_pylist())
    parts = {q: split_of(q, 0.25, 0.1) for q in qids}
    return tuple({q for q, p in parts.items() if p == part} for part in ("train", "dev", "gate"))


def _promote_overrides(trained: dict, mlflow_server: str, *extra: str) -> list[str]:
    return [
        f"storage.root={trained['root']}",  # holds no graphs: the old default folder does not exist there
        f"mlflow.tracking_uri={mlflow_server}",
        "mlflow.experiment=heldout-tests",
        f"promote.model={trained['name']}",
        "promote.floor=0.01",
        *extra,
    ]


def test_training_records_its_split_and_logs_its_train_and_dev_graphs_as_inputs(trained, world_graphs, mlflow_server):
    mlflow.set_tracking_uri(mlflow_server)
    summary = trained["summary"]
    inputs = _inputs(summary["mlflow_run_id"])
    assert set(inputs) == {"training", "validation"}
    train, dev = inputs["training"], inputs["validation"]
    for dataset in (train, dev):
        assert json.loads(dataset.source) == {"uri": world_graphs} and dataset.source_type == "local"
    assert json.loads(train.profile)["num_rows"] == summary["train_graphs"] > 0
    assert json.loads(dev.profile)["num_rows"] == summary["dev_graphs"] > 0
    assert json.loads(dev.profile)["dev_fraction"] == 0.25 and json.loads(dev.profile)["gate_fraction"] == 0.1
    assert train.digest and dev.digest and train.digest != dev.digest
    split = mlflow.artifacts.load_dict(f"runs:/{summary['mlflow_run_id']}/split.json")
    assert split == {
        "graphs": world_graphs,
        "dev_graphs": None,
        "dev_fraction": 0.25,
        "gate_fraction": 0.1,
        "question_types": None,
    }


def test_the_challenger_is_selected_on_dev_and_judged_on_the_gate_which_neither_trained_nor_selected_it(
    trained, world_graphs, mlflow_server, s3_endpoint
):
    from workflows import promote
    from xh.registry.evaluation import evaluate_version
    from xh.train.split import held_set, recorded_split

    mlflow.set_tracking_uri(mlflow_server)
    train, dev, gate = split_parts(world_graphs)
    assert train and dev and gate and not (train & dev or train & gate or dev & gate)
    summary = trained["summary"]
    # selection: the best checkpoint by the dev metric, on the dev questions alone; training on the rest
    assert summary["train_graphs"] == len(train) and summary["dev_graphs"] == len(dev)
    assert "dev_f1" in summary["metrics"]
    decision = promote.run(load_config(None, _promote_overrides(trained, mlflow_server)))
    assert decision["challenger"] == "1" and "(gate split by qid; dev 0.25, gate 0.1)" in decision["eval_set"]
    assert decision["eval_questions"] == len(gate)  # judged on the gate: no gate question lost
    assert decision["decision_run_id"] and "challenger_score" in decision
    assert decision["training_split"] == {"challenger": "checked"}
    rows, missed = held_set(recorded_split(summary["mlflow_run_id"]), "gate")
    assert {r["qid"] for r in rows} | set(missed) == gate
    in_process = evaluate_version(trained["name"], "1", rows, "hotpot", missed)  # what the actor pool scored
    assert decision["challenger_score"] == pytest.approx(100 * in_process["f1"])
    evaluation = _inputs(decision["decision_run_id"])["evaluation"]
    assert json.loads(evaluation.source) == {"uri": world_graphs}
    assert json.loads(evaluation.profile).items() >= {"split": "gate", "num_rows": len(gate), "missed": 0}.items()
    recorded = mlflow.MlflowClient().get_model_version(trained["name"], "1").tags["promotion_decision"]
    assert json.loads(recorded)["decision_run_id"] == decision["decision_run_id"]


def test_promotion_evaluates_on_a_ray_actor_pool_with_the_metrics_of_an_evaluation_in_process(
    trained, mlflow_server, ray_cluster, s3_endpoint
):
    from xh.registry.evaluation import evaluate_version
    from xh.stages.promote import on_ray
    from xh.train.split import dev_set, recorded_split

    mlflow.set_tracking_uri(mlflow_server)
    rows, missed = dev_set(recorded_split(trained["summary"]["mlflow_run_id"]))
    here = evaluate_version(trained["name"], "1", rows, "hotpot", missed)
    assert len(rows) >= 2 and set(here) >= {"f1", "em", "joint_f1", "predictions"}
    # two actors, each predicting one contiguous shard: the joined predictions keep the rows' order
    pooled = on_ray(mlflow_server, actors=2, cpus_per_actor=0.5)(trained["name"], "1", rows, "hotpot", missed)
    assert [p["qid"] for p in pooled.pop("predictions")] == [p["qid"] for p in here.pop("predictions")]
    assert pooled == pytest.approx(here)
    with pytest.raises(Exception, match="RESOURCE_DOES_NOT_EXIST|not found|does not exist"):  # the cause, raised here
        on_ray(mlflow_server, actors=1, cpus_per_actor=0.5)(trained["name"], "99", rows[:1], "hotpot")


def _held_out_folder(world_graphs: str, folder: Path, keep: set[str]) -> str:
    """A copy of the world's graphs folder (marker and summary included) with only the rows of `keep`."""
    shutil.copytree(world_graphs, folder)
    for part in folder.rglob("*.parquet"):
        table = pq.read_table(part)
        mask = [q in keep for q in table["qid"].to_pylist()]
        pq.write_table(table.filter(mask), part)
    return str(folder)


def test_an_eval_set_sharing_questions_with_the_training_set_is_refused_in_one_line_with_exit_2(
    trained, world_graphs, mlflow_server, s3_endpoint, tmp_path, capsys
):
    from tests.cli import xh
    from workflows import promote

    mlflow.set_tracking_uri(mlflow_server)
    training, dev, gate = split_parts(world_graphs)

    def cli(eval_set: str) -> tuple[int, str]:
        argv = [
            arg
            for o in _promote_overrides(trained, mlflow_server, f"promote.eval_set={eval_set}")
            for arg in ("--set", o)
        ]
        with pytest.raises(SystemExit) as exited:
            xh("promote", *argv)
        return exited.value.code, capsys.readouterr().err

    code, err = cli(world_graphs)  # the folder training read: every training question in it
    assert code == 2 and err.count("\n") == 1
    total = len(training) + len(dev) + len(gate)
    assert (
        f"shares {len(training)} of its {total} questions with the training set of {trained['name']} version 1" in err
    )

    one = _held_out_folder(world_graphs, tmp_path / "one-shared", dev | {min(training)})
    code, err = cli(one)
    assert code == 2 and f"shares 1 of its {len(dev) + 1} questions" in err

    held_out = _held_out_folder(world_graphs, tmp_path / "held-out", dev)
    decision = promote.run(
        load_config(None, _promote_overrides(trained, mlflow_server, f"promote.eval_set={held_out}"))
    )
    assert decision["eval_set"] == held_out and decision["eval_questions"] == len(dev)
    assert json.loads(_inputs(decision["decision_run_id"])["evaluation"].source) == {"uri": held_out}
    # the dev split trained nothing, but it picked the checkpoint: taken, and flagged
    assert decision["dev_overlap"] == len(dev)
    assert json.loads(_inputs(decision["decision_run_id"])["evaluation"].profile)["dev_overlap"] == len(dev)


def test_a_version_without_a_recorded_split_needs_a_named_eval_set(
    trained, world_graphs, tiny_backbone, mlflow_server, s3_endpoint
):
    """A version registered from code (or before training recorded its split): no default eval set, and a
    named one is taken as it is, its lineage saying that the overlap could not be checked."""
    from workflows import promote
    from xh.config import ConfigError

    mlflow.set_tracking_uri(mlflow_server)
    name = f"xh-unrecorded-{uuid.uuid4().hex[:6]}"
    test_score._register(name, tiny_backbone, world_graphs, mlflow_server, seed=1)
    overrides = {**trained, "name": name}
    with pytest.raises(ConfigError, match=f"{name} version 1 has no gate set .* recorded no split"):
        promote.run(load_config(None, _promote_overrides(overrides, mlflow_server)))
    named = _promote_overrides(overrides, mlflow_server, f"promote.eval_set={world_graphs}")
    decision = promote.run(load_config(None, named))
    assert decision["eval_set"] == world_graphs and "challenger_score" in decision
    profile = json.loads(_inputs(decision["decision_run_id"])["evaluation"].profile)
    assert profile["training_split"] == {"challenger": "not recorded"}


def test_a_scoring_run_logs_its_input_files_and_the_predictions_partition(
    trained, scoring_world, mlflow_server, s3_endpoint
):
    from workflows import score

    mlflow.set_tracking_uri(mlflow_server)
    name = trained["name"]
    mlflow.MlflowClient().set_registered_model_alias(name, "champion", "1")
    incoming = f"s3://xh-test/incoming-{uuid.uuid4().hex[:6]}"
    questions = scoring_world["questions"]
    test_score._write_questions(
        f"{incoming}/a.jsonl", [json.dumps({"qid": q["_id"], "question": q["question"]}) for q in questions[:3]]
    )
    test_score._write_questions(
        f"{incoming}/b.jsonl", [json.dumps({"qid": q["_id"], "question": q["question"]}) for q in questions[3:5]]
    )
    output = f"s3://xh-test/predictions-{uuid.uuid4().hex[:6]}"
    summary = score.run(
        load_config(None, test_score._score_overrides(scoring_world, mlflow_server, name, incoming, output))
    )

    logged = mlflow.MlflowClient().get_run(summary["mlflow_run_id"]).inputs.dataset_inputs
    by_context: dict[str, list] = {}
    for dataset_input in logged:
        context = {t.key: t.value for t in dataset_input.tags}["mlflow.data.context"]
        by_context.setdefault(context, []).append(dataset_input.dataset)
    sources = sorted(json.loads(d.source)["uri"] for d in by_context["scoring"])
    assert sources == [f"{incoming}/a.jsonl", f"{incoming}/b.jsonl"]
    assert all(json.loads(d.profile)["content_digest"].startswith("etag:") for d in by_context["scoring"])
    [partition] = by_context["predictions"]
    assert json.loads(partition.source) == {"uri": summary["output"]} and partition.source_type == "s3"
    assert json.loads(partition.profile)["num_rows"] == summary["partition_rows"] == summary["predictions"] > 0
