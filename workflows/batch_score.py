"""Batch scoring: new questions -> retrieval -> evidence graphs -> the champion model -> predictions.

    xh score --set score.input=s3://bucket/incoming/2026-11-22/ --set score.model=models:/xh-hotpot@champion
    python -m workflows.batch_score --config configs/demo.yaml

Three Ray Data stages, each written under a staging folder before the next starts, so a failed run
re-run for the same date and model resumes after the last finished stage:

    parse      question files (JSON lines or Parquet) -> rows; bad records -> quarantine with the reason
    graphs     an actor pool: each actor loads the BM25 index, entity linker and link graph once,
               retrieves candidates for a batch and builds its graphs (`xh.graph.hotpot`)
    inference  an actor pool: each actor loads the model version once (one GPU each when there are GPUs)

`score.model` (e.g. `models:/xh-hotpot@champion`) is resolved to one version when the run starts, so
every row of a run comes from the same model. Predictions land in
`<output>/run_date=D/model=NAME/version=V/`; a re-run for the same date and model replaces that
partition. The driver never holds the data: it only lists files and moves finished ones.
"""

from __future__ import annotations

import datetime as dt
import json
import time

import pyarrow as pa
import pyarrow.parquet as pq

from workflows.common import init_ray, log, main, s3_settings
from xh import schemas
from xh.config import ConfigError, XHConfig
from xh.retrieval.index import corpus_snapshot
from xh.storage import join, list_files, open_input, resolve

DONE = "_SUCCESS"


# --- the model version -----------------------------------------------------------------------------


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
    import mlflow

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


# --- stage 1: parse ------------------------------------------------------------------------------

PARSED = pa.schema(
    [
        pa.field("qid", pa.string()),
        pa.field("question", pa.string()),
        pa.field("type", pa.string()),
        pa.field("source", pa.string()),
        pa.field("position", pa.int64()),
        pa.field("reason", pa.string()),  # null: a good row
        pa.field("raw", pa.string()),
    ]
)


def _records(path: str, data: bytes):
    """(position, record or None, reason) per record of one file."""
    if path.endswith(".parquet"):
        try:
            records = pq.read_table(pa.BufferReader(data)).to_pylist()
        except (pa.ArrowException, OSError) as e:  # a file that is not Parquet: one quarantine row for it
            yield -1, f"<{len(data)} bytes>", f"unreadable Parquet file: {e}"
            return
        for i, record in enumerate(records):
            yield i, record, None
        return
    for i, line in enumerate(data.decode("utf-8", errors="replace").splitlines()):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            yield i, line, f"not JSON: {e.msg}"
            continue
        yield i, record, None if isinstance(record, dict) else "not a JSON object"


def parse_files(batch: dict) -> pa.Table:
    """Ray Data: a batch of whole files -> one PARSED row per record."""
    rows = []
    for path, data in zip(batch["path"], batch["bytes"]):
        for position, record, reason in _records(str(path), bytes(data)):
            row = {"source": str(path), "position": position, "reason": reason, "qid": None, "question": None,
                   "type": None, "raw": json.dumps(record, default=str)[: schemas.RAW_LIMIT] if not isinstance(record, str) else record[: schemas.RAW_LIMIT]}  # fmt: skip
            if reason is None:
                qid = record.get("qid", record.get("_id", record.get("id")))
                question = record.get("question", record.get("claim"))
                if qid is None or str(qid).strip() == "":
                    row["reason"] = "missing qid"
                elif not isinstance(question, str) or not question.strip():
                    row["reason"] = "empty question"
                else:
                    row |= {"qid": str(qid), "question": question.strip(), "type": record.get("type")}
            rows.append(row)
    return pa.Table.from_pylist(rows, schema=PARSED)


# --- stage 2: retrieval and graphs -----------------------------------------------------------------

STAGED_GRAPHS = pa.schema(
    [pa.field("qid", pa.string()), pa.field("question", pa.string()), pa.field("graph", pa.string()),
     pa.field("reason", pa.string())]  # fmt: skip
)


class _GraphActor:
    """Loads the retriever once; per batch: candidates, then graphs (a question without one keeps its reason)."""

    def __init__(self, index_uri: str, tables_uri: str, retrieval_settings, graph_settings, classifier_dir, s3):
        from xh.retrieval.candidates import Retriever

        self.retriever = Retriever.load(index_uri, tables_uri, retrieval_settings, s3)
        self.tables_uri, self.graph_settings, self.s3 = tables_uri, graph_settings, s3
        self.classifier = None
        if classifier_dir:  # new questions come without a type: bridge or comparison decides the graph
            from xh.model.qtype import QuestionTypeClassifier

            self.classifier = QuestionTypeClassifier.load(classifier_dir).predict

    def __call__(self, batch: pa.Table) -> pa.Table:
        from xh.graph.hotpot import HotpotGraphBuilder

        questions = [{"qid": q, "question": text, "type": t} for q, text, t in
                     zip(*(batch[c].to_pylist() for c in ("qid", "question", "type")))]  # fmt: skip
        by_qid: dict[str, list[dict]] = {}
        for row in self.retriever.candidates([q["qid"] for q in questions], [q["question"] for q in questions]):
            by_qid.setdefault(row["qid"], []).append(row)
        doc_ids = {row["doc_id"] for rows in by_qid.values() for row in rows}
        builder = HotpotGraphBuilder.load(self.tables_uri, doc_ids, self.graph_settings, self.s3, self.classifier)
        out = []
        for q, outcome in zip(questions, builder.build_many(questions, by_qid)):
            graph = json.dumps(outcome.graph, default=str) if outcome.graph is not None else None
            out.append({"qid": q["qid"], "question": q["question"], "graph": graph, "reason": outcome.reason})
        return pa.Table.from_pylist(out, schema=STAGED_GRAPHS)


# --- stage 3: inference ----------------------------------------------------------------------------


class _InferenceActor:
    """Loads one registered model version once; graphs in, PREDICTIONS rows out."""

    def __init__(self, model: dict, corpus_snapshot: str, scored_at: dt.datetime, batch_graphs: int,
                 threads: int | None, mlflow_cfg, s3):  # fmt: skip
        import mlflow
        import torch

        from xh.tracking import configure

        if threads:
            torch.set_num_threads(threads)

        configure(mlflow_cfg, s3)
        self.model = mlflow.pyfunc.load_model(f"models:/{model['name']}/{model['version']}")
        self.meta = {"model_name": model["name"], "model_version": model["version"], "run_id": model["run_id"],
                     "corpus_snapshot": corpus_snapshot, "scored_at": scored_at}  # fmt: skip
        self.batch_graphs = batch_graphs

    def __call__(self, batch: pa.Table) -> pa.Table:
        frame = batch.select(["qid", "question", "graph"]).to_pandas()
        predictions = self.model.predict(frame, params={"batch_graphs": self.batch_graphs})
        rows = []
        for question, p in zip(frame["question"], predictions.to_dict("records")):
            fever = "label" in p
            facts = json.loads(p["evidence"] if fever else p["supporting_facts"])
            rows.append({
                "qid": p["qid"], "question": question,
                "answer": p["label"] if fever else p["answer"],
                "answer_doc_id": None if fever else p.get("answer_doc_id"),
                "answer_title": None if fever else p.get("answer_title"),
                "answer_type": None if fever else p.get("answer_type"),
                "supporting_facts": [{"title": t, "sent": int(s)} for t, s in facts],
                "score": float(json.loads(p["label_probs"])[p["label"]] if fever else p["node_score"]),
            } | self.meta)  # fmt: skip
        return pa.Table.from_pylist(rows, schema=schemas.PREDICTIONS)


# --- the run ---------------------------------------------------------------------------------------


def _paths(cfg: XHConfig, model: dict, run_date: str) -> dict[str, str]:
    root = cfg.storage.root
    output = cfg.score.output or join(root, "predictions")
    partition = join(output, f"run_date={run_date}", f"model={model['name']}", f"version={model['version']}")
    staging = join(output, "_staging", f"{run_date}-{model['name']}-v{model['version']}")
    return {
        "index": cfg.retrieve.index or join(root, "index", "bm25"),
        "tables": cfg.retrieve.tables or join(root, "tables"),
        "partition": partition,
        "staging": staging,
        "quarantine": join(output, "quarantine", f"run_date={run_date}", f"model={model['name']}",
                           f"version={model['version']}"),  # fmt: skip
    }


def _done(uri: str, s3) -> bool:
    fs, path = resolve(join(uri, DONE), s3)
    return fs.get_file_info(path).type.name != "NotFound"


def _write_stage(ds, uri: str, s3) -> None:
    """Write a stage's output and mark it finished (a half-written stage is cleared before a retry)."""
    fs, path = resolve(uri, s3)
    fs.create_dir(path, recursive=True)
    fs.delete_dir_contents(path)
    ds.write_parquet(path, filesystem=fs, ray_remote_args={"num_cpus": 0.25})
    with fs.open_output_stream(f"{path}/{DONE}", compression=None) as out:
        out.write(b"")


def _replace_partition(staged: str, target: str, s3) -> int:
    """Move the staged Parquet files into the partition, replacing what an earlier run left there."""
    fs, src = resolve(staged, s3)
    _, dst = resolve(target, s3)
    fs.create_dir(dst, recursive=True)
    fs.delete_dir_contents(dst)
    files = [f for f in list_files(staged, s3, suffix=".parquet")]
    for f in files:
        path = resolve(f, s3)[1]
        fs.move(path, f"{dst}/{path.rsplit('/', 1)[1]}")
    return len(files)


def _count(uri: str, s3, where: str | None = None) -> int:
    import pyarrow.dataset as pads

    fs, path = resolve(uri, s3)
    dataset = pads.dataset(path, filesystem=fs, format="parquet", exclude_invalid_files=True)
    return dataset.count_rows(filter=pads.field(where).is_valid() if where else None)


def run(cfg: XHConfig) -> dict:
    import ray
    import ray.data
    from ray.data import ActorPoolStrategy
    from ray.data.expressions import col

    from xh.tracking import absolute_tracking
    from xh.tracking import configure, stage_run

    s3 = s3_settings(cfg)
    cfg = absolute_tracking(cfg)
    sc = cfg.score
    parse_model_uri(sc.model)  # a malformed URI is a one-line error before anything starts
    if not sc.input:
        raise FileNotFoundError("no input given: set score.input (questions as JSON lines or Parquet)")
    inputs = list_files(sc.input, s3)
    inputs = [f for f in inputs if f.endswith((".jsonl", ".json", ".parquet", ".jsonl.gz", ".jsonl.bz2"))]
    if not inputs:
        raise FileNotFoundError(f"no .jsonl or .parquet question files at {sc.input}")
    configure(cfg.mlflow, s3)
    model = resolve_model(sc.model)
    run_date = (sc.run_date or dt.datetime.now(dt.timezone.utc).date()).isoformat()
    paths = _paths(cfg, model, run_date)
    snapshot = corpus_snapshot(paths["index"], s3)
    init_ray(cfg)
    use_gpu = sc.use_gpu if sc.use_gpu is not None else ray.cluster_resources().get("GPU", 0) > 0
    seconds: dict[str, float] = {}
    log("score", f"model {model['name']} v{model['version']}, {len(inputs)} input file(s), run date {run_date}")

    with stage_run(cfg, "score", run_name=f"score-{run_date}") as mlflow_run:
        start = time.perf_counter()
        parsed_uri, graphs_uri = join(paths["staging"], "parsed"), join(paths["staging"], "graphs")
        predictions_uri = join(paths["staging"], "predictions")
        resumed = []
        if _done(parsed_uri, s3):
            resumed.append("parse")
        else:
            fs, _ = resolve(inputs[0], s3)
            files = ray.data.read_binary_files([resolve(f, s3)[1] for f in inputs], filesystem=fs, include_paths=True)
            parsed = files.map_batches(parse_files, batch_size=1, batch_format="numpy", num_cpus=0.25)
            _write_stage(parsed, parsed_uri, s3)
        seconds["parse"] = time.perf_counter() - start

        _maybe_fail(sc.fail_before, "graphs")
        start = time.perf_counter()
        if _done(graphs_uri, s3):
            resumed.append("graphs")
        else:
            fs, path = resolve(parsed_uri, s3)
            good = ray.data.read_parquet(path, filesystem=fs, ray_remote_args={"num_cpus": 0.25}).filter(
                expr=col("reason").is_null(), num_cpus=0.25
            ).materialize()  # read before the actor pool holds the CPUs (Ray's file listing wants a whole one)
            # new questions have no answer to require
            settings = cfg.graphs.model_copy(update={"require_answer": False})
            graphs = good.map_batches(
                _GraphActor, batch_size=sc.batch_size, batch_format="pyarrow",
                compute=ActorPoolStrategy(size=sc.workers), num_cpus=sc.cpus_per_worker,
                fn_constructor_args=(paths["index"], paths["tables"], cfg.retrieve, settings,
                                     sc.question_classifier, s3),
            )  # fmt: skip
            _write_stage(graphs, graphs_uri, s3)
        seconds["graphs"] = time.perf_counter() - start

        _maybe_fail(sc.fail_before, "inference")
        start = time.perf_counter()
        fs, path = resolve(graphs_uri, s3)
        built = ray.data.read_parquet(path, filesystem=fs, ray_remote_args={"num_cpus": 0.25}).filter(
            expr=col("graph").is_not_null(), num_cpus=0.25
        ).materialize()  # as above: read first, then the model actors
        predictions = built.map_batches(
            _InferenceActor, batch_size=sc.batch_size, batch_format="pyarrow",
            compute=ActorPoolStrategy(size=sc.inference_workers), num_cpus=sc.inference_cpus,
            num_gpus=1 if use_gpu else 0,
            fn_constructor_args=(model, snapshot, dt.datetime.now(dt.timezone.utc).replace(microsecond=0),
                                 sc.batch_graphs, sc.inference_threads, cfg.mlflow, s3),
        )  # fmt: skip
        _write_stage(predictions, predictions_uri, s3)
        seconds["inference"] = time.perf_counter() - start

        quarantine = _write_quarantine(parsed_uri, graphs_uri, paths["quarantine"], s3)
        files = _replace_partition(predictions_uri, paths["partition"], s3)
        fs, staging = resolve(paths["staging"], s3)
        fs.delete_dir(staging)
        summary = {
            "model": model,
            "run_date": run_date,
            "predictions": _count(paths["partition"], s3),
            "quarantined": quarantine,
            "prediction_files": files,
            "output": paths["partition"],
            "resumed_stages": resumed,
            "seconds": {k: round(v, 3) for k, v in seconds.items()},
            "corpus_snapshot": snapshot,
            "use_gpu": use_gpu,
        }
        summary["records"] = summary["predictions"] + sum(quarantine.values())
        total = sum(seconds.values())
        summary["questions_per_s"] = round(summary["predictions"] / total, 3) if total else None
        import mlflow

        mlflow.log_metrics({"predictions": summary["predictions"], "quarantined": sum(quarantine.values()),
                            **{f"seconds_{k}": v for k, v in seconds.items()}})  # fmt: skip
        mlflow.set_tags({"model_name": model["name"], "model_version": model["version"], "run_date": run_date})
        mlflow.log_dict(summary, "score_summary.json")
        summary["mlflow_run_id"] = mlflow_run.info.run_id
    return summary


class InjectedFailure(RuntimeError):
    """Raised by `score.fail_before` (tests of resumption)."""


def _maybe_fail(fail_before: str | None, stage: str) -> None:
    if fail_before == stage:
        raise InjectedFailure(f"score.fail_before={stage}: stopping before the {stage} stage")


def _write_quarantine(parsed_uri: str, graphs_uri: str, target: str, s3) -> dict[str, int]:
    """Unreadable records and questions without a graph, with reasons, into the run's quarantine partition."""
    import pyarrow.dataset as pads

    fs, dst = resolve(target, s3)
    fs.create_dir(dst, recursive=True)
    fs.delete_dir_contents(dst)
    counts: dict[str, int] = {}
    parts = []
    for uri, columns in ((parsed_uri, ["source", "position", "reason", "raw"]), (graphs_uri, None)):
        _, path = resolve(uri, s3)
        table = pads.dataset(path, filesystem=fs, format="parquet", exclude_invalid_files=True).to_table(
            filter=pads.field("reason").is_valid()
        )
        if columns is None:  # graph failures: the question itself is the record
            table = pa.table({
                "source": pa.array(["graphs"] * table.num_rows, pa.string()),
                "position": pa.array([-1] * table.num_rows, pa.int64()),
                "reason": table["reason"],
                "raw": pa.array([json.dumps({"qid": q, "question": t})[: schemas.RAW_LIMIT]
                                 for q, t in zip(table["qid"].to_pylist(), table["question"].to_pylist())], pa.string()),
            })  # fmt: skip
        else:
            table = table.select(columns)
        for reason in table["reason"].to_pylist():
            counts[reason] = counts.get(reason, 0) + 1
        parts.append(table.cast(schemas.QUARANTINE))
    pq.write_table(pa.concat_tables(parts), f"{dst}/part-00000.parquet", filesystem=fs)
    return counts


if __name__ == "__main__":
    main("batch_score", run)
