"""Registering a trained model: its folder and `pipeline/` record logged as a pyfunc of data only, a version with
the training's alias and tags."""

from __future__ import annotations

import json
import os
from pathlib import Path

import mlflow
import yaml

from xh.config import XHConfig
from xh.registry.pyfunc import LOADER_MODULE, input_example, pyfunc_signature
from xh.storage.store import Location, Store

PIPELINE_DIR = "pipeline"  # inside the version's data folder: what `pipeline_of` reads


# What the loader (`xh.pyfunc_entry`) and the pipeline it builds import, beside the project itself: pinned too,
# so that a rebuilt environment holds the versions the model was trained and checked with.
LOADER_PACKAGES = (
    "torch",
    "transformers",
    "safetensors",
    "tokenizers",
    "numpy",
    "pandas",
    "pyarrow",
    "scipy",
    "PyStemmer",
    "pydantic",
    "PyYAML",
    "mlflow",
)


def project_distribution() -> str:
    """The installed distribution that holds the `xh` package (the loader module's)."""
    from importlib.metadata import packages_distributions

    return packages_distributions()["xh"][0]


def pip_requirements() -> list[str]:
    """The packages a served model needs, pinned to the installed *public* versions: the project's own
    distribution (it holds the loader module; a version carries no code) and every package the loader imports.

    A local version label (`2.13.0+cpu`, `2.11.0+cu130`) names a build only one index has: `mlflow models
    serve` or a rebuilt virtualenv could not resolve it, so the pin keeps the public part (`==2.13.0` still
    matches a `2.13.0+cpu` wheel).
    """
    from importlib.metadata import version

    from packaging.version import Version

    names = [project_distribution(), *LOADER_PACKAGES]
    return [f"{n}=={Version(version(n)).public}" for n in names]


def data_snapshot(graphs: Location) -> str:
    """What the model was trained on: the graphs folder and its files' total size (cheap, changes with the data)."""
    from xh.storage.uris import list_paths

    fs, path = graphs.fs_path()
    infos = fs.get_file_info([p for p in list_paths(fs, path) if p.endswith(".parquet")])
    return f"{graphs} ({len(infos)} files, {sum(i.size or 0 for i in infos)} bytes)"


def model_flavour(model) -> dict[str, str]:
    """Which architecture (and XH hop variant) a model is: the logged model's metadata and version tags."""
    from xh.model.variants import architecture_of

    flavour = {"architecture": architecture_of(model)}
    if flavour["architecture"] == "xh":
        flavour["hop_variant"] = model.cfg.hop_variant
    return flavour


def log_and_register(model_dir: str, *, run_id: str, cfg: XHConfig, metrics: dict, graphs_uri: str | Location) -> dict:
    """Log the model folder as a pyfunc into the training run, register a version, give it the alias.

    The version's data is the model folder plus `pipeline/` (`with_pipeline`): the retrieval and graph
    settings, trained models and index reference that turn a question into the graphs it trained on.
    `graphs_uri`: the graphs it trained on, a Location (a URI: of the config's store)."""
    import tempfile

    from xh.inference import load_model
    from xh.tracking import configure, environment_tags

    graphs = graphs_uri if isinstance(graphs_uri, Location) else Store.from_config(cfg).at(graphs_uri)
    configure(cfg.mlflow, graphs.store)
    staging = tempfile.TemporaryDirectory(prefix="xh-version-")
    model_dir = with_pipeline(model_dir, staging.name, cfg, graphs)
    model, _ = load_model(model_dir)
    name = cfg.train.register_as
    # start_run(run_id) refuses a run of another experiment than the process's active one
    mlflow.set_experiment(experiment_id=mlflow.MlflowClient().get_run(run_id).info.experiment_id)
    # While log_model checks the input example, MLflow patches os.environ process-wide and then iterates the
    # names it saw without a lock: another thread reading the environment meanwhile fails the log ("Set
    # changed size during iteration", seen in CI). The names are only a hint for Databricks serving.
    os.environ.setdefault("MLFLOW_RECORD_ENV_VARS_IN_MODEL_LOGGING", "false")
    with mlflow.start_run(run_id=run_id, nested=mlflow.active_run() is not None):
        info = mlflow.pyfunc.log_model(
            name="model",
            loader_module=LOADER_MODULE,
            data_path=model_dir,
            signature=pyfunc_signature(),
            input_example=input_example(),
            pip_requirements=pip_requirements(),
            metadata=model_flavour(model),
        )
        version = mlflow.register_model(info.model_uri, name).version
    client = mlflow.MlflowClient()
    client.set_registered_model_alias(name, cfg.train.alias, version)
    tags = {
        "git_sha": environment_tags()["git_sha"],
        "data_snapshot": data_snapshot(graphs),
        "task": cfg.model.task,
        **model_flavour(model),
        **{k: f"{v:.6g}" for k, v in metrics.items() if isinstance(v, (int, float))},
    }
    for key, value in tags.items():
        client.set_model_version_tag(name, version, key, value)
    staging.cleanup()
    return {
        "name": name,
        "version": int(version),
        "alias": cfg.train.alias,
        "model_uri": f"models:/{name}@{cfg.train.alias}",
    }


def with_pipeline(model_dir: str, staging: str, cfg: XHConfig, graphs: Location) -> str:
    """`staging`/model: a copy of `model_dir` with `pipeline/pipeline.json` (`xh.pipeline_record.pipeline_record`)
    and a copy of each small trained model it names (the path scorer). Inside the data folder, because that
    folder is all that MLflow's loader module (`xh.pyfunc_entry`) is given."""
    import shutil

    from xh.graph.store import read_summary
    from xh.pipeline_record import PIPELINE_FILE, pipeline_record

    folder = Path(staging) / "model"
    shutil.copytree(model_dir, folder)
    record, copies = pipeline_record(cfg, read_summary(graphs))
    target = folder / PIPELINE_DIR
    target.mkdir()
    for name, uri in copies.items():
        # list_files names local files by absolute path, whatever way `uri` named the folder
        copy = graphs.store.at(uri)
        base = uri.rstrip("/") if copy.is_s3 else str(Path(uri.removeprefix("file://")).resolve())
        for f in copy.files():
            local = target / name / f[len(base) :].lstrip("/")
            local.parent.mkdir(parents=True, exist_ok=True)
            local.write_bytes(copy.store.at(f).read_bytes())
    (target / PIPELINE_FILE).write_text(json.dumps(record, indent=1))
    return str(folder)


def pipeline_of(name: str, version: str, dst: str) -> tuple[dict, str] | None:
    """(the version's pipeline record, the local folder holding it and its copied models), downloaded into
    `dst` without the weights; None for a version registered without one."""
    from mlflow.store.artifact.models_artifact_repo import ModelsArtifactRepository

    from xh.pipeline_record import PIPELINE_FILE

    repo = ModelsArtifactRepository(f"models:/{name}/{version}")
    meta = yaml.safe_load(Path(repo.download_artifacts("MLmodel", dst)).read_text()) or {}
    data = ((meta.get("flavors") or {}).get("python_function") or {}).get("data")
    if not data or not any(f.path.endswith("/" + PIPELINE_DIR) for f in repo.list_artifacts(data)):
        return None
    local = Path(repo.download_artifacts(f"{data}/{PIPELINE_DIR}", dst))
    return json.loads((local / PIPELINE_FILE).read_text()), str(local)
