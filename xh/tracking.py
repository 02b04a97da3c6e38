"""MLflow tracking shared by every stage: where runs go, what each run records about itself.

    with stage_run(cfg, "synth") as run:      # params = flatten(cfg, "synth"), tags = stage, git sha, versions
        mlflow.log_metric("docs", 2000)

    tracking = TrainingRun(cfg, "train", run_name="xh") if rank == 0 else None   # a training loop's rank 0
    tracking.log(step, {"loss": 0.7})         # buffered ...
    tracking.flush()                          # ... until a checkpoint is reported
    tracking.end()

Every run is opened by `stage_run`; `TrainingRun` is the one a Ray Train worker loop keeps open.
The embedded default is a SQLite store under `runs/mlflow/` (MLflow 3 has no file store); a
deployment points `mlflow.tracking_uri` at an `mlflow server`. Where runs go, first match wins:
`--set mlflow.tracking_uri=...`, the environment's `MLFLOW_TRACKING_URI`, the config file, the default
(`xh.config.load_config`). A Ray job runs in a temporary copy of the code, so a relative SQLite store
there is refused: its runs would be lost with the copy.

Credentials never go into a run: user info in a tracking URI (`http://user:password@host`) is moved to
MLflow's `MLFLOW_TRACKING_USERNAME` / `MLFLOW_TRACKING_PASSWORD` of this process, MLflow is given the URI
without it (MLflow prints that one in "View run at ..."), and logged parameters are `redact`ed.
"""

from __future__ import annotations

import logging
import os
import platform
import re
import subprocess
import time
from pathlib import Path
from urllib.parse import unquote, urlsplit, urlunsplit

from xh.config import ConfigError, MlflowConfig, XHConfig, flatten
from xh.storage.store import Location, Store
from xh.storage.uris import S3Settings, is_s3

# user info in a URI (`scheme://user:password@host`), and query parameters named like secrets
_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)[^/?#@\s]*@")
_SECRET_QUERY = re.compile(
    r"(?P<key>[?&][^=&#\s]*(?:token|secret|password|signature|credential|key)[^=&#\s]*=)[^&#\s]*", re.I
)


# a setting whose name says it holds a secret: its whole value is one
_SECRET_NAME = re.compile(r"password|secret|token|credential|api_?key", re.I)


def redact(value):
    """A value with the credentials inside URIs replaced by `***` (other values as they are)."""
    if not isinstance(value, str):
        return value
    return _SECRET_QUERY.sub(r"\g<key>***", _USERINFO.sub(r"\g<scheme>***@", value))


def redact_tree(tree, name: str = ""):
    """`tree` (config sections as plain data) with every credential inside a value `redact`ed and the whole
    value of a setting named like a secret (`*password*`, `*token*`, ...) shown as `***`."""
    if isinstance(tree, dict):
        return {key: redact_tree(value, str(key)) for key, value in tree.items()}
    if isinstance(tree, list):
        return [redact_tree(item, name) for item in tree]
    if isinstance(tree, str) and tree and _SECRET_NAME.search(name):
        return "***"
    return redact(tree)


def tracking_uri_without_credentials(uri: str) -> tuple[str, str | None, str | None]:
    """`http://user:pw@host:5000/x` -> (`http://host:5000/x`, "user", "pw"); a URI without user info as it is."""
    parts = urlsplit(uri)
    if "@" not in parts.netloc:
        return uri, None, None
    userinfo, _, host = parts.netloc.rpartition("@")
    user, sep, password = userinfo.partition(":")
    return urlunsplit(parts._replace(netloc=host)), unquote(user) or None, unquote(password) if sep else None


def in_ray_job() -> bool:
    """True in the driver of a `ray job submit` job (Ray sets this variable there)."""
    return "RAY_JOB_CONFIG_JSON_ENV_VAR" in os.environ


def _is_uri(location: str) -> bool:
    """`s3://...`, `file:///...`, `mlflow-artifacts:/...`: a scheme before the first slash."""
    return ":" in location.split("/", 1)[0]


def check_tracking(cfg: MlflowConfig) -> None:
    """What a Ray job would lose, refused in one line: a relative SQLite store or a relative artifact location
    (a job runs in a temporary copy of the code, deleted with it)."""
    uri = tracking_uri_without_credentials(cfg.tracking_uri)[0]
    if in_ray_job() and uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        raise ConfigError(
            f"mlflow.tracking_uri {uri} is relative, and a Ray job runs in a temporary copy of the code: its "
            "runs would be lost; set MLFLOW_TRACKING_URI (or mlflow.tracking_uri) to a tracking server"
        )
    artifact_root(cfg)


def artifact_root(cfg: MlflowConfig) -> str | None:
    """The artifact location of an experiment this process creates (None: the tracking server's own root).

    A relative location is resolved against the working directory, except in a Ray job, whose working
    directory is a temporary copy of the code: there a tracking server's own root is used, and without a
    server the location is refused (its artifacts, and the model weights of later runs, would vanish)."""
    location = cfg.artifact_location
    if not location or is_s3(location) or _is_uri(location):
        return location or None
    if not in_ray_job() or Path(location).is_absolute():
        return Path(location).resolve().as_uri()
    if cfg.tracking_uri.startswith(("http://", "https://")):
        logging.getLogger("xh.tracking").info(
            "mlflow.artifact_location %s is relative to this job's temporary copy of the code: new experiments "
            "keep their artifacts under the tracking server's own root",
            location,
        )
        return None
    raise ConfigError(
        f"mlflow.artifact_location {location} is relative, and a Ray job runs in a temporary copy of the code: "
        "its artifacts would be lost with it; set it to s3://... or an absolute path"
    )


def tracking_store(uri: str | None = None) -> str:
    """The tracking store `uri` names (default: MLflow's current one), as an error message may show it."""
    import mlflow

    return redact(tracking_uri_without_credentials(uri or mlflow.get_tracking_uri())[0])


def require_registry(cfg: MlflowConfig, what: str) -> None:
    """A SQLite tracking store that does not exist is refused in one line naming it, before MLflow opens
    it (opening creates an empty store: a mistyped path or a run from another folder would leave one)."""
    uri = tracking_uri_without_credentials(cfg.tracking_uri)[0]
    if uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///") :]).is_file():
        raise ConfigError(
            f"{what}: no MLflow tracking store at {uri} ({Path(uri[len('sqlite:///') :]).resolve()} does not "
            "exist), so no registered model; set mlflow.tracking_uri (or MLFLOW_TRACKING_URI) to the store "
            "that holds it"
        )


def configure(cfg: MlflowConfig, store: Store | None = None, *, registry: str | None = None) -> str:
    """Point MLflow at the tracking store and experiment of `cfg`, its S3 artifacts reached with `store`'s
    settings (default: the environment's); return the experiment id. A stage that only reads the registry
    names the setting that looks a model up (`registry="score.model"`): a missing SQLite store is then
    refused (`require_registry`), not created."""
    import mlflow

    check_tracking(cfg)
    if registry is not None:
        require_registry(cfg, registry)
    uri, user, password = tracking_uri_without_credentials(cfg.tracking_uri)
    if uri.startswith("sqlite:///"):
        Path(uri[len("sqlite:///") :]).parent.mkdir(parents=True, exist_ok=True)
    if user is not None:
        os.environ["MLFLOW_TRACKING_USERNAME"] = user
    if password is not None:
        os.environ["MLFLOW_TRACKING_PASSWORD"] = password
    # MLflow's S3 artifact client reads its endpoint from the environment.
    os.environ.update((store.s3 if store is not None else S3Settings.from_env()).env())
    # set_tracking_uri also exports MLFLOW_TRACKING_URI, which `load_config` reads as the user's choice:
    # the environment is left as the user (or the job) set it.
    launched_with = os.environ.get("MLFLOW_TRACKING_URI")
    mlflow.set_tracking_uri(uri)
    if launched_with is None:
        os.environ.pop("MLFLOW_TRACKING_URI", None)
    else:
        os.environ["MLFLOW_TRACKING_URI"] = launched_with
    experiment = mlflow.get_experiment_by_name(cfg.experiment)
    if experiment is not None:
        return experiment.experiment_id
    return mlflow.create_experiment(cfg.experiment, artifact_location=artifact_root(cfg))


def absolute_tracking(cfg: XHConfig) -> XHConfig:
    """SQLite and local artifact paths made absolute: Ray workers run in another working directory."""
    m = cfg.mlflow
    uri = m.tracking_uri
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        uri = "sqlite:///" + str(Path(uri[len("sqlite:///") :]).resolve())
    location = m.artifact_location
    if location and not is_s3(location) and not _is_uri(location):  # in a Ray job maybe the server's root
        location = str(Path(location).resolve()) if artifact_root(m) else None
    return cfg.model_copy(update={"mlflow": m.model_copy(update={"tracking_uri": uri, "artifact_location": location})})


# Summary keys that are not measurements: quarantine reasons are data, free text (quotes, brackets) that
# MLflow refuses in a metric name; `settings` (the graphs') are the configuration a stage ran with, which
# its run holds as params. A stage logs both as files.
NOT_METRICS = frozenset({"quarantine_reasons", "settings"})


def flatten_numbers(tree: dict, prefix: str = "") -> dict[str, float]:
    """The numbers of a nested summary as dotted MLflow metric names (`retrieve.eval.all.supp_recall_at_2`),
    leaving out `NOT_METRICS` at any depth (the demo's summary nests every stage's)."""
    out: dict[str, float] = {}
    for key, value in tree.items():
        if key in NOT_METRICS:
            continue
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


def device_tags() -> dict[str, str]:
    """What a training run ran on: torch's version, cpu or cuda, and which GPU."""
    import torch

    tags = {"torch": torch.__version__, "device": "cuda" if torch.cuda.is_available() else "cpu"}
    if torch.cuda.is_available():
        tags["gpu"] = torch.cuda.get_device_name(0)
    return tags


def stage_run(
    cfg: XHConfig,
    stage: str,
    run_name: str | None = None,
    store: Store | None = None,
    *,
    params: dict | None = None,
    tags: dict | None = None,
    run_id: str | None = None,
):
    """Start the MLflow run of one stage: the stage's config as flattened params (and `params`), the stage
    and the environment as tags (and `tags`). With `run_id`, reopen that run instead (a resumed training).

    Returns MLflow's active run: `with stage_run(...) as run:` ends it, or `mlflow.end_run()` does.
    """
    import mlflow

    experiment_id = configure(cfg.mlflow, store)
    if run_id is not None:
        return mlflow.start_run(run_id=run_id)
    # Inside another stage's run (the demo's), a stage's run is its child.
    nested = mlflow.active_run() is not None
    run = mlflow.start_run(experiment_id=experiment_id, run_name=run_name or stage, nested=nested)
    try:
        mlflow.set_tags({"stage": stage, **environment_tags(), **(tags or {})})
        mlflow.log_params({k: redact(v) for k, v in {**flatten(cfg, stage), **(params or {})}.items()})
    except Exception:
        mlflow.end_run("FAILED")
        raise
    return run


class TrainingRun:
    """Rank 0's MLflow run in a Ray Train worker loop (the other workers keep none), tagged with `device_tags`.

    Step metrics wait in a buffer until `flush`, which the loop calls once a checkpoint is reported:
    after a failure the steps since that checkpoint run again, and are still logged only once.
    """

    def __init__(
        self,
        cfg: XHConfig,
        stage: str,
        *,
        run_name: str,
        run_id: str | None = None,
        params: dict | None = None,
        tags: dict | None = None,
    ):
        tags = {**device_tags(), **(tags or {})}
        self.run_id = stage_run(cfg, stage, run_name, params=params, tags=tags, run_id=run_id).info.run_id
        self.pending: list = []

    def log(self, step: int, metrics: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.pending.extend(Metric(k, float(v), now, step) for k, v in metrics.items())

    def flush(self) -> None:
        import mlflow

        client = mlflow.MlflowClient()
        for start in range(0, len(self.pending), 900):  # MLflow takes at most 1000 metrics per batch
            client.log_batch(self.run_id, metrics=self.pending[start : start + 900])
        self.pending.clear()

    def end(self) -> None:
        import mlflow

        self.flush()
        mlflow.end_run()


# --- dataset lineage -------------------------------------------------------------------------------
# MLflow's dataset entities (`mlflow.log_input`): a run names the data it read by source URI, a digest and a
# profile (row counts), without copying it. The digest of a folder covers its files' names, sizes and
# modification times (read from a listing: a graphs folder is never re-read to name it).

DIGEST_CHARS = 16  # MLflow keeps at most 36 characters of a dataset digest


def _digest(parts) -> str:
    import hashlib
    import json

    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:DIGEST_CHARS]


def files_fingerprint(where: Location) -> list[tuple[str, int, int]]:
    """(path inside `where`, size, modification time in ns) of a file or of every file under a folder."""
    from xh.storage.uris import list_paths

    fs, path = where.fs_path()
    info = fs.get_file_info(path)
    if info.type.name == "NotFound":
        return []
    infos = [info] if info.type.name == "File" else fs.get_file_info(list_paths(fs, path))
    return sorted(
        (i.path[len(path) :].lstrip("/"), int(i.size or 0), int(i.mtime_ns or 0))
        for i in infos
        if i.type.name == "File"
    )


def dataset_ref(where: Location, name: str, profile: dict, digest_of=None) -> dict:
    """A plain description of one dataset a run used (it travels to Ray workers as it is): its source URI, its
    name, a digest of `digest_of` (default: the files under `where`) and `profile` (row counts, the split)."""
    parts = files_fingerprint(where) if digest_of is None else digest_of
    return {"uri": redact(where.uri), "name": name, "digest": _digest([parts, profile]), "profile": dict(profile)}


def _dataset(ref: dict):
    """An MLflow dataset of metadata only (no data is copied), with `ref`'s source, digest and profile."""
    import json

    from mlflow.data.meta_dataset import MetaDataset
    from mlflow.data.sources import LocalArtifactDatasetSource, S3ArtifactDatasetSource

    class ProfiledDataset(MetaDataset):
        @property
        def profile(self):
            return ref["profile"]

        def to_dict(self):
            return super().to_dict() | {"profile": json.dumps(ref["profile"], default=str)}

    uri = ref["uri"]
    source = S3ArtifactDatasetSource(uri) if is_s3(uri) else LocalArtifactDatasetSource(uri)
    return ProfiledDataset(source, name=ref["name"], digest=ref["digest"])


def log_datasets(refs_by_context: list[tuple[dict, str]], run_id: str | None = None) -> None:
    """Log each (dataset_ref, context) as an input of the run `run_id` (default: the active run)."""
    import mlflow
    from mlflow.entities import DatasetInput, InputTag
    from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT

    inputs = [
        DatasetInput(_dataset(ref)._to_mlflow_entity(), [InputTag(MLFLOW_DATASET_CONTEXT, context)])
        for ref, context in refs_by_context
    ]
    mlflow.MlflowClient().log_inputs(run_id or mlflow.active_run().info.run_id, datasets=inputs)


def log_scoring_lineage(inputs: dict[str, str], partition: Location, rows: int) -> None:
    """Scoring's lineage in its active run: each input file it scored (URI and content digest, context
    `scoring`) and the predictions partition it published into (its rows afterwards, context `predictions`)."""
    from pathlib import PurePosixPath

    refs = [
        (
            dataset_ref(partition.store.at(uri), PurePosixPath(uri).name, {"content_digest": d}, digest_of=d),
            "scoring",
        )
        for uri, d in inputs.items()
    ]
    refs.append((dataset_ref(partition, "predictions", {"num_rows": rows}), "predictions"))
    log_datasets(refs)
