"""The registered pyfunc row by row (`xh.pyfunc_entry`), on a saved tiny model with prebuilt graphs and a
version folder's pipeline record: one bad row fails only itself (a graph that is not JSON, of the wrong
shape, a lone surrogate in a question, a claim to a HotpotQA version, a row with both a question and a
claim, a question over the length limit), a call over the row limit is refused, and each answer says
which question type it was answered as."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from mlflow.exceptions import MlflowException

from tests.unit.model.test_variants import graph_rows
from xh.config import load_config
from xh.model.xh import XHModel
from xh.pyfunc_entry import MAX_QUESTION_CHARS, MAX_ROWS, XHVersionModel, version_graph_half
from xh.registry.pyfunc import graph_input


@pytest.fixture(scope="module")
def version(tiny_backbone, tmp_path_factory) -> XHVersionModel:
    """A version's data folder: a saved tiny model and a HotpotQA pipeline record (no index needed to
    refuse a row before retrieval)."""
    folder = tmp_path_factory.mktemp("version") / "model"
    cfg = load_config(None, [f"model.backbone={tiny_backbone}", "model.max_node_tokens=64"])
    XHModel.from_backbone(cfg.model).save_pretrained(folder)
    (folder / "pipeline").mkdir()
    record = {"format": "xh-pipeline/1", "retrieve": {}, "graphs": {"task": "hotpot"}, "models": {}, "index": None}
    (folder / "pipeline" / "pipeline.json").write_text(json.dumps(record))
    return XHVersionModel(str(folder))


def _rows(frame: pd.DataFrame) -> list[dict]:
    return frame.to_dict("records")


def test_a_bad_graph_row_fails_only_itself_with_its_reason(version):
    good, other = graph_rows("hyperlink")
    frame = graph_input([good, other])
    frame.loc[1, "graph"] = "{not json"
    wrong = graph_input([good]).assign(qid="w", graph=json.dumps({"nodes": "x", "edges": 3}))
    rows = _rows(version.predict(pd.concat([frame, wrong], ignore_index=True)))
    assert [r["id"] for r in rows] == [good["qid"], other["qid"], "w"]
    assert rows[0]["reason"] is None and rows[0]["answer"] is not None
    assert rows[1]["reason"].startswith("invalid graph: not JSON") and rows[1].get("answer") is None
    assert rows[2]["reason"].startswith("invalid graph: ") and rows[2].get("answer") is None


def test_the_answer_row_says_which_question_type_it_was_answered_as(version):
    (good, _) = graph_rows("hyperlink")
    (row,) = _rows(version.predict(graph_input([good | {"question_type_source": "default"}])))
    assert row["question_type"] == good["question_type"] and row["question_type_source"] == "default"


def test_raw_rows_refused_before_retrieval_each_with_their_reason(version):
    # a list of rows, as `{"inputs": [...]}` holds them: a frame's Arrow strings cannot hold a lone surrogate
    asked = [
        {"id": "claim", "claim": "A claim."},
        {"id": "both", "question": "Who?", "claim": "A claim."},
        {"id": "long", "question": "x" * (MAX_QUESTION_CHARS + 1)},
        {"id": "lone", "question": "Who is \ud800?"},
    ]
    rows = {r["id"]: r for r in _rows(version.predict(asked))}
    assert rows["claim"]["reason"] == "a claim to a HotpotQA version: it answers questions (give `question`)"
    assert rows["both"]["reason"] == "both a question and a claim: give one"
    assert rows["long"]["reason"] == f"question too long: {MAX_QUESTION_CHARS + 1} characters (limit 2000)"
    assert rows["lone"]["reason"] == "non-utf8 text"


def test_a_call_over_the_row_limit_is_refused(version):
    asked = pd.DataFrame({"id": [str(i) for i in range(MAX_ROWS + 1)], "question": ["Who?"] * (MAX_ROWS + 1)})
    with pytest.raises(MlflowException, match=f"^{MAX_ROWS + 1} rows, more than {MAX_ROWS} a call$"):
        version.predict(asked)


def test_xh_index_naming_a_missing_folder_is_one_line_naming_it(version, tmp_path):
    with pytest.raises(ValueError, match=r"^XH_INDEX=.*/nowhere holds no BM25 index \(no manifest.json there\)$"):
        version_graph_half(version.data_path, {"XH_INDEX": str(tmp_path / "nowhere")})
