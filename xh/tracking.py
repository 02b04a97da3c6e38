"""MLflow tracking shared by every stage: where runs go, what each run records about itself.

    with stage_run(cfg, "synth") as run:      # params = flatten(cfg, "synth"), tags = stage, git sha, versions
        mlflow.log_metric("docs", 2000)

The embedded default is a SQLite store under `runs/mlflow/` (MLflow 3 has no file store); a
deployment points `mlflow.tracking_uri` at an `mlflow server`.
"""

from __future__ import annotations

import os
import platform
import subprocess
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from xh.config import MlflowConfig, XHConfig, flatten
from xh.storage import S3Settings, is_s3


def _artifact_uri(location: str) -> str:
    return location if is_s3(location) or "://" in location else Path(location).resolve().as_uri()


def configure(cfg: MlflowConfig, s3: S3Settings | None = None) -> str:
    """Point MLflow at the tracking store and experiment of `cfg`; return the experiment id."""
    import mlflow

    if cfg.tracking_uri.startswith("sqlite:///"):
        Path(cfg.tracking_uri[len("sqlite:///") :]).parent.mkdir(parents=True, exist_ok=True)
    # MLflow's S3 artifact client reads its endpoint from the environment.
    os.environ.update((s3 or S3Settings.from_env()).env())
    mlflow.set_tracking_uri(cfg.tracking_uri)
    experiment = mlflow.get_experiment_by_name(cfg.experiment)
    if experiment is not None:
        return experiment.experiment_id
    location = _artifact_uri(cfg.artifact_location) if cfg.artifact_location else None
    return mlflow.create_experiment(cfg.experiment, artifact_location=location)


def absolute_tracking(cfg: XHConfig) -> XHConfig:
    """SQLite and local artifact paths made absolute: Ray workers run in another working directory."""
    m = cfg.mlflow
    uri = m.tracking_uri
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        uri = "sqlite:///" + str(Path(uri[len("sqlite:///") :]).resolve())
    location = m.artifact_location
    if location and "://" not in location:
        location = str(Path(location).resolve())
    return cfg.model_copy(update={"mlflow": m.model_copy(update={"tracking_uri": uri, "artifact_location": location})})


def flatten_numbers(tree: dict, prefix: str = "") -> dict[str, float]:
    """The numbers of a nested summary as dotted MLflow metric names (`retrieve.eval.all.supp_recall@2`)."""
    out: dict[str, float] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}".replace("@", "_at_")
        if isinstance(value, dict):
            out.update(flatten_numbers(value, name + "."))
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out[name] = value
    return out


def environment_tags() -> dict[str, str]:
    """Versions and the git sha, so a run says what produced it."""
    import mlflow
    import pyarrow
    import ray

    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, cwd=Path(__file__).parent
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        sha = ""
    return {
        "git_sha": sha or "unknown",
        "python": platform.python_version(),
        "ray": ray.__version__,
        "mlflow": mlflow.__version__,
        "pyarrow": pyarrow.__version__,
    }


@contextmanager
def stage_run(cfg: XHConfig, stage: str, run_name: str | None = None, s3: S3Settings | None = None) -> Iterator:
    """An MLflow run for one stage, with the stage's config as flattened params."""
    import mlflow

    experiment_id = configure(cfg.mlflow, s3)
    # Inside another stage's run (the demo's), a stage's run is its child.
    nested = mlflow.active_run() is not None
    with mlflow.start_run(experiment_id=experiment_id, run_name=run_name or stage, nested=nested) as run:
        mlflow.set_tags({"stage": stage, **environment_tags()})
        mlflow.log_params(flatten(cfg, stage))
        yield run
