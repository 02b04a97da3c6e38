"""`bench/gpu_ray.py`, the prepared GPU run, in its CPU form: the same stages, Ray Train runs, promotion
and scoring with tiny backbones, so a device call is never the script's first run."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.integration]

BENCH = Path(__file__).resolve().parents[2] / "bench" / "gpu_ray.py"


def test_the_gpu_run_in_its_cpu_form_trains_through_ray_promotes_and_scores(ray_cluster, tmp_path):
    spec = importlib.util.spec_from_file_location("gpu_ray", BENCH)
    gpu_ray = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_ray)
    runs = ["minilm/tokens/k3", "minilm/graphs/k3"]
    records = gpu_ray.main(
        ["--device", "cpu", "--docs", "300", "--questions", "60", "--runs", *runs, "--work", str(tmp_path)]
    )
    by_name = {r["name"]: r for r in records}
    assert {f"stage/{s}" for s in ("synth", "wiki", "retrieve_paths", "retrieve", "graphs")} <= set(by_name)
    tokens, padded = by_name["train/minilm/tokens/k3"], by_name["train/minilm/graphs/k3"]
    for run in (tokens, padded):
        assert run["epochs"] == 2 and run["steps"] > 0 and run["real_tokens_per_s"] > 0 and run["step_s"] > 0
    # token batches: one encoder shape and more real tokens per computed one than padded batches
    assert tokens["distinct_shapes_per_epoch"] == 1 < padded["distinct_shapes_per_epoch"]
    assert tokens["real_token_fraction"] > padded["real_token_fraction"]
    ratio = by_name["ratio/minilm"]["tokens_over_padded_real_tokens_per_s"]
    assert ratio == pytest.approx(tokens["real_tokens_per_s"] / padded["real_tokens_per_s"], rel=0.01)
    # a tiny model may stay below the promotion floor: then the challenger is what gets scored
    alias = "champion" if by_name["promote"]["promoted"] else "challenger"
    scored = by_name["score"]
    assert scored["model"] == f"models:/xh-gpu@{alias}" and scored["use_gpu"] is False
    assert 0 < scored["predictions"] <= scored["questions"]
    assert scored["project_qps"] > 0 and scored["plain_loop_qps"] > 0
