"""Where runs go: `--set` over MLFLOW_TRACKING_URI over the config file over the default; no credential
from a tracking URI in what MLflow is given or what a run logs (the server-side checks: tests/integration/
test_tracking_credentials.py)."""

from __future__ import annotations

import os

import pytest

from xh.config import ConfigError, load_config
from xh.tracking import configure, redact, tracking_uri_without_credentials

pytestmark = pytest.mark.unit


def test_the_environment_names_the_tracking_store_over_the_file_and_set_wins_over_both(tmp_path, monkeypatch):
    config = tmp_path / "c.yaml"
    config.write_text("mlflow:\n  tracking_uri: sqlite:///runs/mlflow/mlflow.db\n  experiment: from-file\n")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert load_config(config).mlflow.tracking_uri == "sqlite:///runs/mlflow/mlflow.db"

    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://tracking.example:5000")
    from_env = load_config(config)
    assert from_env.mlflow.tracking_uri == "http://tracking.example:5000"
    assert from_env.mlflow.experiment == "from-file"  # only the URI comes from the environment
    assert load_config(None).mlflow.tracking_uri == "http://tracking.example:5000"
    explicit = load_config(config, ["mlflow.tracking_uri=http://other.example:5000"])
    assert explicit.mlflow.tracking_uri == "http://other.example:5000"


def test_configure_leaves_the_environment_as_the_user_set_it(tmp_path, monkeypatch):
    """MLflow exports the URI it is given; a later `load_config` in this process must not read it back as
    the user's choice."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    configure(
        load_config(None, [f"mlflow.tracking_uri=sqlite:///{tmp_path}/a.db", "mlflow.artifact_location=null"]).mlflow
    )
    assert "MLFLOW_TRACKING_URI" not in os.environ
    assert load_config(None).mlflow.tracking_uri == "sqlite:///runs/mlflow/mlflow.db"


def test_a_relative_sqlite_store_is_refused_in_a_ray_job(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", "{}")
    with pytest.raises(ConfigError, match="temporary copy of the code") as refused:
        configure(load_config(None, ["mlflow.tracking_uri=sqlite:///runs/mlflow/mlflow.db"]).mlflow)
    assert "\n" not in str(refused.value)
    assert not (tmp_path / "runs").exists()


def test_redact_hides_user_info_and_secret_query_parameters_only():
    assert redact("http://alice:s3cret@mlflow.example:5000/x") == "http://***@mlflow.example:5000/x"
    assert redact("postgresql://u:p@db:5432/mlflow") == "postgresql://***@db:5432/mlflow"
    assert redact("https://h/x?X-Amz-Signature=abc&region=eu") == "https://h/x?X-Amz-Signature=***&region=eu"
    assert redact("https://h/x?access_token=abc") == "https://h/x?access_token=***"
    for plain in ("s3://bucket/prefix", "sqlite:////tmp/m.db", "alice@example.com", 3, None):
        assert redact(plain) == plain


def test_credentials_are_taken_out_of_the_tracking_uri():
    assert tracking_uri_without_credentials("http://alice:p%40ss@h:5000/api") == ("http://h:5000/api", "alice", "p@ss")
    assert tracking_uri_without_credentials("https://tok@h") == ("https://h", "tok", None)
    assert tracking_uri_without_credentials("http://h:5000") == ("http://h:5000", None, None)
