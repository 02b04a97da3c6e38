"""Batch scoring: new questions -> retrieval -> evidence graphs -> the champion model -> predictions.

    store = Store.from_config(cfg)
    job = prepare(cfg, store)    # every one-line error before Ray starts; the model version's lock taken
    summary = run(job)           # parse -> graphs -> inference (Ray, joined by the caller) -> publish -> log

`prepare` checks the inputs, the output (not inside another table), the model version and its pipeline,
then takes the version's lock (`xh.storage.partitions.VersionLock`: a second run waits `score.lock_wait_s`, then
is refused in one line), repairs every publish a dead run left under the output (any date, any version)
and chooses the files to score. `run` runs three stages on Ray, each written under the run's staging
folder before the next starts (`xh.storage.tables.Stages`, owned by the run's id), so a failed run re-run for the
same date, model, input files and settings resumes after the last finished stage (staging carries a
fingerprint of them, `xh.storage.tables.fingerprint`: the files' content, by SHA-256 or S3 ETag; other staging
is discarded):

    parse      (Ray Data tasks) question files (JSON lines, JSON arrays or Parquet) -> rows (`xh.inputs.questions`);
               bad records (and records over `score.max_record_bytes` or questions over
               `score.max_question_chars`) -> quarantine with the reason; an id in two files of the
               run: the file last in name order is scored, the other record quarantined
               (`duplicate id: superseded by FILE`), before any graph is built
    graphs     an actor pool: each actor loads the graph half of `xh.pipeline.Pipeline` once (BM25
               index, entity linker, link graph, question-type classifier, and the node's copy of the
               docs and links by id, `xh.graph.docstore`) and builds a block's graphs
    inference  an actor pool: each actor loads the model half (the model version, from the copy the run
               makes once per version under the output, `model_copy`: no MLflow in the actors) once (one
               GPU each when there are GPUs)

The pools are the run's own (`xh.stages.score_actors`), not Ray Data's: a pool's first actor starts with
the run, so the index and the model load while the questions are parsed, the others once the rows to
score are known (as many as the rows fill blocks for); each actor reads its block of the finished stage
and writes the block's file of the next.

then publishes the predictions and the record of the files it scored into
`<output>/run_date=D/model=NAME/version=V/` in one call (`xh.storage.partitions.publish`: a committed manifest
that readers follow), and logs the run to MLflow. The partition holds every input scored for that date
and model: a run adds its rows, replacing those of the qids it scored again; `score.replace=true` makes
the run's predictions the whole partition.

`score.model` (e.g. `models:/xh-hotpot@champion`) is resolved to one version when the run starts, so
every row of a run comes from the same model, and the graphs are built with that version's pipeline
(`version_pipeline`: its retrieval and graph settings, models and index; the config gives resources and
locations; a differing setting is refused unless `score.allow_drift`, and then recorded in each row).
With `score.incremental=true` (the scheduled runs) a run scores only the input files this model version
has not scored with the same content (URI and SHA-256 or S3 ETag; `xh.storage.partitions.scored_inputs`, one
index per version), whatever their run date, and, after a promotion, only those delivered since the
version became champion (the backlog rule, `_watermark`: `score.since`, `score.rescore`); `{run_date}`
in `score.input` becomes the run date. Quarantined rows land in `<output>/quarantine/<partition>/inputs-
<digest of the input file names>/`, one folder per set of inputs. The driver never holds the data: it
only lists files and moves finished ones.
"""

from __future__ import annotations

import atexit
import datetime as dt
import hashlib
import json
import logging
import os
import time
import uuid
from dataclasses import dataclass, field

from xh import schemas
from xh.config import XHConfig
from xh.inputs.questions import InputLimits, question_files
from xh.pipeline import settings_of
from xh.pipeline import version_pipeline as build_version
from xh.registry.versions import parse_model_uri, resolve_model
from xh.retrieval.index import corpus_snapshot
from xh.retrieval.paths import PathScorer
from xh.stages.score_actors import (
    GRAPHS,
    MODEL_COPY,
    PARSED,
    TASK_CPUS,
    GraphActor,
    ModelActor,
    Pools,
    StageWriter,
    ids_in_several_files,
    parse_files,
    supersede,
)
from xh.storage import locations
from xh.storage.partitions import (
    VersionLock,
    partition_of,
    partition_rows,
    plan_merge,
    publish,
    repair,
    scored_inputs,
    scored_versions,
    write_inputs_record,
)
from xh.storage.store import Location, Store
from xh.storage.tables import (
    BATCH_STAGE,
    Stages,
    check_outside_tables,
    content_digest,
    count_rows,
    fingerprint,
    read_marker,
    usable_rows,
    write_quarantine,
)
from xh.tracking import absolute_tracking, configure, log_scoring_lineage, stage_run

log = logging.getLogger("xh.score").info


# what changes where resources change, not the predictions: not part of the staging fingerprint
# (nor `replace`, which decides only how the predictions are published, nor `incremental`, which decides
# which files are inputs)
RESOURCES = {"workers", "cpus_per_worker", "inference_workers", "inference_cpus", "inference_threads", "use_gpu"}


# --- what a run reads and writes -------------------------------------------------------------------


@dataclass(frozen=True)
class Places:
    """Where one run for a date and model version reads and writes (every one a Location of the run's store).
    The places under the predictions root are the stage's own: `xh.storage.locations` gives the root."""

    index: Location
    tables: Location
    output: Location  # the predictions root
    partition: Location  # <output>/run_date=D/model=NAME/version=V
    staging: Location  # the run's stages, resumed by a re-run of the same inputs and settings
    quarantine: Location  # <output>/quarantine/<partition>
    corpus_cache: Location  # DocHopper's paragraph embeddings, per model version (below it: per corpus snapshot)

    @classmethod
    def of(cls, cfg: XHConfig, store: Store, model: dict, run_date: str) -> Places:
        output = store.at(locations.predictions(cfg))
        name, version = model["name"], model["version"]
        return cls(
            index=store.at(locations.index(cfg)),
            tables=store.at(locations.tables(cfg, cfg.retrieve.tables)),
            output=output,
            partition=partition_of(output, run_date, name, version),
            staging=output.join("_staging", f"{run_date}-{name}-v{version}"),
            quarantine=partition_of(output.join("quarantine"), run_date, name, version),
            corpus_cache=output.join("_cache", f"{name}-v{version}"),
        )


def pipeline_copies(cfg: XHConfig, store: Store, model: dict) -> Location:
    """Where the models a version's pipeline record carries are copied for the graph actors to read."""
    return store.at(locations.predictions(cfg), "_pipeline", f"{model['name']}-v{model['version']}")


def _snapshot(cfg: XHConfig, places: Places) -> str:
    """What the predictions were retrieved from: the BM25 index (HotpotQA); FEVER's sentence retrieval
    indexes the docs table itself, so its snapshot is that table's size."""
    if cfg.graphs.task == "fever":
        docs = places.tables.join("docs")
        return f"{docs} docs={count_rows(docs)} retrieval=fever-sentences"
    return corpus_snapshot(places.index)


def _settings(cfg: XHConfig, model: dict, places: Places, snapshot: str) -> dict:
    """What a run's stages depend on besides the input files: staging of other settings is not resumed."""
    retrieval, graph = settings_of(cfg)
    return {
        "score": cfg.score.model_dump(mode="json", exclude={"input", "replace", "incremental", *RESOURCES}),
        "model": model,
        "retrieve": retrieval.model_dump(mode="json"),
        "graphs": graph.model_dump(mode="json"),
        "index": places.index.uri,
        "tables": places.tables.uri,
        "corpus_snapshot": snapshot,
    }


# --- the three stages as Ray Datasets --------------------------------------------------------------


def _parse(inputs: list[str], store: Store, limits: InputLimits):
    """The files' rows, each id scored once: parsed one file a task, then the ids found in several files
    gathered by one task (ids and file names only) and their earlier files' rows quarantined."""
    import ray
    import ray.data
    from ray.data.expressions import col

    files = ray.data.from_items([{"uri": uri} for uri in inputs], override_num_blocks=len(inputs))
    parsed = files.map_batches(
        parse_files, fn_kwargs={"store": store, "limits": limits}, batch_size=1, batch_format="numpy", num_cpus=0.25
    ).materialize()
    if len(inputs) < 2:
        return parsed
    # every task at `TASK_CPUS`: a whole-CPU task finds no node free while the pools load beside the parse
    ids = parsed.filter(expr=col("reason").is_null(), num_cpus=TASK_CPUS).select_columns(
        ["qid", "source"], num_cpus=TASK_CPUS
    )
    winners = ray.get(ray.remote(num_cpus=0.25)(ids_in_several_files).remote(*ids.to_arrow_refs()))
    if not winners:
        return parsed
    return parsed.map_batches(
        supersede, fn_kwargs={"winners": winners}, batch_size=None, batch_format="pyarrow", num_cpus=0.25
    )


def _pools(job: ScoreJob, use_gpu: bool) -> Pools:
    """The run's graph and model pools (`score_actors.Pools`), none of their actors started yet."""
    import ray

    cfg, places, model, sc = job.cfg, job.places, job.model, job.cfg.score
    retrieval, graph = settings_of(cfg)
    pools = Pools(ray.cluster_resources().get("CPU", 1))
    graph_args = {"index": places.index, "tables": places.tables, "retrieval": retrieval, "graph": graph}
    pools.add(
        "graphs",
        GraphActor,
        sc.workers,
        {"num_cpus": sc.cpus_per_worker},
        **graph_args,
        classifier=sc.question_classifier,
    )
    provenance = {
        "model_name": model["name"],
        "model_version": model["version"],
        "run_id": model["run_id"],
        "corpus_snapshot": job.snapshot,
        "scored_at": dt.datetime.now(dt.UTC).replace(microsecond=0),
        "pipeline_drift": json.dumps(job.drift, sort_keys=True) if job.drift else None,
    }
    pools.add(
        "models",
        ModelActor,
        sc.inference_workers,
        model_options(sc, use_gpu),
        files=model_copy(cfg, job.store, model),
        provenance=provenance,
        batch_graphs=sc.batch_graphs,
        block=sc.batch_size,
        threads=sc.inference_threads,
        cache=places.corpus_cache.join(hashlib.sha256(job.snapshot.encode()).hexdigest()[:16]),
    )
    return pools


def model_copy(cfg: XHConfig, store: Store, model: dict) -> Location:
    """The version's saved-model folder, copied from the registry once per version into
    `<output>/_models/NAME-vV/` (its marker, `MODEL_COPY`, written last), from which every model actor loads
    it (`score_actors.local_folder`) without MLflow; taken under the version's lock."""
    import tempfile

    from xh.registry.versions import version_folder

    place = store.at(locations.predictions(cfg), "_models", f"{model['name']}-v{model['version']}")
    marker = place.join(MODEL_COPY)
    if marker.exists() and json.loads(marker.read_bytes()).get("run_id") == model["run_id"]:
        return place
    if place.is_s3:
        with tempfile.TemporaryDirectory(prefix="xh-model-") as dst:
            place.upload(version_folder(model["name"], model["version"], dst))
        folder = "."
    else:  # downloaded in place: one copy of the weights, not two
        path = place.fs_path()[1]
        folder = os.path.relpath(version_folder(model["name"], model["version"], path), path)
    marker.write_bytes(json.dumps(model | {"folder": folder}).encode())
    return place


def model_options(sc, use_gpu: bool) -> dict:
    """How the model actors run: `score.inference_cpus` each, and one GPU each where there are GPUs."""
    return {"num_cpus": sc.inference_cpus, "num_gpus": 1 if use_gpu else 0}


def _start_early(pools: Pools, sc, graphs_done: bool) -> None:
    """Before the parse stage: one graph actor (unless the graphs stage is resumed) and one model actor,
    where the cluster keeps room for the parse stage's tasks; the model actor only where the whole graph
    pool fits beside it (a graph actor waiting for the CPUs an idle model actor holds would never start)."""
    room = pools.cpus - TASK_CPUS
    if not graphs_done:
        pools.start("graphs", 1, room=room)
    if pools.held({"graphs": 0 if graphs_done else sc.workers, "models": 1}) <= room:
        pools.start("models", 1, room=room)


def _stage(pools: Pools, pool: str, source: Location, sc):
    """A stage of `pool`'s actors over the usable rows of the finished stage `source`, as many actors as its
    rows fill blocks for (`Pools.wanted`); with no rows, an empty stage (`xh.storage.tables.write_stage` writes its
    schema), and no actor started for it."""
    rows = usable_rows(source)
    if not rows:
        return StageWriter([], source, sc.batch_size)
    actors = pools.start(pool, pools.wanted(pool, rows, sc.batch_size))
    if pool == "graphs":  # the model actors the rows want, loading now where they fit beside the graph pool
        pools.start("models", pools.wanted("models", rows, sc.batch_size), room=pools.cpus)
    return StageWriter(actors, source, sc.batch_size)


def _write_quarantine(stages: list[Location], root: Location, inputs: list[str], replace: bool) -> dict[str, int]:
    """The run's quarantined rows under `root`, in a folder of their own per set of input files: a
    re-run of the same files replaces its rows, other inputs' rows stay (all go with `replace`)."""
    if replace and root.exists():
        fs, path = root.fs_path()
        fs.delete_dir(path)
    digest = hashlib.sha256(json.dumps(sorted(inputs)).encode()).hexdigest()[:16]
    return write_quarantine(stages, root.join(f"inputs-{digest}"))


# --- before Ray: what the run scores, with which model version -------------------------------------


def dated_input(pattern: str, run_date: str) -> str:
    """`score.input` for one run: `{run_date}` in it becomes the run date (YYYY-MM-DD)."""
    return pattern.replace("{run_date}", run_date)


def _unreadable(parsed: Location) -> set[str]:
    """The input files the parse stage could not read at all (gone since listed): not recorded as scored."""
    import pyarrow.dataset as pads

    fs, path = parsed.fs_path()
    rows = pads.dataset(path, filesystem=fs, format="parquet", exclude_invalid_files=True).to_table(
        columns=["source"], filter=pads.field("reason") == "unreadable file"
    )
    return set(rows["source"].to_pylist())


def _new_inputs(inputs: list[str], sc, places: Places, model: dict) -> tuple[dict[str, str], list[str], list[str]]:
    """({URI: content digest} of the files to score, the files skipped as scored, the files skipped as
    backlog): with `score.incremental` (and not `score.replace`), a file this model version has scored
    with the same content is skipped, and so is one delivered before the watermark (`_watermark`)."""
    store = places.output.store
    if not sc.incremental or sc.replace:
        return {uri: content_digest(store.at(uri)) for uri in inputs}, [], []
    since = None if sc.rescore else _watermark(sc, places, model)
    backlog = [uri for uri in inputs if since is not None and _delivered(store.at(uri)) < since]
    digests = {uri: content_digest(store.at(uri)) for uri in inputs if uri not in backlog}
    scored = scored_inputs(places.output, model["name"], model["version"])
    skipped = [uri for uri, digest in digests.items() if (uri, digest) in scored]
    return {uri: d for uri, d in digests.items() if uri not in skipped}, skipped, backlog


def _watermark(sc, places: Places, model: dict) -> float | None:
    """The backlog rule (docs/scoring.md): `score.since`, or else the time the version became champion once
    another version of the model has scored into the output (what was delivered before was that version's);
    None (no watermark) for the model's first scoring version."""
    if sc.since is not None:
        since = sc.since if sc.since.tzinfo else sc.since.replace(tzinfo=dt.UTC)
        return since.timestamp()
    if not set(scored_versions(places.output, model["name"])) - {model["version"]}:
        return None
    return champion_since(model["name"], model["version"])


def champion_since(name: str, version: str) -> float:
    """When a version became champion: its promotion decision's time, or its registration's (an alias set
    by hand)."""
    import mlflow

    found = mlflow.MlflowClient().get_model_version(name, version)
    decision = json.loads(found.tags.get("promotion_decision", "{}"))
    if decision.get("promoted") and decision.get("decided_at"):
        return dt.datetime.strptime(decision["decided_at"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC).timestamp()
    return found.creation_timestamp / 1000


def _delivered(file: Location) -> float:
    """When a file was delivered: its modification time (an S3 object's LastModified)."""
    fs, path = file.fs_path()
    return fs.get_file_info(path).mtime.timestamp()


def version_pipeline(cfg: XHConfig, model: dict, store: Store) -> tuple[XHConfig, dict]:
    """The config with the version's pipeline (`xh.pipeline.version_pipeline`, the one constructor scoring,
    serving and the pyfunc share; a differing setting is refused unless `score.allow_drift`) and the drift
    opted into. The models copied into the version go to `pipeline_copies` (`<output>/_pipeline/NAME-vV/`),
    where every graph actor reads them."""
    found = build_version(cfg, store, model, pipeline_copies(cfg, store, model), allow_drift=cfg.score.allow_drift)
    for setting, values in found.drift.items():
        log(f"warning: {setting}={values['used']!r}, not the version's {values['version']!r} (score.allow_drift)")
    if found.classifier is None:
        log(f"warning: question types: {found.question_types}")
    return found.cfg, found.drift


@dataclass
class ScoreJob:
    """A run prepared before Ray starts: its config (with the version's pipeline), the model version, the files
    to score ({URI: content digest}), where everything goes, and the model version's lock (held from
    `prepare` to the end of `run`)."""

    cfg: XHConfig
    store: Store
    model: dict
    run_date: str
    drift: dict | None
    places: Places
    snapshot: str
    digests: dict[str, str]
    skipped: list[str]
    lock: VersionLock
    backlog: list[str] = field(default_factory=list)  # delivered before the watermark (the backlog rule)
    repaired: list[str] = field(default_factory=list)  # interrupted publishes of dead runs, finished or undone

    @property
    def run_id(self) -> str:
        return self.lock.record["run_id"]

    def release(self) -> None:
        self.lock.release()


def prepare(cfg: XHConfig, store: Store) -> ScoreJob:
    """Everything a run decides before Ray starts, so that a bad input, path scorer, model URI, output or a
    locked model version is one line and exit 2 with no cluster started: the input files, the model version
    and its pipeline, the places; then the version's lock is taken, every interrupted publish repaired and
    the files to score chosen. The lock is released by `run` (or at exit)."""
    cfg = absolute_tracking(cfg)
    sc = cfg.score
    parse_model_uri(sc.model)  # a malformed URI is a one-line error before anything starts
    if not sc.input:
        raise FileNotFoundError("no input given: set score.input (questions as JSON lines or Parquet)")
    # predictions, staging and quarantine inside another table would be deleted with it (`xh wiki`)
    check_outside_tables(store.at(locations.predictions(cfg)), "score.output")
    run_date = (sc.run_date or dt.datetime.now(dt.UTC).date()).isoformat()
    inputs = question_files(store.at(dated_input(sc.input, run_date)))
    # a broken path scorer file: one line here, before MLflow or Ray, not a traceback from every graph actor
    if cfg.retrieve.path_scorer:
        PathScorer.load(store.at(cfg.retrieve.path_scorer))
    configure(cfg.mlflow, store, registry="score.model")
    model = resolve_model(sc.model)
    given = cfg.retrieve.path_scorer
    cfg, drift = version_pipeline(cfg, model, store)
    if cfg.retrieve.path_scorer and cfg.retrieve.path_scorer != given:
        PathScorer.load(store.at(cfg.retrieve.path_scorer))  # the version's own copy
    places = Places.of(cfg, store, model, run_date)
    snapshot = _snapshot(cfg, places)
    lock = VersionLock.acquire(
        places.output,
        model["name"],
        model["version"],
        uuid.uuid4().hex[:12],
        wait_s=sc.lock_wait_s,
        ttl_s=sc.lock_ttl_s,
        take=sc.take_lock,
    )
    atexit.register(lock.release)  # a driver that stops before `run` (Ray failed to start) frees it too
    try:
        repaired = repair(places.output, lock, ttl_s=sc.lock_ttl_s)
        for line in repaired:
            log(line)
        digests, skipped, backlog = _new_inputs(inputs, sc, places, model)
    except BaseException:
        lock.release()
        raise
    log(
        f"model {model['name']} v{model['version']}, {len(digests)} input file(s)"
        + (f" ({len(skipped)} scored already, skipped)" if skipped else "")
        + (f" ({len(backlog)} delivered before the watermark, skipped: score.rescore)" if backlog else "")
        + f", run date {run_date}, run {lock.record['run_id']}"
    )
    return ScoreJob(cfg, store, model, run_date, drift, places, snapshot, digests, skipped, lock, backlog, repaired)


# --- the run ---------------------------------------------------------------------------------------


@dataclass
class _Started:
    """What a run with files to score sets up before its MLflow run: its stages, and its pools with their first
    actors loading (so that the MLflow run's start overlaps their loading)."""

    stages: Stages
    pools: Pools
    use_gpu: bool


def _start(job: ScoreJob) -> _Started:
    """The run's stages (staging of other inputs or settings discarded) and pools, their first actors started
    (`_start_early`): the model version's copy is made first (`model_copy`), which they load."""
    import ray

    cfg, places, sc = job.cfg, job.places, job.cfg.score
    use_gpu = sc.use_gpu if sc.use_gpu is not None else ray.cluster_resources().get("GPU", 0) > 0
    files = [job.store.at(uri) for uri in job.digests]
    digest = fingerprint(_settings(cfg, job.model, places, job.snapshot), files, job.digests)
    stages = Stages(places.staging, fingerprint=digest, run_id=job.run_id)
    if stages.discarded:
        log("staging of a run with other inputs or settings discarded")
    pools = _pools(job, use_gpu)
    try:
        graphs_done = (read_marker(places.staging.join("graphs")) or {}).get("kind") == BATCH_STAGE
        _start_early(pools, sc, graphs_done=graphs_done)
    except BaseException:
        pools.stop()
        raise
    return _Started(stages, pools, use_gpu)


def _score(job: ScoreJob, started: _Started, mlflow_run_id: str) -> dict:
    """The stages over the job's files and the publish of their rows (and record) into the partition."""
    cfg, places = job.cfg, job.places
    sc, inputs = cfg.score, list(job.digests)
    stages, pools = started.stages, started.pools
    limits = InputLimits(question_chars=sc.max_question_chars, record_bytes=sc.max_record_bytes)
    try:
        parsed = stages.run("parse", lambda: _parse(inputs, job.store, limits), schema=PARSED)
        graphs = stages.run("graphs", lambda: _stage(pools, "graphs", parsed, sc), schema=GRAPHS)
        pools.stop("graphs")
        # never resumed: a run that failed while moving its predictions left that stage incomplete
        predictions = stages.run(
            "inference", lambda: _stage(pools, "models", graphs, sc), resume=False, schema=schemas.PREDICTIONS
        )
        quarantine = _write_quarantine([parsed, graphs], places.quarantine, inputs, sc.replace)
        published = _publish(job, pools, predictions, _unreadable(parsed), mlflow_run_id)
    finally:
        pools.stop()
    stages.clear()
    return {
        "predictions": published["rows"],  # this run's
        "replaced_rows": published["replaced"],  # earlier rows of the qids scored again (all with score.replace)
        "quarantined": quarantine,
        "prediction_files": published["files"],
        "resumed_stages": stages.resumed,
        "staging_discarded": stages.discarded,
        "seconds": {k: round(v, 3) for k, v in stages.seconds.items()},
        "use_gpu": started.use_gpu,
    }


def _publish(job: ScoreJob, pools: Pools, predictions: Location, unreadable: set[str], mlflow_run_id: str) -> dict:
    """The run's predictions and its record of the files it scored into the partition, in one publish
    under the version's lock (`xh.storage.partitions.publish`); the merge is planned in a warm model actor."""
    places, sc = job.places, job.cfg.score
    record = places.staging.join("inputs.json")
    scored = {u: d for u, d in job.digests.items() if u not in unreadable}
    write_inputs_record(record, scored, mlflow_run_id=mlflow_run_id, run=job.run_id, model=job.model)
    kept = places.staging.join("kept")
    plan = pools.call(plan_merge, predictions, places.partition, kept, mlflow_run_id, sc.replace, record)
    start = time.perf_counter()
    log(f"publish: start, {plan['rows']} rows into {places.partition.uri}")
    files = publish(plan, places.partition, job.lock, inputs=scored, run=job.run_id, mlflow_run_id=mlflow_run_id)
    log(f"publish: end, {files} files moved in, {plan['replaced']} rows replaced, {time.perf_counter() - start:.1f} s")
    return plan | {"files": files}


def _nothing_new(job: ScoreJob) -> dict:
    """What a run whose every input file was scored already reports: no stage ran, nothing was published."""
    return {
        "predictions": 0,
        "replaced_rows": 0,
        "quarantined": {},
        "prediction_files": 0,
        "resumed_stages": [],
        "staging_discarded": False,
        "seconds": {},
        "use_gpu": None,
    }


def run(job: ScoreJob) -> dict:
    """The run `prepare` planned, as one MLflow run; Ray is joined by the caller when there are files to
    score. The version's lock is released at the end, whatever happens."""
    try:
        return _run(job)
    finally:
        job.release()


def _run(job: ScoreJob) -> dict:
    started = _start(job) if job.digests else None
    try:
        return _tracked(job, started)
    finally:
        if started is not None:
            started.pools.stop()  # a run stopped before its stages (the MLflow run failed to start)


def _tracked(job: ScoreJob, started: _Started | None) -> dict:
    model, run_date, places = job.model, job.run_date, job.places
    with stage_run(job.cfg, "score", run_name=f"score-{run_date}") as mlflow_run:
        if started is not None:
            done = _score(job, started, mlflow_run.info.run_id)
        else:
            log("every input file was scored already by this model version: nothing to score")
            done = _nothing_new(job)
        summary = {
            "model": model,
            "run_date": run_date,
            **done,
            "scored_files": len(job.digests),
            "skipped_files": len(job.skipped),  # scored already by this model version (score.incremental)
            "backlog_files": len(job.backlog),  # delivered before the watermark (score.rescore scores them)
            "repaired_publishes": job.repaired,
            "partition_rows": partition_rows(places.partition),  # every input's scored for the date and model
            "output": places.partition.uri,
            "corpus_snapshot": job.snapshot,
            "pipeline": "version",
            "pipeline_drift": job.drift or {},
            "run": job.run_id,
            # None: untyped questions were scored as bridge questions (each graph's question_type_source "default")
            "question_classifier": job.cfg.score.question_classifier,
        }
        summary["records"] = summary["predictions"] + sum(summary["quarantined"].values())
        total = sum(summary["seconds"].values())
        summary["questions_per_s"] = round(summary["predictions"] / total, 3) if total else None
        _log_run(job, summary)
        # the inputs and the partition, as MLflow datasets
        log_scoring_lineage(job.digests, places.partition, summary["partition_rows"])
        summary["mlflow_run_id"] = mlflow_run.info.run_id
    return summary


def _log_run(job: ScoreJob, summary: dict) -> None:
    import mlflow

    mlflow.log_metrics(
        {
            "predictions": summary["predictions"],
            "partition_rows": summary["partition_rows"],
            "quarantined": sum(summary["quarantined"].values()),
            "skipped_files": len(job.skipped),
            "backlog_files": len(job.backlog),
            **{f"seconds_{k}": v for k, v in summary["seconds"].items()},
        }
    )
    mlflow.set_tags(
        {
            "model_name": job.model["name"],
            "model_version": job.model["version"],
            "run_date": job.run_date,
            "pipeline": summary["pipeline"],
            # the settings the user opted to change from the version's (score.allow_drift)
            "pipeline_drift": json.dumps(job.drift, sort_keys=True) if job.drift else "none",
        }
    )
    mlflow.log_dict(summary, "score_summary.json")
