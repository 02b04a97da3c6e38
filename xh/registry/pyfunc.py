"""What a registered version is to MLflow: its pyfunc's input rows and signature, and the version loaded as a
pyfunc from its data folder (`LoadedVersion`, what `xh.pyfunc_entry` gives MLflow)."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from types import SimpleNamespace

import mlflow
import pandas as pd
from mlflow.models import ModelSignature
from pydantic import BaseModel, ConfigDict, model_validator

INPUT_COLUMNS = ["qid", "question", "graph"]
LOADER_MODULE = "xh.pyfunc_entry"  # MLflow imports it from the installed package; never from the artifact


class PyfuncInput(BaseModel):
    """One row of the registered pyfunc's input (`xh.pyfunc_entry`): an id (`id` or `qid`: text, or a number
    such as FEVER's, read as its text) and a question, a FEVER claim or a prebuilt graph (a GRAPHS row as
    JSON); `type` (bridge or comparison) where known. `xh.pyfunc_entry`'s `predict` takes a list of them (its
    type hints), so each row is validated before anything runs; a frame's missing cell (NaN) counts as none."""

    model_config = ConfigDict(extra="forbid")

    id: str | None = None
    qid: str | None = None
    question: str | None = None
    claim: str | None = None
    type: str | None = None
    graph: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _missing_cells(cls, values):
        if isinstance(values, dict):  # a frame with both question and claim columns has NaN where a row has none
            values = {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in values.items()}
            return {k: _id_text(v) if k in ("id", "qid") else v for k, v in values.items()}
        return values

    @model_validator(mode="after")
    def _answerable(self) -> PyfuncInput:
        if self.id is None and self.qid is None:
            raise ValueError("a row needs an id (`id` or `qid`)")
        if not any(t and t.strip() for t in (self.question, self.claim, self.graph)):
            raise ValueError("a row needs a `question`, a `claim` or a `graph`")
        return self


def _id_text(value):
    """A numeric id (FEVER's, or a frame's integer column) as its text; anything else as it is."""
    if isinstance(value, bool):
        return value
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value) if isinstance(value, (int, float)) or type(value).__module__ == "numpy" else value


def pyfunc_signature() -> ModelSignature:
    """The version's signature: `PyfuncInput`'s fields as optional columns (an id may be text or a number),
    any output, and the `batch_graphs` parameter. Columns, so that MLflow's scoring server and
    `mlflow.pyfunc` check a frame or `{"inputs": [...]}` against them before `predict`'s own validation."""
    from mlflow.types import ColSpec, DataType, ParamSchema, ParamSpec, Schema
    from mlflow.types.schema import AnyType

    ids = ("id", "qid")
    columns = [ColSpec(AnyType() if n in ids else DataType.string, n, required=False) for n in PyfuncInput.model_fields]
    return ModelSignature(
        inputs=Schema(columns),
        outputs=Schema([ColSpec(AnyType())]),
        params=ParamSchema([ParamSpec("batch_graphs", DataType.long, 8)]),
    )


def input_example() -> pd.DataFrame:
    """The example a version is logged with: one raw question."""
    return pd.DataFrame(
        {"id": ["q1"], "question": ["Which magazine was started first, Arthur's Magazine or First for Women?"]}
    )


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
    return names == INPUT_COLUMNS or sorted(names) == sorted(PyfuncInput.model_fields)


class XHPyfunc(mlflow.pyfunc.PythonModel):
    """Questions with their evidence graphs in, answers (or FEVER verdicts) out."""

    def load_context(self, context) -> None:
        from xh.inference import load_model

        self.model, self.tokenizer = load_model(context.artifacts["model"])

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
