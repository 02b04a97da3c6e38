"""The prepared device run (#39): one call of at most 9 minutes on a lent GPU machine measures the training
step alone, Ray Train at BERT-base and MiniLM sizes with K=3 and K=0, and batch scoring.

    # the device, carry [".devkit"] (docs/training.md, "The device run"):
    bash .devkit/install.sh && python -u bench/device_run.py --device cuda --out $OUT
    # here, its CPU form (tests/unit/train/test_device_run.py runs it in CI):
    .venv/bin/python bench/device_run.py --device cpu --out /tmp/device-run --ray-plan-only

Parts, in order; each JSON line is printed and appended to OUT/device_run.jsonl as soon as it is
measured, so that a call cut short by its time limit still hands back everything before the cut:

    start    versions, the GPU, whether Ray and MLflow import (the kit installed); printed at once
    step/*   the training step without Ray or input (`xh.train.step.Trainer`: forward, backward, fused
             AdamW) on synthetic token batches of --batch-tokens: step seconds, real tokens/s, operators a
             step dispatches (K=3, K=0; BERT-base and MiniLM sizes, random weights). Within 60 s of the
             start on a GPU, and the chip's own figure: the Ray runs add the input and Ray Train around it
    ray      `bench/gpu_ray.py` with --ray-runs (world, every run trained, the first registered, then
             promoted and scored; its lines go to OUT/gpu_ray.jsonl as it goes), for what time is left
             less --reserve-s; its scoring run answers --score-questions new questions (20,000), the
             plain loop the first --loop-questions of them (4,000)
    end      seconds in all

With --ray-plan-only the Ray part only prints the arguments it would hand `bench/gpu_ray.py` (parsed by
its own parser): what the CPU form checks in seconds; `tests/integration/test_gpu_ray.py` runs it for real.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

# layers, hidden, heads, intermediate; the CPU form's are tiny
SIZES = {
    "cuda": {"bert-base": (12, 768, 12, 3072), "minilm": (6, 384, 12, 1536)},
    "cpu": {"bert-base": (3, 64, 4, 128), "minilm": (3, 32, 4, 64)},
}
RAY_RUNS = ["bert-base/tokens/k3", "bert-base/tokens/k0", "minilm/tokens/k3", "minilm/tokens/k0"]


class Lines:
    """Printed and appended to OUT/device_run.jsonl at once."""

    def __init__(self, out: Path | None):
        self.out, self.started = out, time.perf_counter()
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)

    def emit(self, record: dict) -> dict:
        record = record | {"at_s": round(time.perf_counter() - self.started, 1)}
        print(json.dumps(record), flush=True)
        if self.out is not None:
            with (self.out / "device_run.jsonl").open("a") as f:
                f.write(json.dumps(record) + "\n")
        return record

    def left(self, budget_s: float) -> float:
        return budget_s - (time.perf_counter() - self.started)


def start_record(device: str) -> dict:
    """Before any heavy import: the machine, and whether the kit's packages are there (not imported)."""
    record = {"name": "start", "device": device, "python": platform.python_version(), "cpus": os.cpu_count()}
    record["load_average"] = round(os.getloadavg()[0], 2)
    for package in ("torch", "transformers", "ray", "mlflow"):
        record[f"has_{package}"] = importlib.util.find_spec(package) is not None  # no Ray: no Ray part
    return record


def versions(device: str) -> dict:
    import torch
    import transformers

    record = {"name": "versions", "torch": torch.__version__, "transformers": transformers.__version__}
    if device == "cuda":
        record |= {"gpu": torch.cuda.get_device_name(0), "cuda": torch.version.cuda}
    return record


def token_batch(rng, batch_tokens: int, row_tokens: int, vocab: int):
    """A packed batch of random graphs (8-12 nodes of 64-`row_tokens` tokens, a few edges each) filling
    `batch_tokens // row_tokens` rows, with every kind of HotpotQA label: the shape training sees."""
    import numpy as np

    from xh.graph.encoded import EncodedGraph
    from xh.model.packing import fill_rows, pack

    def graph(k: int) -> EncodedGraph:
        n = int(rng.integers(8, 13))
        lengths = rng.integers(64, row_tokens + 1, size=n)
        ids = [np.concatenate([[101], rng.integers(1000, vocab, size=int(m) - 1)]) for m in lengths]
        sentences = [np.where(np.arange(m) >= 16, (np.arange(m) - 16) // 24, -1) for m in lengths]
        edges = np.array([(s, (s + 1) % n) for s in range(n)] + [(0, d) for d in range(2, n)], np.int64)
        return EncodedGraph(
            qid=f"g{k}",
            task="hotpot",
            input_ids=ids,
            token_type_ids=[(np.arange(m) >= 16).astype(np.int64) for m in lengths],
            paragraph_mask=[np.arange(m) >= 16 for m in lengths],
            offsets=[np.full((int(m), 2), -1) for m in lengths],
            sentence_ids=sentences,
            edges=edges,
            node_doc_ids=[f"g{k}-{i}" for i in range(n)],
            node_titles=["t"] * n,
            node_paragraphs=[""] * n,
            num_sentences=np.array([s.max() + 1 for s in sentences]),
            node_lines=np.full(n, -1),
            node_relevance=rng.integers(0, 2, size=n),
            node_has_answer=np.full(n, -1),
            answer_spans=np.array([[0, 20, 22]]),
            answer_type=0,
            sentence_labels=[rng.integers(0, 2, size=s.max() + 1) for s in sentences],
        )

    rows = batch_tokens // row_tokens
    graphs = next(fill_rows((graph(k) for k in range(10_000)), rows, row_tokens))
    return pack(graphs, row_tokens, rows=rows)


def step_figures(size: str, hop_layers: int, args, batch) -> dict:
    """Step seconds, real tokens/s and operators of the training step alone (no Ray, batch made once)."""
    import torch
    from reference import count_ops
    from transformers import BertConfig, BertModel

    from xh.config import ModelConfig, TrainConfig
    from xh.model.xh import XHModel
    from xh.train.meters import StepMeter
    from xh.train.state import Progress
    from xh.train.step import Trainer
    from xh.train.worker import adamw_with_warmup

    layers, hidden, heads, intermediate = SIZES[args.device][size]
    config = BertConfig(
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=intermediate,
        max_position_embeddings=512,
        attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    device = torch.device(args.device)
    model = XHModel(ModelConfig(hop_layers=hop_layers), BertModel(config)).to(device).train()
    optimizer, scheduler = adamw_with_warmup([{"params": list(model.parameters()), "lr": 1e-5}], 10_000, 0.0)
    train = TrainConfig(bf16=True)
    trainer = Trainer(model, model, optimizer, scheduler, train, device, Progress(), StepMeter(None, 1))
    host = batch.pin_memory() if device.type == "cuda" else batch

    def steps(count: int) -> float:
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(count):
            trainer.optimizer_step(trainer.forward_backward(host))
        if device.type == "cuda":
            torch.cuda.synchronize()
        return (time.perf_counter() - start) / count

    steps(args.warmup_steps)  # first shapes planned, kernels chosen
    seconds = statistics.median(steps(args.steps) for _ in range(3))
    ops = count_ops(lambda: trainer.optimizer_step(trainer.forward_backward(host)))
    record = {"name": f"step/{size}/k{hop_layers}", "step_s": round(seconds, 4), "operators_per_step": ops}
    record |= {"real_tokens_per_s": round(batch.num_real_tokens / seconds), "encoder_shape": list(batch.encoder_shape)}
    if device.type == "cuda":
        record["gpu_memory_peak_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    return record


def ray_arguments(args) -> list[str]:
    """What `bench/gpu_ray.py` is handed: the runs, its output folder, the questions to score and the plain
    loop's share of them."""
    argv = ["--device", args.device, "--runs", *args.ray_runs]
    if args.out:
        argv += ["--out", str(Path(args.out) / "gpu_ray")]
    if args.score_questions:
        argv += ["--score-questions", str(args.score_questions)]
    if args.loop_questions:
        argv += ["--loop-questions", str(args.loop_questions)]
    return argv + [*args.ray_args]


def load_gpu_ray():
    spec = importlib.util.spec_from_file_location("gpu_ray", ROOT / "bench" / "gpu_ray.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def ray_part(args, lines: Lines) -> None:
    """`bench/gpu_ray.py` for the time left (less --reserve-s), or only its arguments (--ray-plan-only)."""
    left = lines.left(args.budget_s) - args.reserve_s
    argv = ray_arguments(args)
    gpu_ray = load_gpu_ray()
    gpu_ray.parser().parse_args(argv)  # an option gpu_ray does not take fails here, in the CPU form too
    record = {"name": "ray", "argv": argv, "seconds_left": round(left)}
    if args.ray_plan_only or left <= 0:
        lines.emit(record | {"ran": False, "why": "asked" if args.ray_plan_only else "no time left"})
        return
    lines.emit(record | {"ran": True})
    records = gpu_ray.main(argv)
    lines.emit({"name": "ray/done", "records": len(records)})


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--out", default=None, help="folder for device_run.jsonl (and gpu_ray's lines)")
    parser.add_argument("--budget-s", type=float, default=540, help="the call's time limit, seconds")
    parser.add_argument("--reserve-s", type=float, default=20, help="left unused at the end")
    parser.add_argument("--batch-tokens", type=int, default=None, help="default: 32768 on cuda, 1024 on cpu")
    parser.add_argument("--row-tokens", type=int, default=None, help="default: 256 on cuda, 128 on cpu")
    parser.add_argument("--steps", type=int, default=None, help="timed steps, 3 times (default: 10 cuda, 2 cpu)")
    parser.add_argument("--warmup-steps", type=int, default=3)
    parser.add_argument("--sizes", nargs="+", default=["bert-base", "minilm"], choices=["bert-base", "minilm"])
    parser.add_argument("--ray-runs", nargs="+", default=RAY_RUNS)
    parser.add_argument(
        "--score-questions", type=int, default=20000, help="new questions over the world's documents to score"
    )
    parser.add_argument(
        "--loop-questions", type=int, default=4000, help="the plain loop's share of them (its steady rate)"
    )
    parser.add_argument("--ray-plan-only", action="store_true", help="print gpu_ray's arguments, run nothing of it")
    parser.add_argument("--ray-args", nargs=argparse.REMAINDER, default=[], help="more arguments for gpu_ray.py")
    args = parser.parse_args(argv)
    cuda = args.device == "cuda"
    args.batch_tokens = args.batch_tokens or (32768 if cuda else 1024)
    args.row_tokens = args.row_tokens or (256 if cuda else 128)
    args.steps = args.steps or (10 if cuda else 2)

    lines = Lines(Path(args.out) if args.out else None)
    records = [lines.emit(start_record(args.device)), lines.emit(versions(args.device))]
    import numpy as np

    batch = token_batch(np.random.default_rng(0), args.batch_tokens, args.row_tokens, vocab=30522)
    for size in args.sizes:
        for hop_layers in (3, 0):
            records.append(lines.emit(step_figures(size, hop_layers, args, batch)))
        k3, k0 = records[-2], records[-1]
        records.append(lines.emit({"name": f"step/{size}/ratio", "k3_over_k0": round(k3["step_s"] / k0["step_s"], 3)}))
    ray_part(args, lines)
    records.append(lines.emit({"name": "end", "seconds": round(time.perf_counter() - lines.started, 1)}))
    return records


if __name__ == "__main__":
    main()
