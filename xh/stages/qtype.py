"""The question-type classifier as a stage (`xh qtype`): bridge or comparison, from the question text alone.

New questions come without a type; scoring and serving ask this classifier (`score.question_classifier`,
`serve.question_classifier`). It is trained on the questions outside the held-out split (by qid hash, as
training's `train.dev_fraction`: `xh.train.split.in_dev_split`) and measured on the held-out ones, which it
never sees. A record without a question or a known type is quarantined with its reason: the summary counts
them, and `<output>/quarantine.jsonl` holds them.
"""

from __future__ import annotations

import json
import tempfile

from xh.config import XHConfig
from xh.storage import locations
from xh.storage.store import Location, Store


def questions_of(cfg: XHConfig, store: Store) -> Location:
    """The typed questions: `qtype.questions`, or the generated world's."""
    return (
        store.at(cfg.qtype.questions)
        if cfg.qtype.questions
        else store.at(locations.world(cfg), "hotpot", "questions.json")
    )


def output_of(cfg: XHConfig, store: Store) -> Location:
    """Where the classifier goes: `qtype.output`, or `<storage.root>/models/question_type`."""
    return store.at(cfg.qtype.output or locations.models(cfg, "question_type"))


def run(cfg: XHConfig, store: Store) -> dict:
    from xh.model.qtype import QuestionTypeClassifier, evaluate, labelled_questions
    from xh.storage.jsonfiles import read_json
    from xh.train.split import in_dev_split

    q = cfg.qtype
    source = questions_of(cfg, store)
    rows, quarantined = labelled_questions(read_json(source), source.uri)
    split = {held: [r for r in rows if in_dev_split(r["key"], q.dev_fraction) == held] for held in (0, 1)}
    classifier = QuestionTypeClassifier.train(
        [r["question"] for r in split[0]], [r["type"] for r in split[0]], q.backbone or cfg.model.backbone, seed=q.seed
    )
    output = output_of(cfg, store)
    if output.is_s3:  # the classifier writes a local folder
        with tempfile.TemporaryDirectory(prefix="xh-qtype-") as folder:
            classifier.save(folder)
            output.upload(folder)
    else:
        classifier.save(output.fs_path()[1])
    output.join("quarantine.jsonl").write_bytes("".join(json.dumps(r) + "\n" for r in quarantined).encode())
    report = evaluate(classifier, [r["question"] for r in split[1]], [r["type"] for r in split[1]])
    path = output.uri if output.is_s3 else output.fs_path()[1]  # absolute: actors may run elsewhere
    return {
        "held_out_accuracy": report["accuracy"],
        "train_questions": len(split[0]),
        "quarantined": len(quarantined),
        "path": path,
    }
