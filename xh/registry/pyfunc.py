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
