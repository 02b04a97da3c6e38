"""The registered XH model's pyfunc: the `loader_module` its MLmodel names. It answers questions.

    model = mlflow.pyfunc.load_model("models:/xh-hotpot@champion")
    model.predict(pd.DataFrame({"id": ["q1"], "question": ["Which city hosts ...?"]}))    # raw questions
    model.predict(pd.DataFrame({"id": [75397], "claim": ["Nikolaj Coster-Waldau is Danish."]}))  # FEVER
    model.predict(graph_input(graph_rows))                 # prebuilt graphs (`xh.registry.pyfunc.graph_input`)
    mlflow models serve -m models:/xh-hotpot@champion      # POST {"inputs": [{...}]}

MLflow imports this module from the `xh` package the version's requirements install (a version carries no
code) and calls `_load_pyfunc` with the version's data folder: the saved model and `pipeline/`
(`xh.registry.register.with_pipeline`). `predict` has type hints (`list[PyfuncInput]`), so MLflow validates every
row before it runs.

A raw question (or claim) is answered through the version's own pipeline (`xh.pipeline.version_pipeline`,
the constructor batch scoring and `xh serve` use): its retrieval and graph settings, its copied path scorer
and referenced models, and the index it names, read from a local path or `s3://` with the S3 settings of
the environment (`xh.storage.uris.S3Settings.from_env`). Where the index lives now may be given by `XH_INDEX`
(a moved copy: refused unless its snapshot id is the version's) and `XH_TABLES` (the tables folder;
default: the one the index was built from); a version whose graphs were built without an index (the
distractor setting) needs `XH_INDEX`. `XH_QUESTION_CLASSIFIER` names a question-type classifier where the
version records none (without one, an untyped question is answered as a bridge question, and its row's
`question_type_source` says "default"). The graph half is loaded at the first raw question, so that
prebuilt graphs need no index.

The limits of batch scoring and `xh serve` hold: at most `MAX_ROWS` rows a call (more: the call is
refused), questions of at most `MAX_QUESTION_CHARS` characters. Each input row gives one output row, in
order: the prediction (`xh.model.decode`: HotpotQA answer and supporting facts; FEVER label,
probabilities and evidence as [page id, line]; lists as JSON strings), the question type used, and
`reason`, set where the row got no answer (a question refused, without a graph, or a graph that does
not load): one bad row fails only itself.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import mlflow
import pandas as pd

from xh.registry.pyfunc import LoadedVersion, PyfuncInput, predictions_frame
from xh.registry.register import PIPELINE_DIR

INDEX_VAR = "XH_INDEX"  # where the version's index lives now (a moved copy of the same snapshot)
TABLES_VAR = "XH_TABLES"  # the tables folder the graph half reads docs and links from
CLASSIFIER_VAR = "XH_QUESTION_CLASSIFIER"  # a question-type classifier folder, where the version records none
MAX_ROWS = 64  # as batch scoring's and `xh serve`'s `max_questions`
MAX_QUESTION_CHARS = 2000  # as `score.max_question_chars` and `serve.max_question_chars`


class XHVersionModel(mlflow.pyfunc.PythonModel):
    """A registered version as MLflow serves it: questions, claims or prebuilt graphs in, answers out."""

    def __init__(self, data_path: str):
        self.data_path = data_path
        self.version = LoadedVersion(data_path)  # the model half, on the GPU when there is one
        record = Path(data_path) / PIPELINE_DIR / "pipeline.json"  # `xh.pipeline_record.PIPELINE_FILE`
        self.task = json.loads(record.read_text())["graphs"]["task"] if record.is_file() else None
        self.graph_half = None

    def predict(self, model_input: list[PyfuncInput], params: dict[str, Any] | None = None) -> pd.DataFrame:
        rows = list(model_input)
        if len(rows) > MAX_ROWS:
            from mlflow.exceptions import MlflowException
            from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE

            raise MlflowException(f"{len(rows)} rows, more than {MAX_ROWS} a call", INVALID_PARAMETER_VALUE)
        ids = [str(r.qid if r.qid is not None else r.id) for r in rows]
        graphs, reasons = self._graph_rows(rows, ids)
        asked = [i for i, row in enumerate(rows) if row.graph is None]
        if asked:
            built, refused = self._questions(rows, ids, asked)
            graphs.update(built)
            reasons.update(refused)
        batch_graphs = int((params or {}).get("batch_graphs", 8))
        predicted, failed = _predict_each(self.version, graphs, batch_graphs)
        reasons.update(failed)
        out = []
        for i in range(len(rows)):
            if i in predicted:
                kind = {"question_type": graphs[i].get("question_type"), **_type_source(graphs[i])}
                out.append({"id": ids[i], **predicted[i], **kind, "reason": None})
            else:
                out.append({"id": ids[i], "qid": ids[i], "reason": reasons[i]})
        frame = predictions_frame(out)
        return frame.astype(object).where(frame.notna(), None)  # a missing value is null in JSON, not NaN

    def _graph_rows(self, rows: list, ids: list[str]) -> tuple[dict[int, dict], dict[int, str]]:
        """The prebuilt graphs by input position; a `graph` that is not a JSON object: that row's reason."""
        graphs, reasons = {}, {}
        for i, row in enumerate(rows):
            if row.graph is None:
                continue
            try:
                graph = json.loads(row.graph)
            except ValueError as e:
                reasons[i] = f"invalid graph: not JSON ({e})"
                continue
            if not isinstance(graph, dict):
                reasons[i] = "invalid graph: not a JSON object"
                continue
            graphs[i] = graph | {"qid": ids[i], "question": row.question or graph.get("question")}
        return graphs, reasons

    def _questions(self, rows: list, ids: list[str], asked: list[int]) -> tuple[dict[int, dict], dict[int, str]]:
        """Raw questions (or claims) at positions `asked` -> (their graphs, the reasons of those without one),
        checked as `xh serve` and batch scoring check them (`xh.inputs.questions.question_rows`)."""
        from xh.graph.store import qids_of_quarantine
        from xh.inputs.questions import InputLimits, question_rows

        records = [
            rows[i].model_dump(exclude={"graph", "qid", "id"}, exclude_none=True) | {"id": ids[i]} for i in asked
        ]
        limits = InputLimits(question_chars=MAX_QUESTION_CHARS)
        positions = [i + 1 for i in asked]
        usable, refused = question_rows(records, "request", positions, limits=limits, located=True, task=self.task)
        reasons = {row["position"] - 1: row["reason"] for row in refused}
        if not usable:
            return {}, reasons
        built, quarantined = self._graph_half().graphs(
            [{"qid": q["qid"], "question": q["question"], "type": q["type"]} for q in usable]
        )
        # through JSON, as batch scoring hands graphs from its graph stage to its model stage
        by_qid = {g["qid"]: json.loads(json.dumps(g, default=str)) for g in built}
        why = {qid: q["reason"] for q in quarantined for qid in qids_of_quarantine([q])}
        graphs = {}
        for q in usable:
            i = q["position"] - 1
            if q["qid"] in by_qid:
                graphs[i] = by_qid.pop(q["qid"])
            else:
                reasons[i] = why.get(q["qid"]) or "duplicate id"
        return graphs, reasons

    def _graph_half(self):
        if self.graph_half is None:
            self.graph_half = version_graph_half(self.data_path)
        return self.graph_half


def _type_source(graph: dict) -> dict:
    return {"question_type_source": graph.get("question_type_source")}


def _predict_each(version, graphs: dict[int, dict], batch_graphs: int) -> tuple[dict[int, dict], dict[int, str]]:
    """Predictions by position; the graphs together, and where that fails, each alone (a graph of the wrong
    shape fails only its own row, with the reason)."""
    from xh.inference import predict_graphs

    order = sorted(graphs)
    try:
        found = predict_graphs(version.model, version.tokenizer, [graphs[i] for i in order], batch_graphs=batch_graphs)
        return dict(zip(order, found)), {}
    except Exception:  # noqa: BLE001 (which row: each alone says)
        predicted, failed = {}, {}
        for i in order:
            try:
                predicted[i] = predict_graphs(version.model, version.tokenizer, [graphs[i]], batch_graphs=1)[0]
            except Exception as e:  # noqa: BLE001
                failed[i] = f"invalid graph: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        return predicted, failed


def version_graph_half(data_path: str, env=None):
    """`xh.pipeline.Pipeline`'s graph half of the version whose data folder is `data_path`, built by the one
    constructor (`xh.pipeline.version_pipeline`, no drift allowed) from its `pipeline/` record, with
    `XH_INDEX` / `XH_TABLES` / `XH_QUESTION_CLASSIFIER` of `env` (default: the process environment).
    A one-line ValueError (or `PipelineDrift`) names the variable to set."""
    from xh.config import load_config
    from xh.pipeline import Pipeline, version_pipeline
    from xh.pipeline_record import PIPELINE_FILE, PipelineDrift
    from xh.retrieval.index import index_exists
    from xh.storage.store import Store
    from xh.storage.uris import S3Settings

    env = os.environ if env is None else env
    folder = Path(data_path) / PIPELINE_DIR
    store = Store(s3=S3Settings.from_env(env))
    index = env.get(INDEX_VAR)
    if index and not index_exists(store.at(index)):
        raise ValueError(f"{INDEX_VAR}={index} holds no BM25 index (no manifest.json there)")
    if not (folder / PIPELINE_FILE).is_file():
        raise ValueError(
            "this model version was registered without a pipeline record: it answers prebuilt graphs only "
            "(a `graph` column)"
        )
    record = json.loads((folder / PIPELINE_FILE).read_text())
    if record["graphs"]["task"] != "fever" and not record.get("index") and not index:
        raise ValueError(
            "this model version's graphs were built without an index (the distractor setting): set "
            f"{INDEX_VAR} (and {TABLES_VAR}) to the index to answer questions from"
        )
    given = {"retrieve.index": index, "retrieve.tables": env.get(TABLES_VAR)}
    given["score.question_classifier"] = env.get(CLASSIFIER_VAR)
    cfg = load_config(None, [f"{k}={v}" for k, v in given.items() if v])
    model = {"name": "this version", "version": Path(data_path).name, "run_id": ""}
    try:
        found = version_pipeline(cfg, store, model, store.at(str(folder)), record_folder=str(folder))
    except PipelineDrift as e:  # the pyfunc's own setting, not scoring's
        advice = "(unset it, or point it at a copy of the version's own index)"
        raise PipelineDrift(
            str(e).replace("retrieve.index", INDEX_VAR, 1).split(": the version is scored")[0] + f" {advice}"
        ) from None
    return Pipeline.for_version(found)


def _load_pyfunc(data_path: str) -> XHVersionModel:
    return XHVersionModel(data_path)
