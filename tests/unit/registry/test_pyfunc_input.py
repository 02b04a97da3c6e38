"""The registered pyfunc's input: `predict`'s type hints are what validates each row, the signature a version
is logged with names the same fields as columns (public MLflow API only), and importing the loader module
prints nothing."""

from __future__ import annotations

import subprocess
import sys
from typing import get_type_hints

import pytest
from pydantic import ValidationError

from xh.registry.pyfunc import PyfuncInput, input_columns, pyfunc_signature, takes_graph_rows


def test_the_signature_names_predicts_input_fields_as_optional_columns_with_public_api_only():
    from xh.pyfunc_entry import XHVersionModel

    assert get_type_hints(XHVersionModel.predict)["model_input"] == list[PyfuncInput]
    signature = pyfunc_signature()
    assert [c.name for c in signature.inputs.inputs] == list(PyfuncInput.model_fields)
    assert all(not c.required for c in signature.inputs.inputs)
    assert not signature._is_signature_from_type_hint  # MLflow's own flag, never set by us
    assert signature.params.to_dict() == [{"name": "batch_graphs", "default": 8, "shape": None, "type": "long"}]


def test_importing_the_loader_module_prints_no_warning():
    done = subprocess.run(
        [sys.executable, "-W", "always", "-c", "import xh.pyfunc_entry"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "Union type hint" not in done.stderr and "WARNING" not in done.stderr, done.stderr


def test_the_signature_takes_graph_rows_as_the_graph_column_signature_did():
    meta = {"signature": pyfunc_signature().to_dict()}
    assert input_columns(meta) == ["id", "qid", "question", "claim", "type", "graph"]
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
    row = PyfuncInput.model_validate({"id": 75397, "claim": "A claim.", "question": float("nan")})
    assert row.question is None and row.id == "75397"  # FEVER's numeric id, as its text
    assert PyfuncInput.model_validate({"qid": "q1", "graph": "{}"}).graph == "{}"
    for bad, why in [
        ({"question": "Who?"}, "needs an id"),
        ({"id": "q1", "question": "  "}, "needs a `question`"),
        ({"id": "q1", "question": "Who?", "text": "extra"}, "Extra inputs"),
        ({"id": "q1", "question": 3.5}, "valid string"),
    ]:
        with pytest.raises(ValidationError, match=why):
            PyfuncInput.model_validate(bad)
