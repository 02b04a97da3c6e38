"""`xh promote`'s decisions as a scheduler and a person read them, against the real MLflow server and the
session's Ray cluster: exit codes for promoted (0), kept (3) and refused (2); a dry run that evaluates and
logs but moves nothing; the per-question predictions of both models as a table on the decision run and each
version's metrics logged against its model and the eval set; a gate set the champion trained on refused;
and a promotion killed inside its locked step leaving a history that rollback reads right (#44, defect 8).

The versions are tiny untrained models (`test_score._register`) whose runs record a split as training
would; which model wins is fixed where the decision's logic is what is tested (`fixed`), with the models'
real predictions. Training, the gate and the actor pool are test_promote_heldout.py's.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import mlflow
import pytest

from tests.integration import test_score
from xh.config import load_config

ROOT = Path(__file__).resolve().parents[2]
SPLIT = {"dev_graphs": None, "dev_fraction": 0.25, "gate_fraction": 0.1, "question_types": None}

pytestmark = pytest.mark.integration


def _version(name: str, backbone: str, graphs: str, tracking: str, seed: int, **split) -> str:
    """A tiny registered version (@challenger) whose run recorded `SPLIT | split` of `graphs`."""
    version = str(test_score._register(name, backbone, graphs, tracking, seed=seed))
    client = mlflow.MlflowClient()
    client.log_dict(client.get_model_version(name, version).run_id, {"graphs": graphs, **SPLIT, **split}, "split.json")
    return version


def fixed(f1: dict[str, float]):
    """`xh.stages.promote.on_ray`'s stand-in: the versions' real predictions and metrics in this process,
    with `f1` fixed by version (which model wins is the test's to say)."""
    from xh.registry.evaluation import evaluate_version

    def on_ray(tracking_uri, *args, **kwargs):
        def evaluate(name, version, rows, task, missed=()):
            return evaluate_version(name, version, rows, task, missed) | {"f1": f1[str(version)]}

        return evaluate

    return on_ray


@pytest.fixture
def cli(capsys):
    """`xh promote ARGS` in this process: (exit code, stderr, the decision or None)."""
    from tests.cli import xh

    def run(*args: str) -> tuple[int, str, dict | None]:
        capsys.readouterr()  # what the test printed before (MLflow's run links while registering) is not ours
        try:
            xh("promote", *args)
            code = 0
        except SystemExit as e:
            code = e.code
        out, err = capsys.readouterr()
        lines = out.strip().splitlines()
        return code, err, json.loads(lines[-1]) if lines else None

    return run


def _sets(mlflow_server: str, root, name: str, *extra: str) -> list[str]:
    overrides = [
        f"storage.root={root}",
        f"mlflow.tracking_uri={mlflow_server}",
        "mlflow.experiment=promotion-decisions",
        f"promote.model={name}",
        *extra,
    ]
    return [arg for o in overrides for arg in ("--set", o)]


@pytest.fixture(scope="module")
def pair(world_graphs, tiny_backbone, ray_cluster, mlflow_server, s3_endpoint):
    """A registered model with v1 @champion and v2 @challenger, both recording the same split."""
    mlflow.set_tracking_uri(mlflow_server)
    name = f"xh-decide-{uuid.uuid4().hex[:6]}"
    _version(name, tiny_backbone, world_graphs, mlflow_server, seed=1)
    mlflow.MlflowClient().set_registered_model_alias(name, "champion", "1")
    _version(name, tiny_backbone, world_graphs, mlflow_server, seed=2)
    return name


def test_a_dry_run_evaluates_and_logs_both_models_per_question_and_moves_nothing(
    pair, world_graphs, mlflow_server, cli, monkeypatch, tmp_path
):
    from xh.registry.evaluation import version_predictions
    from xh.registry.versions import logged_model_id
    from xh.stages import promote
    from xh.train.split import held_set

    monkeypatch.setattr(promote, "on_ray", fixed({"1": 0.30, "2": 0.50}))
    client = mlflow.MlflowClient()
    code, err, decision = cli("--dry-run", *_sets(mlflow_server, tmp_path, pair))
    assert code == 0, err  # the exit code of the decision it would make
    assert decision["outcome"] == "would promote" and decision["would_promote"] and not decision["promoted"]
    assert client.get_model_version_by_alias(pair, "champion").version == "1"  # nothing moved ...
    assert "promotion_decision" not in client.get_model_version(pair, "2").tags  # ... nor written
    assert "champion_history" not in client.get_registered_model(pair).tags

    run = client.get_run(decision["decision_run_id"])
    assert run.data.tags["outcome"] == "would promote" and run.data.tags["dry_run"] == "true"
    rows, _ = held_set({"graphs": world_graphs, **SPLIT}, "gate")
    mlflow.set_experiment(experiment_id=run.info.experiment_id)  # load_table reads the current experiment's runs
    table = mlflow.load_table(promote.TABLE, run_ids=[run.info.run_id])
    assert len(table) == 2 * len(rows) > 0
    for version, role in (("1", "champion"), ("2", "challenger")):
        mine = table[table["version"].astype(str) == version]  # read_json makes "1" a number
        assert set(mine["role"]) == {role} and list(mine["qid"]) == [r["qid"] for r in rows]
        assert list(mine["gold"]) == [r["answer"] for r in rows]
        assert list(mine["prediction"]) == [p["answer"] for p in version_predictions(pair, version, rows)]

    [evaluation] = run.inputs.dataset_inputs
    for version, f1 in (("1", 0.30), ("2", 0.50)):  # each version's metrics on its model, with the eval set
        model_id = logged_model_id(client.get_model_version(pair, version))
        logged = [m for m in mlflow.get_logged_model(model_id).metrics if m.run_id == run.info.run_id]
        by_key = {m.key: m for m in logged}
        assert by_key["eval_f1"].value == f1 and {"eval_em", "eval_joint_f1"} <= set(by_key)
        assert by_key["eval_f1"].dataset_name == "eval-set" == evaluation.dataset.name
        assert by_key["eval_f1"].dataset_digest == evaluation.dataset.digest


def test_exit_codes_promoted_kept_and_refused_each_in_one_line(
    pair, world_graphs, tiny_backbone, mlflow_server, cli, monkeypatch, tmp_path
):
    from xh.stages import promote

    monkeypatch.setattr(promote, "on_ray", fixed({"1": 0.30, "2": 0.50, "3": 0.90}))
    client = mlflow.MlflowClient()
    client.set_registered_model_alias(pair, "champion", "1")

    code, err, decision = cli("--min-delta", "50", *_sets(mlflow_server, tmp_path, pair))
    assert code == promote.EXIT_KEPT == 3, err
    assert decision["outcome"] == "kept" and "needs +50.0" in decision["reason"]
    assert client.get_model_version_by_alias(pair, "champion").version == "1"

    code, err, decision = cli(*_sets(mlflow_server, tmp_path, pair))
    assert code == 0 and decision["outcome"] == "promoted", err
    assert client.get_model_version_by_alias(pair, "champion").version == "2"
    assert json.loads(client.get_registered_model(pair).tags["champion_history"]) == ["1"]

    for args, says in (
        (("--challenger", "99"), f"no version 99 of registered model '{pair}'"),
        (("--model", f"nope-{uuid.uuid4().hex[:6]}"), "promote.model: no registered model"),
        (("--eval-set", str(tmp_path / "missing")), "evaluation set"),
    ):
        code, err, decision = cli(*_sets(mlflow_server, tmp_path, pair), *args)
        assert code == 2 and decision is None and err.count("\n") == 1 and says in err, (args, err)

    # a challenger whose training held out no gate set, and no eval set named: refused, nothing moved
    _version(pair, tiny_backbone, world_graphs, mlflow_server, seed=3, gate_fraction=0.0)
    code, err, decision = cli(*_sets(mlflow_server, tmp_path, pair))
    assert code == 2 and err.count("\n") == 1 and f"{pair} version 3 has no gate set" in err, err
    assert client.get_model_version_by_alias(pair, "champion").version == "2"


def test_a_gate_set_the_champion_trained_on_is_refused(world_graphs, tiny_backbone, mlflow_server, cli, tmp_path):
    from xh.train.split import held_set

    mlflow.set_tracking_uri(mlflow_server)
    name = f"xh-overlap-{uuid.uuid4().hex[:6]}"
    _version(name, tiny_backbone, world_graphs, mlflow_server, seed=1, gate_fraction=0.0)  # trained on our gate
    mlflow.MlflowClient().set_registered_model_alias(name, "champion", "1")
    _version(name, tiny_backbone, world_graphs, mlflow_server, seed=2)
    gate, _ = held_set({"graphs": world_graphs, **SPLIT}, "gate")
    code, err, _ = cli(*_sets(mlflow_server, tmp_path, name))
    assert code == 2 and err.count("\n") == 1, err
    assert (
        f"the gate set shares {len(gate)} of its {len(gate)} questions with the training set of {name} version 1 (the champion)"
        in err
    )


# A promotion of v3 killed (SIGKILL) at its alias move, after its history write, inside the registry lock.
KILLED = """
import os, signal, sys
import mlflow
from xh.registry.champion import champion_history, promote, rollback
from xh.registry import lock

uri, name = sys.argv[1:3]
lock.LEASE_TTL_S = 3.0  # the dead holder's lock expires soon
mlflow.set_tracking_uri(uri)
mlflow.MlflowClient.set_registered_model_alias = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)
f1 = {"1": 0.3, "2": 0.5, "3": 0.9}
promote(name, [], metric="f1", challenger_version="3", evaluate=lambda model, v, *a: {"f1": f1[v]})
"""


def _kill_promoting_v3(mlflow_server: str, name: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")} | {"PYTHONPATH": str(ROOT)}
    killed = subprocess.run([sys.executable, "-c", KILLED, mlflow_server, name], env=env, timeout=300)
    assert killed.returncode == -signal.SIGKILL


def test_a_promotion_killed_inside_its_locked_step_leaves_a_history_that_rollback_reads_right(
    tiny_backbone, mlflow_server, s3_endpoint, tmp_path
):
    """Killed between its history write and its alias move: the history's last entry is still the champion.
    Neither a later promotion nor a rollback may step to that version again."""
    from xh.registry.champion import champion_history, promote, rollback

    mlflow.set_tracking_uri(mlflow_server)
    client = mlflow.MlflowClient()
    name = f"xh-killed-{uuid.uuid4().hex[:6]}"
    f1 = {"1": 0.3, "2": 0.5, "3": 0.9}
    fixed_f1 = lambda model, version, *a: {"f1": f1[version]}  # noqa: E731
    history = lambda: json.loads(client.get_registered_model(name).tags["champion_history"])  # noqa: E731
    from tests.unit.train.test_train_split import _graphs

    graphs = _graphs(tmp_path / "graphs", {"q1": "bridge"})  # what the versions record; no Ray needed here
    for seed in (1, 2, 3):
        test_score._register(name, tiny_backbone, graphs, mlflow_server, seed=seed)
    for version in ("1", "2"):
        assert promote(name, [], metric="f1", challenger_version=version, evaluate=fixed_f1)["promoted"]
    _kill_promoting_v3(mlflow_server, name)
    assert client.get_model_version_by_alias(name, "champion").version == "2" and history() == ["1", "2"]
    assert champion_history(client, name, "2") == ["1"]

    again = promote(name, [], metric="f1", challenger_version="3", evaluate=fixed_f1)  # waits out the lock
    assert again["promoted"] and again["champion"] == "2" and history() == ["1", "2"]  # v2 once, not twice
    assert rollback(name) == {"model": name, "champion": "2", "rolled_back_from": "3"}
    assert rollback(name) == {"model": name, "champion": "1", "rolled_back_from": "2"}

    # killed again, promoting v3 over v1: the history names v1, still champion; nothing to roll back to
    _kill_promoting_v3(mlflow_server, name)
    assert client.get_model_version_by_alias(name, "champion").version == "1" and history() == ["1"]
    with pytest.raises(ValueError, match="no previous champion"):
        rollback(name)
    assert client.get_model_version_by_alias(name, "champion").version == "1"


def test_the_config_promotes_on_the_gate_by_default():
    cfg = load_config(None, [])
    assert cfg.promote.eval_set is None and not cfg.promote.dry_run and cfg.train.gate_fraction > 0
