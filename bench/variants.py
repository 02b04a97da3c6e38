"""Benchmark: Transformer-XH and two related systems trained on the same distractor graphs.

    .venv/bin/python bench/variants.py --tiny                    # random 2 x 64 BERT: a quick check of the script
    .venv/bin/python bench/variants.py                           # all-MiniLM-L6-v2, a few steps each
    .venv/bin/python bench/variants.py --steps 200 --dev 100 --batch 4 --max-node-tokens 256   # on a real machine

Data: HotpotQA distractor graphs (`xh.graph.hotpot.distractor_graphs`, default edge mode) of
`--hotpot` (default ../shared/data's 500-question sample): questions 0-399 train, 400-499 dev; each
system trains `--steps` optimizer steps on the first `--train` training questions (cycled, same order)
and is scored on the first `--dev` dev questions with the project's official metrics
(`xh.eval.hotpot.evaluate_hotpot`). One JSON line per system:

    xh_k3       Transformer-XH, hop attention after the last 3 layers (paper Eq. 7-9)
    xh_k0       the same heads on the plain backbone (no hop attention)
    gesa        XH with GESA-style typed hop attention (`xh.model.gesa`): typed edges from `typed_edges`,
                hub-to-hub q/k/v copied from each layer's pretrained attention, zero type vectors at start
    dochopper   DocHopper (`xh.model.dochopper`): question-free paragraph encoding, 4 hops, reader rerank

Fields: em, f1, sp_f1, joint_f1 on the dev questions; train_tokens_per_s (real tokens the backbone
read per second of training step, forward + backward + optimizer); infer_questions_per_s. DocHopper's
paragraphs are encoded once per corpus (`encode_corpus`, timed alone: corpus_encode_s), then its
questions are answered from the stored embeddings (infer_questions_per_s; with the encoding included:
infer_questions_per_s_with_corpus). A few steps on a CPU say that every system trains and scores on
the same data, and what each costs; they say little about accuracy.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

DEFAULT_HOTPOT = Path(__file__).resolve().parents[2] / "shared" / "data" / "hotpotqa" / "hotpot_train_sample500.json"
TRAIN_END = 400  # questions [0, 400) train, [400, 500) dev


def tiny_backbone(folder: Path) -> str:
    """A random 2 x 64 BERT with the real MiniLM tokenizer, saved like a pretrained checkpoint."""
    from transformers import BertConfig, BertModel

    from xh.backbones import resolve_backbone
    from xh.model import load_tokenizer

    tokenizer = load_tokenizer(resolve_backbone(None))
    config = BertConfig(
        num_hidden_layers=3,
        hidden_size=64,
        num_attention_heads=2,
        intermediate_size=128,
        vocab_size=tokenizer.vocab_size,
        max_position_embeddings=512,
    )
    torch.manual_seed(0)
    BertModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def load_rows(path: str) -> tuple[list[dict], list[dict]]:
    from xh.graph.hotpot import (
        GraphSettings,
        distractor_graphs,
        read_distractor_questions,
    )

    items, _ = read_distractor_questions(path)
    outcomes = distractor_graphs(items, GraphSettings())
    train = [o.graph for item, o in zip(items, outcomes) if o.graph is not None and item.position <= TRAIN_END]
    dev = [o.graph for item, o in zip(items, outcomes) if o.graph is not None and item.position > TRAIN_END]
    return train, dev


def scores(rows: list[dict], predictions: list[dict]) -> dict:
    from xh.eval.hotpot import evaluate_hotpot
    from xh.inference import hotpot_gold, hotpot_prediction_file

    metrics = evaluate_hotpot(hotpot_gold(rows), hotpot_prediction_file(predictions))
    return {k: round(metrics[k], 4) for k in ("em", "f1", "sp_f1", "joint_f1")}


# --- XH and GESA ----------------------------------------------------------------------------------------


def gesa_model(cfg, backbone: str):
    """An XHModel whose hop steps are GESAHopSteps; the batch's edge types go in `model.edge_types`.

    This is the bench's own wiring (the coordinator wires `hop_variant: typed` into XHModel itself)."""
    from transformers import AutoModel

    from xh.model import XHModel, load_tokenizer
    from xh.model.gesa import GESAHopStep, TypedHopGraph, self_attention_projections
    from xh.model.hop import attach_hop_steps, find_encoder_layers

    class GESAXH(XHModel):
        def __init__(self, cfg, encoder, tokenizer):
            super().__init__(cfg.model_copy(update={"hop_layers": 0}), encoder, tokenizer)
            config, layers = encoder.config, find_encoder_layers(encoder)
            self.hop_steps = nn.ModuleList(
                GESAHopStep(
                    config.hidden_size,
                    cfg.hop_heads or config.num_attention_heads,
                    dropout=cfg.hop_dropout,
                    fusion_init=cfg.hop_fusion_init,
                    initializer_range=config.initializer_range,
                )
                for _ in range(cfg.hop_layers)
            )
            first = len(layers) - cfg.hop_layers
            for i, step in enumerate(self.hop_steps):  # GESA §4.1: W^Q_e2e (and the shared W^K, W^V) from the layer
                step.copy_pretrained(**self_attention_projections(layers[first + i]))
            attach_hop_steps(layers, self.hop_steps, self._current_graph)
            self.edge_types: torch.Tensor | None = None

        def _encode(self, batch):
            graph = TypedHopGraph.build(batch.edges, self.edge_types, batch.num_nodes, self.cfg.isolated_nodes)
            self._graph = graph
            try:
                out = self.backbone(
                    input_ids=batch.input_ids,
                    attention_mask=batch.attention_mask,
                    token_type_ids=batch.token_type_ids if self._use_token_types else None,
                )
            finally:
                self._graph = None
            return out.last_hidden_state, graph

    encoder = AutoModel.from_pretrained(backbone, attn_implementation=cfg.attn_implementation, dtype=torch.float32)
    return GESAXH(cfg, encoder, load_tokenizer(backbone))


def typed_rows(rows: list[dict]) -> tuple[list[dict], dict[str, np.ndarray]]:
    """Rows whose edges are the typed edges (as `graphs.edge_mode: typed` would store them), and their types."""
    from xh.model.gesa import edge_type_ids, typed_edges

    out, types = [], {}
    for row in rows:
        typed = typed_edges(row["edges"], [n["source"] for n in row["nodes"]], row["question_type"])
        out.append(row | {"edges": [{"src": e["src"], "dst": e["dst"]} for e in typed]})
        types[row["qid"]] = edge_type_ids(typed)
    return out, types


def run_xh(
    name: str, args, backbone: str, train_rows: list[dict], dev_rows: list[dict], hop_layers: int, gesa: bool
) -> dict:
    from xh.config import ModelConfig
    from xh.graph.encode import encode_graph
    from xh.model import XHModel, collate, decode

    cfg = ModelConfig(backbone=backbone, hop_layers=hop_layers, max_node_tokens=args.max_node_tokens)
    torch.manual_seed(args.seed)
    types: dict[str, np.ndarray] = {}
    if gesa:
        model = gesa_model(cfg, backbone)
        train_rows, train_types = typed_rows(train_rows)
        dev_rows, dev_types = typed_rows(dev_rows)
        types = train_types | dev_types
    else:
        model = XHModel.from_backbone(cfg)
    tokenizer = model.tokenizer

    def batch_of(graphs):
        batch = collate(graphs)
        if gesa:
            model.edge_types = torch.from_numpy(np.concatenate([types[g.qid] for g in graphs]))
        return batch

    train_graphs = [encode_graph(r, tokenizer, args.max_node_tokens) for r in train_rows[: args.train]]
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    model.train()
    tokens, seconds = 0, 0.0
    for step in range(args.steps):
        graphs = [train_graphs[(step * args.batch + i) % len(train_graphs)] for i in range(args.batch)]
        batch = batch_of(graphs)
        start = time.perf_counter()
        out = model(batch)
        out.loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        seconds += time.perf_counter() - start
        tokens += batch.num_real_tokens

    model.eval()
    dev = dev_rows[: args.dev]
    start = time.perf_counter()
    predictions = []
    for first in range(0, len(dev), args.eval_batch):
        graphs = [encode_graph(r, tokenizer, args.max_node_tokens) for r in dev[first : first + args.eval_batch]]
        batch = batch_of(graphs)
        with torch.inference_mode():
            out = model(batch)
        predictions.extend(decode(graphs, batch, out, cfg.max_answer_tokens))
    infer = time.perf_counter() - start
    return {
        "system": name,
        "steps": args.steps,
        **scores(dev, predictions),
        "train_tokens_per_s": round(tokens / seconds, 1),
        "infer_questions_per_s": round(len(dev) / infer, 3),
    }


# --- DocHopper ------------------------------------------------------------------------------------------


def run_dochopper(args, backbone: str, train_rows: list[dict], dev_rows: list[dict]) -> dict:
    from xh.model.dochopper import DocHopper, DocHopperConfig

    torch.manual_seed(args.seed)
    model = DocHopper.from_backbone(DocHopperConfig(backbone=backbone, max_paragraph_tokens=args.max_node_tokens))
    examples = model.prepare(train_rows[: args.train])
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    model.train()
    tokens, seconds = 0, 0.0
    for step in range(args.steps):
        batch = model.collate([examples[(step * args.batch + i) % len(examples)] for i in range(args.batch)])
        start = time.perf_counter()
        out = model(batch)
        out.loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        seconds += time.perf_counter() - start
        tokens += out.tokens

    dev = dev_rows[: args.dev]
    dev_examples = model.prepare(dev)
    paragraphs = {d: (t, s) for e in dev_examples for d, t, s in zip(e.doc_ids, e.titles, e.sentences)}
    start = time.perf_counter()
    corpus = dict(zip(paragraphs, model.encode_corpus(list(paragraphs.values()), batch_size=args.eval_batch * 4)))
    corpus_seconds = time.perf_counter() - start
    start = time.perf_counter()
    predictions = model.predict(dev_examples, corpus, batch_size=args.eval_batch)
    infer = time.perf_counter() - start
    return {
        "system": "dochopper",
        "steps": args.steps,
        **scores(dev, predictions),
        "train_tokens_per_s": round(tokens / seconds, 1),
        "infer_questions_per_s": round(len(dev) / infer, 3),
        "corpus_paragraphs": len(paragraphs),
        "corpus_encode_s": round(corpus_seconds, 2),
        "infer_questions_per_s_with_corpus": round(len(dev) / (infer + corpus_seconds), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hotpot", default=str(DEFAULT_HOTPOT))
    parser.add_argument("--backbone", default=None, help="default: the offline all-MiniLM-L6-v2")
    parser.add_argument("--tiny", action="store_true", help="a random 3 x 64 BERT instead of the backbone")
    parser.add_argument("--systems", default="xh_k3,xh_k0,gesa,dochopper")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--batch", type=int, default=1, help="questions per training step")
    parser.add_argument("--train", type=int, default=400, help="training questions used (of 0-399)")
    parser.add_argument("--dev", type=int, default=12, help="dev questions scored (of 400-499)")
    parser.add_argument("--eval-batch", type=int, default=4)
    parser.add_argument("--max-node-tokens", type=int, default=128)
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from xh.backbones import resolve_backbone

    with tempfile.TemporaryDirectory() as tmp:
        backbone = tiny_backbone(Path(tmp)) if args.tiny else resolve_backbone(args.backbone)
        train_rows, dev_rows = load_rows(args.hotpot)
        common = {
            "backbone": "tiny" if args.tiny else backbone,
            "device": "cpu",
            "threads": args.threads,
            "train_questions": min(args.train, len(train_rows)),
            "dev_questions": min(args.dev, len(dev_rows)),
            "batch": args.batch,
            "max_node_tokens": args.max_node_tokens,
        }
        for system in args.systems.split(","):
            if system == "xh_k3":
                result = run_xh(system, args, backbone, train_rows, dev_rows, hop_layers=3, gesa=False)
            elif system == "xh_k0":
                result = run_xh(system, args, backbone, train_rows, dev_rows, hop_layers=0, gesa=False)
            elif system == "gesa":
                result = run_xh(system, args, backbone, train_rows, dev_rows, hop_layers=3, gesa=True)
            elif system == "dochopper":
                result = run_dochopper(args, backbone, train_rows, dev_rows)
            else:
                raise SystemExit(f"unknown system {system!r}")
            print(json.dumps(result | common), flush=True)


if __name__ == "__main__":
    main()
