"""Benchmark: HotpotQA dev quality of the model's variants, over seeds, on the real distractor sample.

    .venv/bin/python bench/hotpot_quality.py --tiny --steps 4 --dev 8 --seeds 0      # a quick check of the script
    nice .venv/bin/python bench/hotpot_quality.py                                     # MiniLM, CPU, few steps
    .venv/bin/python bench/hotpot_quality.py --steps 1500 --batch 4 --max-node-tokens 512 --device cuda   # a GPU

Data: `--hotpot` (default ../shared/data's 500-question sample) as distractor graphs
(`xh.graph.hotpot.distractor_graphs`, default settings): records 1-400 train, 401-500 dev. Dev
questions that get no graph are scored as misses, and titles are compared as the official script
compares them (`xh.eval.hotpot`), so the figures are over all dev questions.

Variants (`--variants`), each trained `--steps` optimizer steps per seed with the training loop's
optimizer (`xh.train.loop.parameter_groups`, AdamW with warmup, clipping):

    k3          Transformer-XH, hop attention after the last 3 layers, one model for both question types
    k0          the same heads on the plain backbone (no hop attention)
    k3_types    a bridge model and a comparison model (each trained on its type's graphs, the steps split
                by the types' shares of the training set), each dev question routed by its given type
                (`xh.inference.RoutedModel`)
    k3_nonode   k3 with node_loss_weight=0: the answer node is the one holding the best span
    gat         k3 with `model.preset=gat` (the original release's hop attention)

Every trained model is decoded twice from one forward pass: supporting facts from the joint head
(`sp_mode=joint`) and from the paper's chain (`sp_mode=chain`). One JSON line per (variant, seed),
then one summary line per variant and metric (mean, sample std, min, max over seeds), then the
differences k3 - k0, k3_types - k3 and chain - joint with the larger of the two seed spreads (std), and
whether the difference exceeds it.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

DEFAULT_HOTPOT = Path(__file__).resolve().parents[2] / "shared" / "data" / "hotpotqa" / "hotpot_train_sample500.json"
TRAIN_END = 400  # records [1, 400] train, [401, 500] dev
METRICS = ("em", "f1", "sp_f1", "joint_f1")
SP_MODES = ("joint", "chain")
VARIANTS = {
    "k3": {"hop_layers": 3},
    "k0": {"hop_layers": 0},
    "k3_types": {"hop_layers": 3},
    "k3_nonode": {"hop_layers": 3, "node_loss_weight": 0.0},
    "gat": {"hop_layers": 3, "preset": "gat"},
}


def load_split(path: str, dev_records: int) -> tuple[list[dict], list[dict], list[str]]:
    """(train graph rows, dev graph rows, ids of dev questions without a graph), over the first
    `dev_records` dev records."""
    from xh.config import GraphsConfig
    from xh.graph.hotpot import distractor_graphs, read_distractor_questions

    items, _ = read_distractor_questions(path)
    outcomes = distractor_graphs(items, GraphsConfig(setting="distractor"))
    train, dev, missed = [], [], []
    for item, outcome in zip(items, outcomes):
        if item.position <= TRAIN_END:
            if outcome.graph is not None:
                train.append(outcome.graph)
        elif item.position > TRAIN_END + dev_records:
            continue
        elif outcome.graph is not None:
            dev.append(outcome.graph)
        else:
            missed.append(item.question["qid"])
    return train, dev, missed


def train_model(args, backbone: str, overrides: dict, rows: list[dict], steps: int, seed: int):
    from xh.config import ModelConfig, TrainConfig
    from xh.graph.encode import encode_graph
    from xh.model.batch import collate
    from xh.model.xh import XHModel
    from xh.train.loop import parameter_groups
    from xh.train.worker import adamw_with_warmup, optimizer_step

    cfg = ModelConfig.model_validate({"backbone": backbone, "max_node_tokens": args.max_node_tokens} | overrides)
    torch.manual_seed(seed)
    model = XHModel.from_backbone(cfg).to(args.device)
    train = TrainConfig(lr=args.lr, hop_lr=args.hop_lr, warmup_fraction=0.1)
    optimizer, scheduler = adamw_with_warmup(parameter_groups(model, train), steps, train.warmup_fraction)
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    graphs = [encode_graph(rows[i], model.tokenizer, args.max_node_tokens) for i in order]
    model.train()
    for step in range(steps):
        batch = collate([graphs[(step * args.batch + i) % len(graphs)] for i in range(args.batch)]).to(args.device)
        with autocast(args):
            out = model(batch)
        out.loss.backward()
        optimizer_step(model, optimizer, scheduler, train.max_grad_norm)
    return model.eval()


def autocast(args):
    from xh.model.predict import autocast as xh_autocast

    return xh_autocast(torch.device(args.device), bf16=True)


def predict(args, model, rows: list[dict]) -> dict[str, list[dict]]:
    """Predictions per sp_mode, from one forward pass per batch."""
    from xh.graph.encode import encode_graph
    from xh.model.batch import collate
    from xh.model.decode import decode

    out: dict[str, list[dict]] = {mode: [] for mode in SP_MODES}
    cfg = model.cfg
    for first in range(0, len(rows), args.eval_batch):
        graphs = [encode_graph(r, model.tokenizer, args.max_node_tokens) for r in rows[first : first + args.eval_batch]]
        batch = collate(graphs).to(args.device)
        with torch.inference_mode(), autocast(args):
            output = model(batch)
        for mode in SP_MODES:
            out[mode] += decode(
                graphs, batch, output, cfg.max_answer_tokens, sp_mode=mode, by_span=not cfg.node_prediction
            )
    return out


def scores(dev: list[dict], missed: list[str], predictions: list[dict]) -> dict:
    from xh.eval.official import official_metrics

    metrics = official_metrics(dev, predictions, "hotpot", missed)
    return {k: round(metrics[k], 4) for k in METRICS}


def run(args, backbone: str, variant: str, seed: int, train: list[dict], dev: list[dict], missed: list[str]) -> dict:
    start = time.perf_counter()
    overrides = VARIANTS[variant]
    if variant == "k3_types":
        by_type = {"bridge": [], "comparison": []}
        for row in train:
            by_type[row["question_type"]].append(row)
        predictions = {mode: {} for mode in SP_MODES}
        for kind, rows in by_type.items():
            steps = max(1, round(args.steps * len(rows) / len(train)))
            model = train_model(args, backbone, overrides, rows, steps, seed)
            picked = [r for r in dev if r["question_type"] == kind]
            for mode, found in predict(args, model, picked).items():
                predictions[mode] |= {p["qid"]: p for p in found}
        predictions = {mode: [found[r["qid"]] for r in dev] for mode, found in predictions.items()}
    else:
        model = train_model(args, backbone, overrides, train, args.steps, seed)
        predictions = predict(args, model, dev)
    result = {"variant": variant, "seed": seed}
    for mode in SP_MODES:
        result[mode] = scores(dev, missed, predictions[mode])
    return result | {"seconds": round(time.perf_counter() - start, 1)}


def summarize(results: list[dict]) -> list[dict]:
    """Mean and spread per variant, sp_mode and metric; then the differences that matter, against the spread."""

    def values(variant: str, mode: str, metric: str) -> list[float]:
        return [r[mode][metric] for r in results if r["variant"] == variant]

    def spread(xs: list[float]) -> float:
        return statistics.stdev(xs) if len(xs) > 1 else float("nan")

    lines = []
    for variant in dict.fromkeys(r["variant"] for r in results):
        for mode in SP_MODES:
            for metric in METRICS:
                xs = values(variant, mode, metric)
                lines.append(
                    {
                        "summary": variant,
                        "sp_mode": mode,
                        "metric": metric,
                        "seeds": len(xs),
                        "mean": round(statistics.fmean(xs), 4),
                        "std": round(spread(xs), 4),
                        "min": min(xs),
                        "max": max(xs),
                    }
                )
    pairs = [("k3", "joint", "k0", "joint"), ("k3_types", "joint", "k3", "joint"), ("k3", "chain", "k3", "joint")]
    pairs += [("k3_nonode", "joint", "k3", "joint"), ("gat", "joint", "k3", "joint")]
    for a, mode_a, b, mode_b in pairs:
        for metric in METRICS:
            xa, xb = values(a, mode_a, metric), values(b, mode_b, metric)
            if not xa or not xb:
                continue
            diff = statistics.fmean(xa) - statistics.fmean(xb)
            noise = max(spread(xa), spread(xb))
            lines.append(
                {
                    "difference": f"{a}/{mode_a} - {b}/{mode_b}",
                    "metric": metric,
                    "diff": round(diff, 4),
                    "seed_std": round(noise, 4),
                    "exceeds_spread": bool(abs(diff) > noise) if noise == noise else None,
                }
            )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hotpot", default=str(DEFAULT_HOTPOT))
    parser.add_argument("--backbone", default=None, help="default: the offline all-MiniLM-L6-v2")
    parser.add_argument("--tiny", action="store_true", help="a random 3 x 64 BERT instead of the backbone")
    parser.add_argument("--variants", default="k3,k0,k3_types")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch", type=int, default=2, help="graphs per training step")
    parser.add_argument("--dev", type=int, default=100, help="dev records scored (of 401-500)")
    parser.add_argument("--eval-batch", type=int, default=8)
    parser.add_argument("--max-node-tokens", type=int, default=160)
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--hop-lr", type=float, default=1e-4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", default=None, help="also append the JSON lines to this file")
    parser.add_argument(
        "--summarize", nargs="+", default=None, metavar="FILE", help="only summarise the result lines of earlier runs"
    )
    args = parser.parse_args()
    if args.summarize:  # runs split over processes (one per seed) are summarised together
        lines = [json.loads(line) for path in args.summarize for line in Path(path).read_text().splitlines()]
        for line in summarize([r for r in lines if "variant" in r]):
            print(json.dumps(line))
        return
    torch.set_num_threads(args.threads)

    from xh.model.backbones import resolve_backbone

    sink = open(args.out, "a") if args.out else None  # noqa: SIM115 (kept open for the whole run)

    def emit(line: dict) -> None:
        text = json.dumps(line)
        print(text, flush=True)
        if sink:
            sink.write(text + "\n")
            sink.flush()

    with tempfile.TemporaryDirectory() as tmp:
        if args.tiny:
            sys.path.insert(0, str(Path(__file__).parent))
            from variants import tiny_backbone

            backbone = tiny_backbone(Path(tmp))
        else:
            backbone = resolve_backbone(args.backbone)
        train, dev, missed = load_split(args.hotpot, args.dev)
        emit(
            {
                "setup": "hotpot_quality",
                "backbone": "tiny" if args.tiny else Path(backbone).name,
                "device": args.device,
                "threads": args.threads,
                "train_graphs": len(train),
                "dev_graphs": len(dev),
                "dev_missed": len(missed),
                "steps": args.steps,
                "batch": args.batch,
                "max_node_tokens": args.max_node_tokens,
                "lr": args.lr,
                "hop_lr": args.hop_lr,
            }
        )
        results = []
        for variant in args.variants.split(","):
            if variant not in VARIANTS:
                raise SystemExit(f"unknown variant {variant!r}; one of {', '.join(VARIANTS)}")
            for seed in (int(s) for s in args.seeds.split(",")):
                results.append(run(args, backbone, variant, seed, train, dev, missed))
                emit(results[-1])
        for line in summarize(results):
            emit(line)


if __name__ == "__main__":
    main()
