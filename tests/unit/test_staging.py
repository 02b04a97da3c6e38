"""Staging fingerprints: what a run's stages were written from decides whether a re-run may resume them."""

from __future__ import annotations

import os

import pytest

from workflows.cli import USER_ERRORS
from xh.staging import DONE, FINGERPRINT, Stages, fingerprint
from xh.tables import ForeignFolderError


def _finish(staging, name: str) -> None:
    os.makedirs(staging / name, exist_ok=True)
    (staging / name / DONE).write_text("")


def test_staging_of_the_same_fingerprint_is_resumed_and_staging_of_another_is_discarded(tmp_path):
    staging = tmp_path / "staging"
    first = Stages(str(staging), None, fingerprint="aaa")
    assert not first.discarded
    _finish(staging, "parse")

    same = Stages(str(staging), None, fingerprint="aaa")
    assert not same.discarded and same.run("parse", lambda: None) == str(staging / "parse")
    assert same.resumed == ["parse"]

    other = Stages(str(staging), None, fingerprint="bbb")
    assert other.discarded and not (staging / "parse").exists()


def test_a_folder_without_a_fingerprint_is_never_resumed_nor_deleted(tmp_path):
    staging = tmp_path / "staging"
    _finish(staging, "parse")  # files with no fingerprint: not staging this project wrote
    with pytest.raises(ForeignFolderError) as error:
        Stages(str(staging), None, fingerprint="aaa")
    assert "\n" not in str(error.value) and FINGERPRINT in str(error.value)
    assert isinstance(error.value, USER_ERRORS)  # one line, exit 2
    assert (staging / "parse" / DONE).exists()
    # an empty folder (a run killed before it wrote its fingerprint) is taken
    (staging / "parse" / DONE).unlink()
    (staging / "parse").rmdir()
    Stages(str(staging), None, fingerprint="aaa")
    assert (staging / FINGERPRINT).read_text() == "aaa"


def test_the_fingerprint_changes_with_an_input_file_and_with_the_settings(tmp_path):
    question_file = tmp_path / "q.jsonl"
    question_file.write_text('{"qid": "1", "question": "who?"}\n')
    base = fingerprint([str(question_file)], {"batch_graphs": 8}, None)
    assert fingerprint([str(question_file)], {"batch_graphs": 8}, None) == base
    assert fingerprint([str(question_file)], {"batch_graphs": 4}, None) != base
    question_file.write_text('{"qid": "1", "question": "who was it?"}\n')
    assert fingerprint([str(question_file)], {"batch_graphs": 8}, None) != base
