"""The registered pyfunc's input: `predict`'s type hints are what MLflow validates rows against, and the
signature a version is logged with is the one MLflow infers from those hints."""

from __future__ import annotations

from typing import get_type_hints

import pytest
from pydantic import ValidationError

from xh.registry import PyfuncInput, input_columns, pyfunc_signature, takes_graph_rows


def test_the_logged_signature_is_the_one_mlflow_infers_from_predicts_type_hints():
    from mlflow.types.type_hints import _infer_schema_from_list_type_hint

    from xh.pyfunc_entry import XHVersionModel

    hints = get_type_hints(XHVersionModel.predict)
    assert hints["model_input"] == list[PyfuncInput]
    signature = pyfunc_signature()
    assert signature.inputs == _infer_schema_from_list_type_hint(hints["model_input"])
    assert signature._is_signature_from_type_hint  # MLflow leaves validation to predict's type hints
    assert signature.params.to_dict() == [{"name": "batch_graphs", "default": 8, "shape": None, "type": "long"}]


def test_the_signature_takes_graph_rows_as_the_graph_column_signature_did():
    meta = {"signature": pyfunc_signature().to_dict()}
    assert input_columns(meta) == ["claim", "graph", "id", "qid", "question", "type"]
    assert takes_graph_rows(meta)
    old = {
        "signature": {
            "inputs": '[{"type": "string", "name": "qid"}, {"type": "string", "name": "question"}, '
            '{"type": "string", "name": "graph"}]'
        }
    }
    assert takes_graph_rows(old)
    assert not takes_graph_rows({"signature": {"inputs": '[{"type": "string", "name": "text"}]'}})


def test_a_row_needs_an_id_and_a_question_claim_or_graph_and_a_missing_cell_is_none():
    assert PyfuncInput.model_validate({"id": 75397, "claim": "A claim.", "question": float("nan")}).question is None
    assert PyfuncInput.model_validate({"qid": "q1", "graph": "{}"}).graph == "{}"
    for bad, why in [
        ({"question": "Who?"}, "needs an id"),
        ({"id": "q1", "question": "  "}, "needs a `question`"),
        ({"id": "q1", "question": "Who?", "text": "extra"}, "Extra inputs"),
        ({"id": "q1", "question": 3.5}, "valid string"),
    ]:
        with pytest.raises(ValidationError, match=why):
            PyfuncInput.model_validate(bad)
