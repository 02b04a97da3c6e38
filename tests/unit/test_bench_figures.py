"""bench/figures.py: the scale and recall figures drawn from the benchmarks' JSON kept under docs/img/."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import figures  # noqa: E402


def test_scale_series_are_per_stage_and_ascending_in_documents():
    records = [json.loads(line) for line in (ROOT / "docs/img/scale.jsonl").read_text().splitlines()]
    series = figures.scale_series(list(reversed(records)))
    sizes = sorted(r["docs"] for r in records)
    assert list(series)[:3] == ["synth", "wiki", "index"]
    for stage in series.values():
        assert [n for n, _ in stage["worker_rss"]] == sizes == [n for n, _ in stage["node_pss"]]
    one = records[0]
    assert (one["docs"], one["stages"]["retrieve"]["worker_peak_mib"]) in series["retrieve"]["worker_rss"]


def test_recall_series_take_bm25_once_and_the_path_scorer_per_seed():
    result = json.loads((ROOT / "docs/img/recall.json").read_text())
    series = figures.recall_series(result)
    seeds = len(result["path_scorer_runs"])
    assert seeds >= 3
    assert dict(series["supp_recall"]["bm25"])[2] == [result["report"]["bm25"]["supp_recall@2"]]
    assert dict(series["supp_recall"]["path_scorer"])[2] == [r["supp_recall@2"] for r in result["path_scorer_runs"]]
    assert [k for k, _ in series["ans_recall"]["bm25"]] == [2, 5, 10, 20]


@pytest.mark.parametrize("figure,source", [("scale", "scale.jsonl"), ("recall", "recall.json")])
def test_the_script_writes_a_png(figure, source, tmp_path):
    png = tmp_path / f"{figure}.png"
    subprocess.run(
        [sys.executable, str(ROOT / "bench/figures.py"), figure, str(ROOT / "docs/img" / source), str(png)], check=True
    )
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
