"""The MLflow model registry: package a trained model as a pyfunc, register it, gate promotion.

    log_and_register(model_dir, run_id=..., cfg=cfg, metrics=..., graphs_uri=...)   # -> version, @challenger
    version = resolve_model("models:/xh-hotpot@champion")   # {"name", "version", "run_id"}: one version
    model, tokenizer = load_version(version["name"], version["version"])
    model = load_registered("xh-hotpot", "3")            # what promotion, rollback and scoring load
    model = mlflow.pyfunc.load_model("models:/xh-hotpot@champion")   # `xh.pyfunc_entry`: it answers questions
    model.predict(pd.DataFrame({"id": [...], "question": [...]}))          # rows validated as `PyfuncInput`
    model.predict(pd.DataFrame({"qid": [...], "question": [...], "graph": [json.dumps(graph_row)]}))
    decision = promote("xh-hotpot", eval_rows, metric="f1", min_delta=0.5, floor=0.0, missed=quarantined_ids)
    rollback("xh-hotpot")

A version's files are data only: the safetensors weights, tokenizer and config (the saved-model folder,
the pyfunc's `data`), its MLmodel, signature and requirements; no code. Its pyfunc is MLflow's `loader_module`
flavour naming `xh.pyfunc_entry`, which MLflow imports from the installed `xh` package. Promotion, rollback and
scoring go further (`load_registered`): they read MLmodel as YAML only to find the data folder, and build the
model with this package's classes, so that nothing written to the artifact store (a `code/` folder, a python
file, a pickle, another loader module in a rewritten MLmodel) ever runs with the job's credentials. Serving the
pyfunc (`mlflow models serve`) therefore needs the project installed: the image, or `--env-manager local`.
Promotion evaluates `@challenger` and `@champion` on the same rows and moves `@champion` only when the
challenger wins by `min_delta` points (the first model, or one facing an unloadable champion, must pass
`floor`); the move is a compare-and-swap under the registry lock, and every version it replaces is
appended to the registered model's tag `champion_history`, whose last `rollback` restores.

The registry lock of `NAME` is the registered model `NAME.promotion-lock`: creating a registered model is a
conditional create in the registry's database (its name is the primary key), which exactly one of any number
of simultaneous promotions wins, whatever the latency of each. It carries {owner, expires} as tags; an
expired lock (a holder that died) is broken by the one process that creates its break marker.
"""

from __future__ import annotations

import json
import math
import random
import time
import uuid
import warnings
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace

import mlflow
import pandas as pd
import yaml
from mlflow.models import ModelSignature
from pydantic import BaseModel, ConfigDict, model_validator

from xh.config import ConfigError, XHConfig

INPUT_COLUMNS = ["qid", "question", "graph"]
LOADER_MODULE = "xh.pyfunc_entry"  # MLflow imports it from the installed package; never from the artifact
PREVIOUS_CHAMPION_TAG = "previous_champion"  # the last of HISTORY_TAG (kept for older readers)
HISTORY_TAG = "champion_history"  # JSON list of every version @champion replaced, oldest first
LOCK_SUFFIX = ".promotion-lock"  # the registered model NAME.promotion-lock exists while a promotion holds NAME
LEASE_TTL_S = 120.0  # a lock older than this is a dead holder's: the locked steps take a few registry calls
LOCK_POLL_S = 0.5


class PyfuncInput(BaseModel):
    """One row of the registered pyfunc's input (`xh.pyfunc_entry`): an id (`id` or `qid`) and a question, a
    FEVER claim or a prebuilt graph (a GRAPHS row as JSON); `type` (bridge or comparison) where known. MLflow
    validates each row against it (the type hints of `predict`); a frame's missing cell (NaN) counts as none."""

    model_config = ConfigDict(extra="forbid")

    id: str | int | None = None
    qid: str | int | None = None
    question: str | None = None
    claim: str | None = None
    type: str | None = None
    graph: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _missing_cells(cls, values):
        if isinstance(values, dict):  # a frame with both question and claim columns has NaN where a row has none
            return {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in values.items()}
        return values

    @model_validator(mode="after")
    def _answerable(self) -> PyfuncInput:
        if self.id is None and self.qid is None:
            raise ValueError("a row needs an id (`id` or `qid`)")
        if not any(t and t.strip() for t in (self.question, self.claim, self.graph)):
            raise ValueError("a row needs a `question`, a `claim` or a `graph`")
        return self


def pyfunc_signature() -> ModelSignature:
    """The signature MLflow infers from the type hints of `xh.pyfunc_entry.XHVersionModel.predict` (a list of
    `PyfuncInput` objects), with the `batch_graphs` parameter. Built here, because a `loader_module` model is
    logged without its class; marked as from type hints, so that MLflow leaves the input to `predict`'s own
    validation (and its scoring server takes `{"inputs": [...]}`)."""
    from mlflow.types import ColSpec, DataType, ParamSchema, ParamSpec, Schema
    from mlflow.types.schema import AnyType, Object, Property

    def kind(field) -> object:  # an id may be a string or a number (FEVER's): any
        return AnyType() if field.annotation == (str | int | None) else DataType.string

    properties = [Property(name, kind(f), required=False) for name, f in PyfuncInput.model_fields.items()]
    signature = ModelSignature(
        inputs=Schema([ColSpec(Object(properties))]),
        outputs=Schema([ColSpec(AnyType())]),
        params=ParamSchema([ParamSpec("batch_graphs", DataType.long, 8)]),
    )
    signature._is_signature_from_type_hint = True  # what MLflow records for a PythonModel with type hints
    return signature


class XHPyfunc(mlflow.pyfunc.PythonModel):
    """Questions with their evidence graphs in, answers (or FEVER verdicts) out."""

    def load_context(self, context) -> None:
        import torch

        from xh.inference import load_model

        self.model, self.tokenizer = load_model(
            context.artifacts["model"], "cuda" if torch.cuda.is_available() else "cpu"
        )

    def predict(self, context, model_input: pd.DataFrame, params: dict | None = None) -> pd.DataFrame:
        from xh.inference import predict_graphs

        rows = []
        for qid, question, graph in zip(model_input["qid"], model_input["question"], model_input["graph"]):
            row = json.loads(graph) if isinstance(graph, str) else dict(graph)
            rows.append(row | {"qid": qid, "question": question})
        batch_graphs = int((params or {}).get("batch_graphs", 8))
        return predictions_frame(predict_graphs(self.model, self.tokenizer, rows, batch_graphs=batch_graphs))


class LoadedVersion:
    """A registered version's model, as `xh.pyfunc_entry._load_pyfunc` gives it to MLflow and `load_registered`
    to promotion and scoring: `predict(frame, params)` of the saved-model folder `data_path`."""

    def __init__(self, data_path: str):
        self.pyfunc = XHPyfunc()
        self.pyfunc.load_context(SimpleNamespace(artifacts={"model": data_path}))
        self.model, self.tokenizer = self.pyfunc.model, self.pyfunc.tokenizer

    def predict(self, model_input: pd.DataFrame, params: dict | None = None) -> pd.DataFrame:
        return self.pyfunc.predict(None, model_input, params)


def predictions_frame(predictions: Sequence[dict]) -> pd.DataFrame:
    """Flat columns: lists and dicts become JSON strings, so the frame has a plain signature."""
    return pd.DataFrame(
        [{k: json.dumps(v) if isinstance(v, (list, dict)) else v for k, v in p.items()} for p in predictions]
    )


def graph_input(rows: Sequence[dict]) -> pd.DataFrame:
    """Graph rows (from the `graphs` table) as the pyfunc's input frame."""
    return pd.DataFrame(
        {
            "qid": [r["qid"] for r in rows],
            "question": [r["question"] for r in rows],
            "graph": [json.dumps(r, default=str) for r in rows],
        }
    )


def pip_requirements() -> list[str]:
    """The packages a served model needs, pinned to the installed *public* versions.

    A local version label (`2.13.0+cpu`, `2.11.0+cu130`) names a build only one index has: `mlflow models
    serve` or a rebuilt virtualenv could not resolve it, so the pin keeps the public part.
    """
    from importlib.metadata import version

    from packaging.version import Version

    names = ["torch", "transformers", "safetensors", "tokenizers", "numpy", "pandas", "pyarrow", "mlflow"]
    return [f"{n}=={Version(version(n)).public}" for n in names]


def data_snapshot(graphs_uri: str) -> str:
    """What the model was trained on: the graphs folder and its files' total size (cheap, changes with the data)."""
    from xh.storage import list_paths, resolve

    fs, path = resolve(graphs_uri)
    infos = fs.get_file_info([p for p in list_paths(fs, path) if p.endswith(".parquet")])
    return f"{graphs_uri} ({len(infos)} files, {sum(i.size or 0 for i in infos)} bytes)"


def model_flavour(model) -> dict[str, str]:
    """Which architecture (and XH hop variant) a model is: the logged model's metadata and version tags."""
    from xh.model.variants import architecture_of

    flavour = {"architecture": architecture_of(model)}
    if flavour["architecture"] == "xh":
        flavour["hop_variant"] = model.cfg.hop_variant
    return flavour


def log_and_register(model_dir: str, *, run_id: str, cfg: XHConfig, metrics: dict, graphs_uri: str) -> dict:
    """Log the model folder as a pyfunc into the training run, register a version, give it the alias.

    The version's data is the model folder plus `pipeline/` (`with_pipeline`): the retrieval and graph
    settings, trained models and index reference that turn a question into the graphs it trained on."""
    import tempfile

    from xh.inference import load_model
    from xh.tracking import configure, environment_tags

    configure(cfg.mlflow)
    staging = tempfile.TemporaryDirectory(prefix="xh-version-")
    model_dir = with_pipeline(model_dir, staging.name, cfg, graphs_uri)
    model, _ = load_model(model_dir)
    name = cfg.train.register_as
    # start_run(run_id) refuses a run of another experiment than the process's active one
    mlflow.set_experiment(experiment_id=mlflow.MlflowClient().get_run(run_id).info.experiment_id)
    with mlflow.start_run(run_id=run_id, nested=mlflow.active_run() is not None), warnings.catch_warnings():
        # no input example: MLflow checks a loader module's example as a frame against the signature, which
        # describes a list of objects (the type hints of `xh.pyfunc_entry`'s predict); its advice is noise here
        warnings.filterwarnings("ignore", message=".*input example was not provided", category=UserWarning)
        info = mlflow.pyfunc.log_model(
            name="model",
            loader_module=LOADER_MODULE,
            data_path=model_dir,
            signature=pyfunc_signature(),
            pip_requirements=pip_requirements(),
            metadata=model_flavour(model),
        )
        version = mlflow.register_model(info.model_uri, name).version
    client = mlflow.MlflowClient()
    client.set_registered_model_alias(name, cfg.train.alias, version)
    tags = {
        "git_sha": environment_tags()["git_sha"],
        "data_snapshot": data_snapshot(graphs_uri),
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


PIPELINE_DIR = "pipeline"  # inside the version's data folder: what `pipeline_of` reads


def with_pipeline(model_dir: str, staging: str, cfg: XHConfig, graphs_uri: str) -> str:
    """`staging`/model: a copy of `model_dir` with `pipeline/pipeline.json` (`xh.pipeline_record.pipeline_record`)
    and a copy of each small trained model it names (the path scorer). Inside the data folder, because that
    folder is all that MLflow's loader module (`xh.pyfunc_entry`) is given."""
    import shutil

    from xh.graph.store import read_summary
    from xh.pipeline_record import PIPELINE_FILE, pipeline_record
    from xh.storage import is_s3, list_files, open_input

    folder = Path(staging) / "model"
    shutil.copytree(model_dir, folder)
    record, copies = pipeline_record(cfg, read_summary(graphs_uri))
    target = folder / PIPELINE_DIR
    target.mkdir()
    for name, uri in copies.items():
        # list_files names local files by absolute path, whatever way `uri` named the folder
        base = uri.rstrip("/") if is_s3(uri) else str(Path(uri.removeprefix("file://")).resolve())
        for f in list_files(uri):
            local = target / name / f[len(base) :].lstrip("/")
            local.parent.mkdir(parents=True, exist_ok=True)
            with open_input(f) as stream:
                local.write_bytes(stream.read())
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


# --- looking a version up -------------------------------------------------------------------------


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
        raise ConfigError(f"score.model: cannot resolve {uri}: {e.message}") from None
    return {"name": name, "version": str(version.version), "run_id": version.run_id or ""}


def version_files(name: str, version: str) -> tuple[Path, dict]:
    """A registered version's files, downloaded, and its MLmodel read as YAML (data: nothing in it runs)."""
    local = Path(mlflow.artifacts.download_artifacts(artifact_uri=f"models:/{name}/{version}"))
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


def load_registered(name: str, version: str) -> LoadedVersion:
    """A registered version loaded from its data alone with this package's classes (on the GPU when there is
    one): no code from the artifact store runs, whatever its MLmodel says."""
    local, meta = version_files(name, version)
    return LoadedVersion(data_folder(local, meta, f"{name} version {version}"))


def input_columns(meta: dict) -> list[str]:
    """The input column names of a version's signature (MLmodel's `signature.inputs`, a JSON string); for a
    signature of one object per row (`pyfunc_signature`), the object's fields."""
    try:
        inputs = json.loads(((meta.get("signature") or {}).get("inputs")) or "[]")
    except (TypeError, json.JSONDecodeError):
        return []
    if (
        len(inputs) == 1
        and isinstance(inputs[0], dict)
        and inputs[0].get("type") == "object"
        and not inputs[0].get("name")
    ):
        return sorted((inputs[0].get("properties") or {}).keys())
    return [c.get("name") for c in inputs if isinstance(c, dict)]


def takes_graph_rows(meta: dict) -> bool:
    """Whether a version's signature takes prebuilt graph rows: the graph columns, or `PyfuncInput`'s fields."""
    names = input_columns(meta)
    return names == INPUT_COLUMNS or names == sorted(PyfuncInput.model_fields)


def load_version(name: str, version: str) -> tuple:
    """A registered version's XH model and tokenizer (`load_registered`)."""
    loaded = load_registered(name, version)
    return loaded.model, loaded.tokenizer


# --- promotion -------------------------------------------------------------------------------------


def _version_of(client, name: str, alias: str):
    try:
        return client.get_model_version_by_alias(name, alias)
    except mlflow.exceptions.MlflowException:
        return None


def alias_version(name: str, alias: str) -> str | None:
    """The version `name@alias` points to, or None (no such model or alias)."""
    found = _version_of(mlflow.MlflowClient(), name, alias)
    return found and str(found.version)


def evaluation_set(name: str, version: str, eval_set: str | None, s3=None) -> dict:
    """What promotion evaluates `version` of `name` on, held out from its training: `eval_set` when named,
    else the dev split its training run recorded (`xh.train.split`). A named set that shares questions with
    the version's training set is refused (ConfigError, counting them); a version whose run recorded no split
    (registered from code, or before the record) needs a named set, which is then taken as it is.

    Returns {"uri", "rows", "missed", "dataset"}: the set's description, its graph rows, the ids of its
    questions without a graph (misses), and its lineage (`xh.tracking.dataset_ref`)."""
    from xh.graph.store import quarantined_qids, read_eval_set
    from xh.store import Store
    from xh.tracking import dataset_ref
    from xh.train.split import dev_set, dev_uri, recorded_split, shared_questions

    store = Store(s3=s3) if s3 else Store()  # reaches the recorded folders

    run_id = mlflow.MlflowClient().get_model_version(name, version).run_id or ""
    record = recorded_split(run_id)
    what = f"{name} version {version}"
    if eval_set is None:
        if record is None:
            raise ConfigError(
                f"{what} has no recorded training split (its run {run_id or '(none)'} has no split.json): "
                "name held-out graphs with promote.eval_set (--eval-set)"
            )
        rows, missed = dev_set(record, store)
        uri, folder = dev_uri(record), record["dev_graphs"] or record["graphs"]
        profile = {"split": "dev", "dev_fraction": record["dev_fraction"], "question_types": record["question_types"]}
    else:
        rows, missed = read_eval_set(eval_set, s3), quarantined_qids(eval_set, s3)
        if record is not None:
            qids = {r["qid"] for r in rows}
            shared = shared_questions(record, qids, store)
            if shared:
                raise ConfigError(
                    f"promote.eval_set {eval_set} shares {shared} of its {len(qids)} questions with the training "
                    f"set of {what} (run {run_id}): name held-out graphs, or leave it unset for the run's dev split"
                )
        uri, folder = eval_set, eval_set
        profile = {"split": "named", "training_split": "checked" if record is not None else "not recorded"}
    profile |= {"num_rows": len(rows), "missed": len(missed)}
    return {
        "uri": uri,
        "folder": folder,
        "rows": rows,
        "missed": missed,
        "dataset": dataset_ref(store.at(folder), "eval-set", profile),
    }


def eval_graph_drift(name: str, version: str, folder: str, s3=None, allow_drift: bool = False) -> dict | None:
    """How the graphs of an evaluation set (`folder`, built by `xh graphs`) differ from those `version` of `name`
    was trained on: each graph setting its `_summary.json` records is compared with the version's pipeline record
    (`xh.pipeline_record.GRAPH_KNOBS`), as batch scoring compares its config (`apply_pipeline`). A difference is
    refused (`PipelineDrift`, one line naming the setting) unless `allow_drift` (`score.allow_drift`), and then
    returned as {setting: {"version", "used"}}. None for a version registered without a pipeline record."""
    import tempfile

    from xh.graph.store import read_summary
    from xh.pipeline_record import GRAPH_KNOBS, PipelineDrift

    with tempfile.TemporaryDirectory(prefix="xh-pipeline-") as dst:
        found = pipeline_of(name, version, dst)
    if found is None:
        return None
    theirs = found[0]["graphs"]
    summary = read_summary(folder, s3)
    built = summary.get("settings", {}) | {k: summary[k] for k in ("task", "edge_mode") if k in summary}
    drift = {}
    for key in GRAPH_KNOBS:
        if key in built and key in theirs and built[key] != theirs[key]:
            if not allow_drift:
                raise PipelineDrift(
                    f"graphs.{key}={built[key]!r} of the evaluation set {folder} differs from {name} version "
                    f"{version}'s {theirs[key]!r}: a version is judged on graphs built as it was trained (rebuild "
                    "the evaluation set, or set score.allow_drift=true)"
                )
            drift[f"graphs.{key}"] = {"version": theirs[key], "used": built[key]}
    return drift


def version_predictions(name: str, version: str, rows: Sequence[dict]) -> list[dict]:
    """One registered version's predictions on graph rows (in their order), loaded from its data alone; a
    signature other than the graph input's is refused (ValueError)."""
    local, meta = version_files(name, version)
    if not takes_graph_rows(meta):
        raise ValueError(f"signature mismatch: inputs {input_columns(meta)}, expected {INPUT_COLUMNS}")
    frame = LoadedVersion(data_folder(local, meta, f"{name} version {version}")).predict(graph_input(rows))
    return [
        {k: json.loads(v) if k in ("supporting_facts", "evidence", "label_probs") else v for k, v in p.items()}
        for p in frame.to_dict("records")
    ]


def official_metrics(rows: Sequence[dict], predictions: Sequence[dict], task: str, missed: Sequence[str] = ()) -> dict:
    """HotpotQA's official metrics (FEVER: its scorer, with the slices) of predictions aligned with `rows`;
    `missed`: ids of evaluation questions that got no graph, each scored as a miss (`xh.inference.hotpot_gold`)."""
    from xh.eval.hotpot import evaluate_hotpot
    from xh.inference import hotpot_gold, hotpot_prediction_file

    if task == "fever":  # the official scorer: fever_score, label_accuracy, evidence_*, and per slice
        from xh.eval.fever import evaluate_fever, flat_metrics, with_misses
        from xh.inference import fever_gold, fever_prediction_file

        result = evaluate_fever(fever_gold(rows), fever_prediction_file(predictions), slices=True)
        return with_misses(flat_metrics(result), len(rows), len(missed))
    return evaluate_hotpot(hotpot_gold(rows, missed), hotpot_prediction_file(predictions))


def evaluate_version(name: str, version: str, rows: Sequence[dict], task: str, missed: Sequence[str] = ()) -> dict:
    """The official metrics (HotpotQA's; FEVER's scorer with its slices) of one registered version on graph rows,
    in this process; `missed`: ids of evaluation questions that got no graph, each scored as a miss."""
    return official_metrics(rows, version_predictions(name, version, rows), task, missed)


def promote(
    name: str,
    rows: Sequence[dict],
    *,
    metric: str = "f1",
    min_delta: float = 0.5,
    floor: float = 0.0,
    task: str = "hotpot",
    challenger_version: str | None = None,
    lease_timeout_s: float = 600.0,
    missed: Sequence[str] = (),
    eval_set: str | None = None,
    decision_run_id: str | None = None,
    evaluate=None,
    pipeline_drift: dict | None = None,
) -> dict:
    """Move `@champion` to `@challenger` if it wins on `rows` by `min_delta` points (metrics x 100).

    Returns the decision (also written as a tag on the challenger version); a challenger that fails to
    load, whose signature differs or whose metric is missing is never promoted, and the reason is
    returned. A champion that cannot be loaded or evaluated is compared against nothing: the challenger
    must then pass `floor`, like a first model.

    The alias moves as a compare-and-swap: under the registry lock (`LOCK_SUFFIX`) `@champion` is read
    again, and if another promotion moved it meanwhile, the lock is given back, the challenger is evaluated
    against the new champion, and the swap is tried again. The decision names the champion it was compared against (`champion`); every
    replaced version is appended to the registered model's `champion_history` tag. `missed`: ids of
    evaluation questions quarantined at graph building; both models score 0 on them (the official rule).
    `eval_set` (what the rows are, `evaluation_set`) and `decision_run_id` (the MLflow run that logs the
    decision and its eval set as an input) go into the decision. `evaluate`: how a version is evaluated,
    `evaluate_version`'s signature (default: it, in this process; `xh.promotion.on_ray`: an actor pool).
    `pipeline_drift`: the graph settings of the rows that differ from the challenger's, opted into
    (`eval_graph_drift`); recorded in the decision.
    """
    evaluate = evaluate or evaluate_version
    client = mlflow.MlflowClient()
    if challenger_version is not None:
        challenger = client.get_model_version(name, str(challenger_version))
    else:
        challenger = _version_of(client, name, "challenger")
    champion = _version_of(client, name, "champion")
    decision: dict = {
        "model": name,
        "metric": metric,
        "min_delta": min_delta,
        "floor": floor,
        "challenger": challenger and challenger.version,
        "champion": champion and champion.version,
        "promoted": False,
        "decided_at": _now(),
    }
    if eval_set is not None:
        decision |= {"eval_set": eval_set, "eval_questions": len(rows) + len(missed)}
    if decision_run_id is not None:
        decision["decision_run_id"] = decision_run_id
    if pipeline_drift:
        decision["pipeline_drift"] = pipeline_drift
    if challenger is None:
        return decision | {"reason": f"{name} has no @challenger"}
    if champion is not None and champion.version == challenger.version:
        return decision | {"reason": "the challenger already is the champion"}
    try:
        challenger_metrics = evaluate(name, challenger.version, rows, task, missed)
    except Exception as e:  # any failure of the challenger is a reason not to promote it
        return _record(client, name, decision | {"reason": f"challenger evaluation failed: {e}"}, challenger)
    if metric not in challenger_metrics:
        return _record(client, name, decision | {"reason": f"challenger has no metric '{metric}'"}, challenger)
    score = 100 * challenger_metrics[metric]
    decision["challenger_score"] = score
    champion_scores: dict[str, float | str] = {}  # version -> score, or why it could not be evaluated

    def judge(champion_version: str | None) -> dict:
        verdict = decision | {"champion": champion_version, "decided_at": _now()}
        verdict.pop("champion_score", None)
        if champion_version == challenger.version:
            return verdict | {"reason": "the challenger already is the champion"}
        if champion_version is not None and champion_version not in champion_scores:
            try:
                found = evaluate(name, champion_version, rows, task, missed)
                champion_scores[champion_version] = 100 * found[metric]
            except Exception as e:  # a champion that cannot be scored is no obstacle, but the floor is
                champion_scores[champion_version] = f"{type(e).__name__}: {e}".splitlines()[0]
        against = champion_scores.get(champion_version) if champion_version is not None else None
        if isinstance(against, float):
            verdict["champion_score"] = against
            verdict["promoted"] = score >= against + min_delta
            return verdict | {"reason": f"{score:.2f} vs champion {against:.2f} (needs +{min_delta})"}
        verdict["promoted"] = score >= floor
        first = "first model" if champion_version is None else f"champion unloadable ({against})"
        return verdict | {"reason": f"{first}: {score:.2f} {'>=' if verdict['promoted'] else '<'} floor {floor}"}

    verdict = judge(champion and champion.version)
    if not verdict["promoted"]:
        return _record(client, name, verdict, challenger)
    while True:  # compare-and-swap: the champion judged against must still be the champion
        owner = uuid.uuid4().hex
        try:
            _acquire_lease(client, name, owner, lease_timeout_s)
        except TimeoutError as e:
            return _record(client, name, verdict | {"promoted": False, "reason": str(e)}, challenger)
        try:
            current = _version_of(client, name, "champion")
            current_version = current and current.version
            if current_version == verdict["champion"]:
                if current_version is not None:
                    history = champion_history(client, name) + [current_version]
                    client.set_registered_model_tag(name, HISTORY_TAG, json.dumps(history))
                    client.set_registered_model_tag(name, PREVIOUS_CHAMPION_TAG, current_version)
                client.set_registered_model_alias(name, "champion", challenger.version)
                return _record(client, name, verdict, challenger)
        finally:
            _release_lease(client, name, owner)
        # another promotion won meanwhile: judge against its champion, outside the lock (evaluation is long)
        verdict = judge(current_version)
        if not verdict["promoted"]:
            return _record(client, name, verdict, challenger)


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _record(client, name: str, decision: dict, version) -> dict:
    client.set_model_version_tag(name, version.version, "promotion_decision", json.dumps(decision))
    return decision


def champion_history(client, name: str) -> list[str]:
    """The versions `@champion` pointed to before, oldest first (the `champion_history` tag)."""
    tags = client.get_registered_model(name).tags
    if HISTORY_TAG in tags:
        return [str(v) for v in json.loads(tags[HISTORY_TAG])]
    return [tags[PREVIOUS_CHAMPION_TAG]] if tags.get(PREVIOUS_CHAMPION_TAG) else []


# --- the registry lock -----------------------------------------------------------------------------
# A registered model created per lock, because creation is the one conditional write MLflow offers: the
# store refuses a second model of the same name (RESOURCE_ALREADY_EXISTS, also for SQLite's IntegrityError).

_BUSY = {"RESOURCE_ALREADY_EXISTS", "RESOURCE_DOES_NOT_EXIST"}


def _create(client, lock: str, tags: dict[str, str]) -> bool:
    """Create the registered model `lock`: True for the one caller that did, False when it exists."""
    try:
        client.create_registered_model(lock, tags=tags, description="registry lock of xh promotions; see xh.registry")
        return True
    except Exception as e:  # an embedded SQLite store may answer a simultaneous write with "database is locked"
        if getattr(e, "error_code", None) in _BUSY or "database is locked" in str(e):
            return False
        raise


def _read_lock(client, lock: str) -> dict | None:
    try:
        return dict(client.get_registered_model(lock).tags)
    except mlflow.exceptions.MlflowException as e:
        if e.error_code == "RESOURCE_DOES_NOT_EXIST":
            return None
        raise


def _expired(held: dict) -> bool:
    try:
        return float(held.get("expires", 0)) < time.time()
    except ValueError:
        return True


def _delete(client, lock: str) -> None:
    try:
        client.delete_registered_model(lock)
    except mlflow.exceptions.MlflowException as e:
        if e.error_code != "RESOURCE_DOES_NOT_EXIST":
            raise


def _break(client, lock: str, dead_owner: str) -> None:
    """Remove the expired lock of `dead_owner`. Of all processes that found it expired, only the one that
    creates its break marker removes it, and only while it still is `dead_owner`'s: a later holder's lock is
    never removed by a slow breaker. A marker left by a breaker that died expires too."""
    marker = f"{lock}.broken-{dead_owner}"
    if not _create(client, marker, {"expires": str(time.time() + LEASE_TTL_S)}):
        left = _read_lock(client, marker)
        if left is not None and _expired(left):
            _delete(client, marker)
        return
    try:
        held = _read_lock(client, lock)
        if held is not None and held.get("owner") == dead_owner and _expired(held):
            _delete(client, lock)
    finally:
        _delete(client, marker)


def _acquire_lease(client, name: str, owner: str, timeout_s: float) -> None:
    """Hold `name`'s registry lock as `owner`, waiting up to `timeout_s` for its holder (TimeoutError)."""
    lock = name + LOCK_SUFFIX
    deadline = time.monotonic() + timeout_s
    while True:
        if _create(client, lock, {"owner": owner, "expires": str(time.time() + LEASE_TTL_S), "model": name}):
            return
        held = _read_lock(client, lock)
        if held is not None and _expired(held):
            _break(client, lock, held.get("owner", ""))
            continue
        if time.monotonic() > deadline:
            holder = (held or {}).get("owner", "?")
            raise TimeoutError(
                f"another promotion ({holder}) holds {name}'s registry lock (the registered model {lock}); "
                "try again later"
            )
        time.sleep(LOCK_POLL_S * (1 + random.random()))


def _release_lease(client, name: str, owner: str) -> None:
    lock = name + LOCK_SUFFIX
    held = _read_lock(client, lock)
    if held is not None and held.get("owner") == owner:
        _delete(client, lock)


def version_loads(name: str, version: str) -> str | None:
    """None when the registered version's model loads (`load_registered`), else why not (one line)."""
    try:
        load_registered(name, version)
    except Exception as e:
        return f"{type(e).__name__}: {e}".splitlines()[0]
    return None


def rollback(name: str) -> dict:
    """Give `@champion` back to the version it replaced (the last of `champion_history`), if that one loads."""
    client = mlflow.MlflowClient()
    history = champion_history(client, name)
    if not history:
        raise ConfigError(f"{name} has no previous champion to roll back to")
    previous = history[-1]
    problem = version_loads(name, previous)
    if problem is not None:
        raise ConfigError(f"{name} version {previous} does not load, @champion left as it is: {problem}")
    owner = uuid.uuid4().hex
    _acquire_lease(client, name, owner, LEASE_TTL_S)
    try:
        history = champion_history(client, name)
        if not history or history[-1] != previous:
            raise ConfigError(f"{name}'s champion history changed during the rollback; run it again")
        current = _version_of(client, name, "champion")
        client.set_registered_model_alias(name, "champion", previous)
        client.set_registered_model_tag(name, HISTORY_TAG, json.dumps(history[:-1]))
        if len(history) > 1:
            client.set_registered_model_tag(name, PREVIOUS_CHAMPION_TAG, history[-2])
        else:
            client.delete_registered_model_tag(name, PREVIOUS_CHAMPION_TAG)
    finally:
        _release_lease(client, name, owner)
    return {"model": name, "champion": previous, "rolled_back_from": current and current.version}
