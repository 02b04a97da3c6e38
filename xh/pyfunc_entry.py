"""The registered XH model's pyfunc: the `loader_module` its MLmodel names. It answers questions.

    model = mlflow.pyfunc.load_model("models:/xh-hotpot@champion")
    model.predict(pd.DataFrame({"id": ["q1"], "question": ["Which city hosts ...?"]}))    # raw questions
    model.predict(pd.DataFrame({"id": [75397], "claim": ["Nikolaj Coster-Waldau is Danish."]}))  # FEVER
    model.predict(graph_input(graph_rows))                 # prebuilt graphs (`xh.registry.graph_input`)
    mlflow models serve -m models:/xh-hotpot@champion --env-manager local   # POST {"inputs": [{...}]}

MLflow imports this module from the installed `xh` package (a version carries no code) and calls
`_load_pyfunc` with the version's data folder: the saved model and `pipeline/` (`xh.registry.with_pipeline`).
`predict` has type hints (`list[PyfuncInput]`), so MLflow validates every row before it runs.

A raw question (or claim) is answered through the version's own pipeline (`xh.pipeline_record`): its
retrieval and graph settings, its copied path scorer and referenced models, and the index it names, read
from a local path or `s3://` with the S3 settings of the environment (`xh.storage.S3Settings.from_env`).
Where the index lives now may be given by `XH_INDEX` (a moved copy: refused unless its snapshot id is the
version's) and `XH_TABLES` (the tables folder; default: the one the index was built from); a version whose
graphs were built without an index (the distractor setting) needs `XH_INDEX`. The graph half is loaded at
the first raw question, so that prebuilt graphs need no index.

Each input row gives one output row, in order: the prediction (`xh.model.decode`: HotpotQA answer and
supporting facts; FEVER label, probabilities and evidence as [page id, line]; lists as JSON strings) and
`reason`, set where a question got no graph (then there is no answer).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import mlflow
import pandas as pd

from xh.registry import PIPELINE_DIR, LoadedVersion, PyfuncInput, predictions_frame

INDEX_VAR = "XH_INDEX"  # where the version's index lives now (a moved copy of the same snapshot)
TABLES_VAR = "XH_TABLES"  # the tables folder the graph half reads docs and links from


class XHVersionModel(mlflow.pyfunc.PythonModel):
    """A registered version as MLflow serves it: questions, claims or prebuilt graphs in, answers out."""

    def __init__(self, data_path: str):
        self.data_path = data_path
        self.version = LoadedVersion(data_path)  # the model half, on the GPU when there is one
        self.graph_half = None

    def predict(self, model_input: list[PyfuncInput], params: dict[str, Any] | None = None) -> pd.DataFrame:
        from xh.graph.store import qids_of_quarantine
        from xh.inference import predict_graphs

        rows = list(model_input)
        ids = [str(r.qid if r.qid is not None else r.id) for r in rows]
        graphs: dict[int, dict] = {}  # input position -> its graph row
        reasons: dict[int, str] = {}
        for i, row in enumerate(rows):
            if row.graph is not None:
                graph = json.loads(row.graph)
                graphs[i] = graph | {"qid": ids[i], "question": row.question or graph.get("question")}
        asked = [i for i, row in enumerate(rows) if row.graph is None]
        if asked:
            questions = [
                {"qid": ids[i], "question": rows[i].question or rows[i].claim, "type": rows[i].type} for i in asked
            ]
            built, quarantined = self._graph_half().graphs(questions)
            # through JSON, as batch scoring hands graphs from its graph stage to its model stage
            by_qid = {g["qid"]: json.loads(json.dumps(g, default=str)) for g in built}
            why = {qid: q["reason"] for q in quarantined for qid in qids_of_quarantine([q])}
            for i in asked:
                if ids[i] in by_qid:
                    graphs[i] = by_qid.pop(ids[i])  # a repeated id: only its first row gets the graph
                else:
                    reasons[i] = why.get(ids[i]) or "duplicate id"
        order = sorted(graphs)
        batch_graphs = int((params or {}).get("batch_graphs", 8))
        found = predict_graphs(
            self.version.model, self.version.tokenizer, [graphs[i] for i in order], batch_graphs=batch_graphs
        )
        predicted = dict(zip(order, found))
        out = [
            {"id": ids[i], **predicted[i], "reason": None}
            if i in predicted
            else {"id": ids[i], "qid": ids[i], "reason": reasons[i]}
            for i in range(len(rows))
        ]
        frame = predictions_frame(out)
        return frame.astype(object).where(frame.notna(), None)  # a missing value is null in JSON, not NaN

    def _graph_half(self):
        if self.graph_half is None:
            self.graph_half = version_graph_half(self.data_path)
        return self.graph_half


def version_graph_half(data_path: str, env=None):
    """`xh.pipeline.Pipeline`'s graph half with the pipeline recorded in a version's data folder: its settings
    and models (`xh.pipeline_record.apply_pipeline`, no drift allowed) and its index, or `XH_INDEX` /
    `XH_TABLES` of `env` (default: the process environment). ValueError for a version without a record, or
    one that names no index where none is given."""
    from xh.config import load_config
    from xh.pipeline import Pipeline, settings_of
    from xh.pipeline_record import PIPELINE_FILE, apply_pipeline
    from xh.retrieval.index import read_manifest
    from xh.storage import S3Settings
    from xh.store import Store

    env = os.environ if env is None else env
    folder = Path(data_path) / PIPELINE_DIR
    if not (folder / PIPELINE_FILE).is_file():
        raise ValueError(
            "this model version was registered without a pipeline record: it answers prebuilt graphs only "
            "(a `graph` column)"
        )
    record = json.loads((folder / PIPELINE_FILE).read_text())
    store = Store(s3=S3Settings.from_env(env))
    given = {"retrieve.index": env.get(INDEX_VAR), "retrieve.tables": env.get(TABLES_VAR)}
    cfg = load_config(None, [f"{k}={v}" for k, v in given.items() if v])
    cfg, _ = apply_pipeline(cfg, record, store.at(str(folder)))  # a moved index of another snapshot: PipelineDrift
    index = record.get("index")
    if cfg.graphs.task == "fever":
        # FEVER retrieves sentences from the docs table itself: its reference is `<tables>/docs`
        tables = cfg.retrieve.tables or (index and index["uri"].rstrip("/").removesuffix("/docs"))
        if not tables:
            raise ValueError(f"this FEVER model version names no docs table: set {TABLES_VAR}")
    else:
        if not cfg.retrieve.index:
            raise ValueError(
                "this model version's graphs were built without an index (the distractor setting): set "
                f"{INDEX_VAR} (and {TABLES_VAR}) to the index to answer questions from"
            )
        tables = cfg.retrieve.tables or read_manifest(store.at(cfg.retrieve.index))["docs"]  # the tables it indexed
    retrieval, graph = settings_of(cfg)
    return Pipeline.load(
        index=store.at(cfg.retrieve.index) if cfg.retrieve.index else None,
        tables=store.at(tables),
        retrieval=retrieval,
        graph=graph,
        classifier=cfg.score.question_classifier,
    )


def _load_pyfunc(data_path: str) -> XHVersionModel:
    return XHVersionModel(data_path)
