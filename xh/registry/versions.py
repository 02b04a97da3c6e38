"""Looking a registered version up (`models:/NAME@ALIAS`, `models:/NAME/VERSION`) and loading it from its data alone."""

from __future__ import annotations

from pathlib import Path

import mlflow
import yaml

from xh.config import ConfigError
from xh.registry.pyfunc import LoadedVersion
from xh.tracking import tracking_store


def parse_model_uri(uri: str) -> tuple[str, str | None, str | None]:
    """`models:/NAME@ALIAS` -> (NAME, ALIAS, None); `models:/NAME/VERSION` -> (NAME, None, VERSION)."""
    ref = uri[len("models:/") :] if uri.startswith("models:/") else ""
    name, alias = ref.split("@", 1) if "@" in ref else (ref, None)
    name, number = (name.split("/", 1) + [None])[:2] if alias is None else (name, None)
    if not name or not (alias or number):
        raise ConfigError(f"score.model must be models:/NAME@ALIAS or models:/NAME/VERSION, not {uri!r}")
    return name, alias, number


def resolve_model(uri: str) -> dict:
    """`models:/NAME@ALIAS` or `models:/NAME/VERSION` -> name, version, run id (looked up once)."""
    name, alias, number = parse_model_uri(uri)
    client = mlflow.MlflowClient()
    try:
        if alias:
            version = client.get_model_version_by_alias(name, alias)
        else:
            version = client.get_model_version(name, number)
    except mlflow.exceptions.MlflowException as e:
        raise ConfigError(
            f"score.model: cannot resolve {uri} in the tracking store {tracking_store()}: {e.message}"
        ) from None
    return {"name": name, "version": str(version.version), "run_id": version.run_id or ""}


def version_of(client, name: str, alias: str):
    """The version `name@alias` (an MLflow ModelVersion), or None."""
    try:
        return client.get_model_version_by_alias(name, alias)
    except mlflow.exceptions.MlflowException:
        return None


def logged_model_id(version) -> str | None:
    """The logged model behind a registry version (an MLflow ModelVersion): a registry that keeps no
    `model_id` on its versions (MLflow 3's own server) still names it in the source, `models:/m-...`."""
    if version.model_id:
        return version.model_id
    source = version.source or ""
    return source[len("models:/") :].split("/")[0] if source.startswith("models:/m-") else None


def alias_version(name: str, alias: str) -> str | None:
    """The version `name@alias` points to, or None (no such model or alias)."""
    found = version_of(mlflow.MlflowClient(), name, alias)
    return found and str(found.version)


def version_files(name: str, version: str, dst: str | None = None) -> tuple[Path, dict]:
    """A registered version's files, downloaded (into `dst`, default: a folder of MLflow's), and its MLmodel
    read as YAML (data: nothing in it runs)."""
    local = Path(mlflow.artifacts.download_artifacts(artifact_uri=f"models:/{name}/{version}", dst_path=dst))
    try:
        meta = yaml.safe_load((local / "MLmodel").read_text())
    except (OSError, yaml.YAMLError) as e:
        raise ValueError(f"{name} version {version} has no readable MLmodel: {e}".splitlines()[0]) from None
    return local, meta if isinstance(meta, dict) else {}


def data_folder(local: Path, meta: dict, what: str) -> str:
    """The saved-model folder inside a version's files: the pyfunc's `data` (versions logged before, from code:
    the artifact `model`). Only a folder inside the version's files; whatever code the MLmodel names is ignored."""
    conf = (meta.get("flavors") or {}).get("python_function") or {}
    relative = conf.get("data") or ((conf.get("artifacts") or {}).get("model") or {}).get("path")
    folder = (local / str(relative or "")).resolve()
    if not relative or not folder.is_relative_to(local.resolve()) or not folder.is_dir():
        raise ValueError(f"{what} names no model folder inside its files (python_function data: {relative!r})")
    return str(folder)


def version_folder(name: str, version: str, dst: str | None = None) -> str:
    """A registered version's saved-model folder, downloaded (into `dst`: `version_files`) (`data_folder`)."""
    local, meta = version_files(name, version, dst)
    return data_folder(local, meta, f"{name} version {version}")


def model_folder(source: str) -> str:
    """A model's saved folder: `source` itself, or for a registered version (`models:/NAME/VERSION` or
    `models:/NAME@ALIAS`) its data folder, downloaded (`version_folder`): what `xh.inference.load_model` loads."""
    if not source.startswith("models:/"):
        return source
    found = resolve_model(source)
    return version_folder(found["name"], found["version"])


def load_registered(name: str, version: str) -> LoadedVersion:
    """A registered version loaded from its data alone with this package's classes (on the GPU when there is
    one): no code from the artifact store runs, whatever its MLmodel says."""
    return LoadedVersion(version_folder(name, version))


def version_loads(name: str, version: str) -> str | None:
    """None when the registered version's model loads (`load_registered`), else why not (one line)."""
    try:
        load_registered(name, version)
    except Exception as e:
        return f"{type(e).__name__}: {e}".splitlines()[0]
    return None
