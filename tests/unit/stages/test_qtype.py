"""The question-type classifier as a stage (`xh qtype`, `xh.stages.qtype`): trained on the questions outside the
held-out split, measured on the held-out ones, saved where scoring and serving load it from."""

from __future__ import annotations

import json
import random

import pytest

from xh.config import load_config
from xh.model.qtype import QuestionTypeClassifier
from xh.stages import qtype
from xh.storage.store import Store
from xh.train.split import in_dev_split

BRIDGE = ["What city was the director of {} born in?", "Which label released the debut album of {}?"]
COMPARISON = ["Who was born first, {} or {}?", "Which is older, {} or {}?"]
NAMES = ["Ada", "Alan", "Grace", "Muse", "Blur", "Oasis", "Heat", "Paris", "Lyon", "Jaws", "Alien", "Berlin"]


def _questions(n: int) -> list[dict]:
    rng = random.Random(3)
    rows = []
    for i in range(n):
        kind = "comparison" if i % 3 == 0 else "bridge"
        a, b = rng.sample(NAMES, 2)
        text = rng.choice(COMPARISON if kind == "comparison" else BRIDGE).format(a, b)
        rows.append({"_id": f"q{i}", "question": text, "type": kind, "answer": a})
    return rows


@pytest.fixture
def world(tmp_path) -> list[dict]:
    """A storage root whose generated world holds typed questions."""
    questions = _questions(120)
    (tmp_path / "world" / "hotpot").mkdir(parents=True)
    (tmp_path / "world" / "hotpot" / "questions.json").write_text(json.dumps(questions))
    return questions


def test_the_stage_trains_outside_the_held_out_split_and_saves_where_score_looks(world, tmp_path, tiny_backbone):
    cfg = load_config(None, [f"storage.root={tmp_path}", f"model.backbone={tiny_backbone}", "qtype.dev_fraction=0.25"])
    summary = qtype.run(cfg, Store.from_config(cfg))
    held = [q for q in world if in_dev_split(q["_id"], 0.25)]
    assert 0 < len(held) < len(world)
    assert summary["train_questions"] == len(world) - len(held)
    assert summary["path"] == str((tmp_path / "models" / "question_type").resolve())  # absolute: for the actors
    loaded = QuestionTypeClassifier.load(summary["path"])
    assert loaded.config.train_questions == summary["train_questions"]
    predicted = loaded.predict([q["question"] for q in held])
    accuracy = sum(p == q["type"] for p, q in zip(predicted, held)) / len(held)
    assert summary["held_out_accuracy"] == pytest.approx(accuracy)


def test_xh_qtype_takes_its_question_file_and_output_as_flags(world, tmp_path, tiny_backbone, capsys):
    from tests.cli import xh

    other = tmp_path / "elsewhere.json"
    other.write_text(json.dumps(world[:60]))
    out = tmp_path / "out" / "classifier"
    args = ["--questions", str(other), "--output", str(out), "--set", f"model.backbone={tiny_backbone}"]
    xh("qtype", *args)
    printed = json.loads(capsys.readouterr().out)
    assert printed["path"] == str(out) and QuestionTypeClassifier.load(out).config.train_questions < 60
    assert printed["train_questions"] == sum(not in_dev_split(q["_id"], 0.2) for q in world[:60])


def test_bad_records_are_quarantined_with_their_reason_and_counted(world, tmp_path, tiny_backbone):
    bad = [{"_id": "b1", "question": "Who?", "type": "multi-hop"}, {"_id": "b2", "type": "bridge"}, "text"]
    (tmp_path / "world" / "hotpot" / "questions.json").write_text(json.dumps(world + bad))
    cfg = load_config(None, [f"storage.root={tmp_path}", f"model.backbone={tiny_backbone}", "qtype.dev_fraction=0.25"])
    summary = qtype.run(cfg, Store.from_config(cfg))
    held = sum(in_dev_split(q["_id"], 0.25) for q in world)
    assert summary["quarantined"] == 3 and summary["train_questions"] == len(world) - held
    lines = (tmp_path / "models" / "question_type" / "quarantine.jsonl").read_text().splitlines()
    reasons = [json.loads(line)["reason"] for line in lines]
    assert reasons == ["unknown type 'multi-hop'", "missing question", "invalid record: not an object"]
    QuestionTypeClassifier.load(summary["path"])  # the quarantine file beside the classifier does not disturb it


def test_a_missing_question_file_is_one_line_and_exit_code_2(tmp_path, capsys):
    from tests.cli import xh

    with pytest.raises(SystemExit) as exited:
        xh("qtype", "--set", f"storage.root={tmp_path}")
    err = capsys.readouterr().err
    assert exited.value.code == 2 and err.startswith("error: ") and err.count("\n") == 1, err
    assert "questions.json" in err
