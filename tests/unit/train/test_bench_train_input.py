"""`bench/train_input.py`, the first command of the next device run, in a quick CPU form: both systems
feed the same batches, and the bench's baseline is the old first fit it names."""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[3] / "bench" / "train_input.py"


def load_bench():
    spec = importlib.util.spec_from_file_location("train_input", BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def test_the_scanning_first_fit_of_the_baseline_makes_the_rows_the_library_makes():
    from xh.model.packing import first_fit_decreasing

    scanning = load_bench().first_fit_scanning
    rng = random.Random(7)
    for _ in range(2000):
        capacity = rng.choice([16, 64, 256])
        lengths = [rng.randint(1, rng.choice([capacity, capacity // 4])) for _ in range(rng.randint(0, 80))]
        assert first_fit_decreasing(lengths, capacity) == scanning(lengths, capacity)


@pytest.mark.slow
@pytest.mark.shared_data
def test_both_systems_feed_the_same_batches(shared_data):
    hotpot = shared_data / "hotpotqa" / "hotpot_train_sample500.json"
    args = ["--hotpot", str(hotpot), "--graphs", "60", "--processes", "1", "--repeat", "1"]
    records = load_bench().main([*args, "--max-node-tokens", "48", "--batch-tokens", "4096"])
    by = {(r["name"], r.get("processes")): r for r in records}
    assert by["ceiling/project", None]["batches"] == by["ceiling/baseline", None]["batches"] > 1
    assert by["input/project", 1]["batches"] == by["input/baseline", 1]["batches"] > 1
    assert by["ratio", "ceiling"]["project_over_baseline"] > 0 and by["ratio", 1]["project_over_baseline"] > 0
    assert by["encode", 1]["real_tokens_per_s"] > 0
