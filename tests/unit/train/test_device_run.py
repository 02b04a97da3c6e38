"""`bench/device_run.py`, the prepared device run, in its CPU form: the step measured alone at tiny sizes,
the Ray part's arguments planned (`tests/integration/test_gpu_ray.py` runs that part for real)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import torch

BENCH = Path(__file__).resolve().parents[3] / "bench" / "device_run.py"


def test_the_device_run_in_its_cpu_form_prints_and_appends_each_line_as_it_goes(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("device_run", BENCH)
    device_run = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(device_run)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        argv = ["--device", "cpu", "--out", str(tmp_path), "--sizes", "minilm", "--steps", "1", "--warmup-steps", "1"]
        records = device_run.main([*argv, "--ray-plan-only"])
    finally:
        torch.set_num_threads(threads)
    written = [json.loads(line) for line in (tmp_path / "device_run.jsonl").read_text().splitlines()]
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    names = [r["name"] for r in written]
    assert printed == written and names[:2] == ["start", "versions"] and names[-2:] == ["ray", "end"]
    assert written[0]["has_torch"] and written[0]["at_s"] <= written[-1]["at_s"]
    k3, k0, ratio = (next(r for r in written if r["name"] == f"step/minilm/{x}") for x in ("k3", "k0", "ratio"))
    assert k3["operators_per_step"] > k0["operators_per_step"] > 0 and k3["real_tokens_per_s"] > 0
    assert ratio["k3_over_k0"] == round(k3["step_s"] / k0["step_s"], 3)
    ray = written[-2]
    assert ray["ran"] is False and ray["argv"][:3] == ["--device", "cpu", "--runs"]
    assert ray["argv"][3:7] == ["bert-base/tokens/k3", "bert-base/tokens/k0", "minilm/tokens/k3", "minilm/tokens/k0"]
    # the scoring run at 20,000 questions, the loop's steady rate over 4,000 of them: options gpu_ray parses
    assert ray["argv"][7:] == [
        "--out",
        str(tmp_path / "gpu_ray"),
        "--score-questions",
        "20000",
        "--loop-questions",
        "4000",
    ]
    parsed = device_run.load_gpu_ray().parser().parse_args(ray["argv"])
    assert (parsed.score_questions, parsed.loop_questions, parsed.runs) == (20000, 4000, ray["argv"][3:7])
    assert [r["name"] for r in records] == [n for n in names if n != "ray"]
