"""Incremental scoring's inputs: `{run_date}` in `score.input` (the record of scored files:
tests/unit/test_partitions.py)."""

from __future__ import annotations

import pytest

from xh.stages.score import dated_input

pytestmark = pytest.mark.unit


def test_run_date_in_the_input_becomes_the_run_date():
    assert dated_input("s3://b/incoming/{run_date}/", "2026-11-24") == "s3://b/incoming/2026-11-24/"
    assert dated_input("s3://b/incoming/", "2026-11-24") == "s3://b/incoming/"
