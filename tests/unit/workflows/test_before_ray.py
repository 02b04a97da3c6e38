"""Bad settings are refused in one line with exit code 2 before Ray starts: impossible dates, URI schemes a
setting cannot use, s3:// without an endpoint, a choice not among a flag's values; the demo's config is
every stage's config (what the demo trains first is its own section, `demo`)."""

from __future__ import annotations

import bz2
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from workflows.cli import check_before_ray
from xh.config import STAGES, ConfigError, load_config
from xh.stages import wiki
from xh.storage.store import Store
from xh.storage.uris import StorageSettingsError

ROOT = Path(__file__).resolve().parents[3]
# what would give the stages an S3 endpoint, AWS or a tracking store other than the one a case sets
_ENV_DROPPED = ("AWS_", "XH_S3_", "MLFLOW_", "RAY_ADDRESS")


@pytest.fixture
def ray_tmp():
    folder = tempfile.mkdtemp(prefix="xhray", dir="/tmp")  # short: Ray's socket paths have a length limit
    yield Path(folder)
    shutil.rmtree(folder, ignore_errors=True)


def _stage(stage: str, *args: str, cwd: Path, ray_tmp: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(_ENV_DROPPED)}
    env.update(RAY_TMPDIR=str(ray_tmp), HOME=str(cwd))  # HOME: no ~/.aws of the machine's user
    return subprocess.run(
        [sys.executable, "-m", "workflows.cli", stage, *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=300,
    )


def _wiki_tables(root: Path) -> None:
    dump = root / "dump"
    dump.mkdir(parents=True)
    line = json.dumps({"id": "1", "title": "Alpha", "text": ["Alpha is a page."], "text_with_links": ["Alpha."]})
    (dump / "wiki_00.bz2").write_bytes(bz2.compress(line.encode()))
    wiki.write_tables(
        Store().at(str(root / "tables")), [Store().at(str(dump / "wiki_00.bz2"))], "hotpot", partitions=1, local=True
    )


@pytest.mark.parametrize(
    "stage, args, message",
    [
        ("score", ["--set", "score.run_date=2026-02-30"], "error: config key 'score.run_date'"),
        (
            "wiki",
            ["process", "--set", "storage.root=http://example.invalid/xh"],
            "error: config key 'storage.root': unsupported",
        ),
        (
            "graphs",
            ["build", "--set", "mlflow.tracking_uri=bogus://x"],
            "error: config key 'mlflow.tracking_uri': unsupported",
        ),
        (
            "wiki",
            ["process", "--set", "wiki.inputs=[gs://bucket/dump]"],
            "error: config key 'wiki.inputs': unsupported",
        ),
        (  # the demo's config is any stage's: refused for what is missing, not for a setting only the demo reads
            "retrieve",
            ["run", "--config", str(ROOT / "configs" / "demo.yaml"), "--questions", "{questions}"],
            "error: no BM25 index at",
        ),
        ("graphs", ["build", "--task", "hotpt"], "error: Invalid value for '--task' / '-t': "),
        (
            "retrieve",
            ["all", "--set", "retrieve.index=s3://bucket/index"],
            "error: s3://bucket/index: no S3 endpoint configured",
        ),
    ],
)
def test_bad_settings_exit_2_in_one_line_before_ray_starts(stage, args, message, tmp_path, ray_tmp):
    _wiki_tables(tmp_path / "world")  # complete inputs, so that only the bad setting can stop the stage
    questions = tmp_path / "questions.jsonl"
    questions.write_text(json.dumps({"qid": "q1", "question": "Who wrote Alpha?"}) + "\n")
    args = [a.format(questions=questions) for a in args]
    command = args[:1] if not args[0].startswith("-") else []  # a sub-command comes first
    root = ["--set", f"storage.root={tmp_path / 'world'}"]
    result = _stage(stage, *command, *root, *args[len(command) :], cwd=tmp_path, ray_tmp=ray_tmp)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(message), result.stderr
    assert not list(ray_tmp.iterdir()), "Ray was started"


def test_an_impossible_date_in_a_config_file_is_one_line(tmp_path):
    config = tmp_path / "bad.yaml"
    config.write_text("score:\n  run_date: 2026-02-30\n")
    with pytest.raises(ConfigError) as error:
        load_config(config)
    assert "\n" not in str(error.value) and str(error.value).startswith(f"config file {config}")
    assert load_config(None, ["score.run_date=2026-02-28"]).score.run_date.isoformat() == "2026-02-28"


def test_schemes_each_setting_may_use_pass():
    cfg = load_config(
        None,
        [
            "storage.root=s3://bucket/xh",
            "mlflow.tracking_uri=postgresql+psycopg2://db.example/mlflow",
            "mlflow.artifact_location=mlflow-artifacts://host/a",
            "storage.s3_endpoint_url=http://127.0.0.1:9000",
            "ray.address=ray://head:10001",
            "wiki.inputs=[file:///data/dump, s3://b/dump, local/dump]",
        ],
    )
    assert cfg.storage.root == "s3://bucket/xh"


def test_s3_locations_need_an_endpoint_only_in_the_sections_a_stage_reads(tmp_path, monkeypatch):
    for name in list(os.environ):
        if name.startswith(_ENV_DROPPED):
            monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path))
    cfg = load_config(None, ["train.storage_path=s3://bucket/checkpoints"])
    with pytest.raises(StorageSettingsError, match=r"^s3://bucket/checkpoints: no S3 endpoint configured"):
        check_before_ray(cfg, "train")
    with pytest.raises(StorageSettingsError):
        check_before_ray(cfg, "demo")  # the demo runs every stage
    check_before_ray(cfg, "wiki")  # wiki never reads train.storage_path
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    check_before_ray(cfg, "train")


def test_the_demo_config_is_every_stages_and_what_the_demo_trains_is_its_own_section():
    cfg = load_config(ROOT / "configs" / "demo.yaml")
    for stage in STAGES:
        check_before_ray(cfg, stage)
    assert cfg.retrieve.path_scorer is None and cfg.retrieve.reranker is None
    assert (cfg.demo.train_path_scorer, cfg.demo.train_reranker, cfg.demo.train_sentence_reranker) == (
        True,
        False,
        False,
    )
    fever = load_config(ROOT / "configs" / "demo-fever.yaml")
    assert fever.graphs.sentence_reranker is None and not fever.demo.train_sentence_reranker
    with pytest.raises(ConfigError, match=r"^config key 'demo.train_reranker': input should be a valid boolean"):
        load_config(None, ["demo.train_reranker=auto"])


def test_a_ray_job_never_puts_an_experiments_artifacts_in_its_temporary_copy_of_the_code(tmp_path, monkeypatch):
    """#44 (6): a relative `mlflow.artifact_location` (the default) in a submitted job: a tracking server's own
    artifact root, or, without a server, one line and exit 2 before Ray; outside a job, the working directory."""
    from tests.cli import xh
    from xh.tracking import absolute_tracking, artifact_root

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    served = load_config(None, ["mlflow.tracking_uri=http://mlflow:5000"]).mlflow
    assert artifact_root(served) == (tmp_path / "runs" / "mlflow" / "artifacts").as_uri()
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", "{}")  # what Ray sets in a job's driver
    assert artifact_root(served) is None
    whole = load_config(None, ["mlflow.tracking_uri=http://mlflow:5000"])
    assert absolute_tracking(whole).mlflow.artifact_location is None  # what train, score and promote hand on
    kept = {"s3://b/a": "s3://b/a", "mlflow-artifacts:/xh": "mlflow-artifacts:/xh"}
    kept[str(tmp_path / "a")] = (tmp_path / "a").as_uri()
    for given, expected in kept.items():
        assert artifact_root(served.model_copy(update={"artifact_location": given})) == expected
    local = served.model_copy(update={"tracking_uri": f"sqlite:///{tmp_path}/mlflow.db"})
    with pytest.raises(
        ConfigError, match=r"^mlflow.artifact_location runs/mlflow/artifacts is relative, and a Ray job"
    ):
        artifact_root(local)
    with pytest.raises(SystemExit) as exited:  # the first stage step that opens the tracking store refuses
        xh("promote", "rollback", "--set", f"mlflow.tracking_uri=sqlite:///{tmp_path}/mlflow.db")
    assert exited.value.code == 2 and not (tmp_path / "mlflow.db").exists()
    check_before_ray(load_config(None, []), "synth")  # synth never opens it: its job runs with the defaults


def _table(folder: Path, kind: str) -> None:
    """A complete, empty table of `kind` at `folder`."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from xh import schemas
    from xh.storage.store import located
    from xh.storage.tables import staged

    with staged(located(str(folder)), kind=kind) as stage:
        Path(stage.uri).mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pylist([], schema=schemas.GRAPHS), f"{stage.uri}/part-00000.parquet")
        stage.rows = 0


@pytest.mark.parametrize(
    "args, kind, message",
    [
        (["retrieve", "index", "--set", "retrieve.tables={table}"], "graphs", "holds the graphs, not the wiki tables"),
        (["promote", "--eval-set", "{table}"], "bm25 index", "holds the bm25 index, not the graphs"),
    ],
)
def test_a_table_of_another_kind_is_refused_in_one_line_before_ray(args, kind, message, tmp_path, ray_tmp):
    """#44 (15): a graphs table where the wiki tables belong, the BM25 index as the evaluation set."""
    table = tmp_path / "some-table"
    _table(table, kind)
    args = [a.format(table=table) for a in args]
    result = _stage(*args, "--set", f"mlflow.tracking_uri=sqlite:///{tmp_path}/m.db", cwd=tmp_path, ray_tmp=ray_tmp)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and str(table) in lines[0], result.stderr
    assert not list(ray_tmp.iterdir()), "Ray was started"
