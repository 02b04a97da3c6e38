"""The demo's console: without -v, Ray keeps the workers' output (Train, Serve replicas, Ray Data actors)
in its session files and MLflow draws no download bars; with -v all of it comes back. What `ray.init`
is handed is checked here (a real run of the demo takes minutes: its line count is in docs/results.md)."""

import logging
import os

import pytest

from workflows import common
from xh.config import load_config

pytestmark = pytest.mark.unit


@pytest.fixture
def ray_init(monkeypatch):
    import ray

    calls = []
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kwargs: calls.append(kwargs))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    for name in ("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "HF_HUB_DISABLE_PROGRESS_BARS"):
        monkeypatch.setenv(name, "")  # what init_ray sets, restored after the test
    import ray.data

    context = ray.data.DataContext.get_current()
    levels = {name: logging.getLogger(name).level for name in ("ray.data", "ray.serve")}
    bars = context.enable_progress_bars
    yield calls
    context.enable_progress_bars = bars
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)


@pytest.fixture
def xh_level():
    logger = logging.getLogger("xh")
    before = logger.level
    yield logger.setLevel
    logger.setLevel(before)


def test_the_demo_keeps_worker_output_and_download_bars_off_the_console(ray_init, xh_level):
    import ray.data

    xh_level(logging.INFO)
    common.init_ray(load_config(None), worker_output=False)
    [kwargs] = ray_init
    assert kwargs["log_to_driver"] is False
    assert kwargs["runtime_env"]["env_vars"]["MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"] == "false"
    assert kwargs["runtime_env"]["env_vars"]["HF_HUB_DISABLE_PROGRESS_BARS"] == "1"  # "Loading weights"
    assert os.environ["MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"] == "false"  # the driver's own downloads
    assert ray.data.DataContext.get_current().enable_progress_bars is False
    assert not logging.getLogger("ray.serve").isEnabledFor(logging.WARNING)
    assert not logging.getLogger("ray.data").isEnabledFor(logging.WARNING)


def test_with_v_and_for_other_stages_the_workers_output_comes_back(ray_init, xh_level):
    xh_level(logging.DEBUG)  # -v
    common.init_ray(load_config(None), worker_output=False)
    xh_level(logging.INFO)
    common.init_ray(load_config(None))  # a stage other than the demo: its workers' progress lines
    verbose, stage = ray_init
    assert verbose["log_to_driver"] is True
    assert "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR" not in verbose["runtime_env"].get("env_vars", {})
    assert stage["log_to_driver"] is True


@pytest.mark.parametrize(("verbosity", "level"), [(0, logging.WARNING), (1, logging.INFO)])
def test_mlflow_imported_after_the_cli_set_its_logging_keeps_its_info_lines_for_v(verbosity, level):
    """MLflow sets its loggers' level when first imported ("Creating initial MLflow database tables", "Validating
    input example" are INFO): a fresh process, where the CLI's logging comes first and MLflow later."""
    import subprocess
    import sys

    code = (
        "import logging; from workflows.cli import configure_logging; "
        f"configure_logging({verbosity}); import mlflow; print(logging.getLogger('mlflow').level)"
    )
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_LOGGING_LEVEL"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert int(done.stdout.split()[-1]) == level
