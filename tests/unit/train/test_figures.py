"""The hop-attention figure (xh.train.figures): its JSON record, the plot drawn from it, and the script
that turns a bench's JSON into the PNG under docs/img/ (bench/hop_attention.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
from matplotlib.patches import StepPatch

from xh.train.figures import attention_record, plot_hop_attention

ROOT = Path(__file__).resolve().parents[3]


def weights() -> dict[int, dict[str, np.ndarray]]:
    layer = {
        "all": np.array([0.5, 1.0, 1.0, 1.5, 3.0]),
        "all_to_answer": np.array([1.0, 1.5]),
        "supporting_to_answer": np.zeros(0),
        "single_in_edge": np.array([4.0, 4.0]),
    }
    return {0: layer, 1: {k: v * 0.5 for k, v in layer.items()}}


def test_the_record_bins_every_edge_with_one_a_bin_edge_and_counts_the_rest():
    record = json.loads(json.dumps(attention_record(weights(), bins=20)))  # plain JSON
    bins = np.array(record["bins"])
    assert bins[0] == 0 and bins[-1] == 4  # the 99th percentile (about 2.9) rounded up to 4
    assert np.isclose(bins, 1.0).any()  # a uniform share is a bin edge, not the middle of a bin
    first = record["layers"][0]
    assert first["layer"] == 1 and first["single_in_edge"] == 2
    assert first["groups"]["all"]["edges"] == 5 and np.isclose(sum(first["groups"]["all"]["share"]), 1.0)
    # 1 by construction over every in-edge of a set of nodes: not recorded; Supp -> Ans's is
    assert first["groups"]["all"]["mean"] is None and first["groups"]["all_to_answer"]["mean"] is None
    assert first["groups"]["supporting_to_answer"] == {"edges": 0, "mean": None, "share": [0.0] * 20, "above": 0}
    some = weights()
    some[0]["supporting_to_answer"] = np.array([1.5, 2.5])
    assert np.isclose(attention_record(some)["layers"][0]["groups"]["supporting_to_answer"]["mean"], 2.0)


def test_weights_above_the_last_bin_count_in_it():
    many = {0: {"all": np.r_[np.ones(200), 50.0], "all_to_answer": np.zeros(0)}}
    many[0] |= {"supporting_to_answer": np.zeros(0), "single_in_edge": np.zeros(0)}
    record = attention_record(many, bins=10)
    group = record["layers"][0]["groups"]["all"]
    assert record["bins"][-1] == 2 and group["above"] == 1
    assert np.isclose(sum(group["share"]), 1.0) and group["share"][-1] > 0


def test_the_plot_draws_outlines_and_a_line_at_uniform_attention():
    fig = plot_hop_attention(attention_record(weights()))
    axes = fig.get_axes()
    assert [ax.get_title() for ax in axes] == ["Hop layer 1", "Hop layer 2"]
    for ax in axes:
        steps = [p for p in ax.patches if isinstance(p, StepPatch)]
        assert len(steps) == 2  # the two groups with edges; none for the empty one
        assert all(not p.get_fill() and p.get_alpha() in (None, 1.0) for p in steps)  # nothing blended
        dashed = [line for line in ax.get_lines() if line.get_linestyle() == "--"]
        assert [list(line.get_xdata()) for line in dashed] == [[1.0, 1.0]]


def test_the_script_draws_the_png_from_a_bench_json_line(tmp_path):
    line = {"name": "hop_attention", "rows": 2, "hop_attention": attention_record(weights())}
    source = tmp_path / "bench.jsonl"
    source.write_text("{}\n" + json.dumps(line) + "\n")  # a file of JSON lines: the last one is read
    out = tmp_path / "img" / "hop_attention.png"
    script = ROOT / "bench" / "hop_attention.py"
    subprocess.run([sys.executable, str(script), "plot", str(source), "--out", str(out)], check=True, cwd=ROOT)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
