"""Benchmark: Transformer-XH, GESA and DocHopper trained and scored on the same distractor graphs.

    .venv/bin/python bench/variants.py --tiny --steps 2 --dev 4     # random 3 x 64 BERT: a quick check of the script
    nice -n 10 .venv/bin/python bench/variants.py --steps 60 --dev 40 --seeds 0,1,2   # all-MiniLM-L6-v2 on a CPU

Data (`--data`): `hotpot`, HotpotQA distractor graphs (`xh.graph.hotpot.distractor_graphs`) of `--hotpot`
(default ../shared/data's 500-question sample): questions 0-399 train, 400-499 dev; `world`, a generated
world's questions (`xh.synth`, distractor contexts), the first 80% train. Each system trains `--steps`
optimizer steps on the training questions (cycled, same order), then is scored on the first `--dev` dev
questions with the project's official metrics (`xh.eval.hotpot.evaluate_hotpot`). Systems (`--systems`):

    xh_k3, xh_k1, xh_k0      Transformer-XH, hop attention after the last K layers (K = 0: the plain backbone)
    gesa_k3, gesa_k1         `model.hop_variant: gesa` on the same graphs as `graphs.edge_mode: typed` stores
                             them (typed edges; hub-to-hub q/k/v copied from the layer; zero type vectors at start)
    dochopper_h4, _h2        DocHopper (`xh.model.dochopper`): 4 hops (paragraph, sentence) x 2, or 2 (one evidence)

One JSON line per (data, seed, system), also logged as an MLflow run of `--experiment` (params and
metrics; `--mlflow`, default a SQLite file in the working folder), then a Markdown table of mean ± std
over the seeds. Fields: em, f1, sp_em, sp_f1, joint_f1; train_tokens_per_s (real tokens the backbone
read per second of training step: forward, backward, optimizer); infer_questions_per_s. DocHopper's
paragraphs are encoded once per corpus (`encode_corpus`, timed alone: corpus_encode_s), then its
questions are answered from the stored embeddings (infer_questions_per_s; with the encoding included:
infer_questions_per_s_with_corpus). A few steps on a CPU say that every system trains and scores on
the same data and what each costs; they say little about accuracy at full budget. The comparison at a
real budget, on worlds where the answer needs the hop, with seeds and dev curves: `bench/science.py`.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

DEFAULT_HOTPOT = Path(__file__).resolve().parents[2] / "shared" / "data" / "hotpotqa" / "hotpot_train_sample500.json"
TRAIN_END = 400  # questions [0, 400) train, [400, 500) dev


def tiny_backbone(folder: Path) -> str:
    """A random 3 x 64 BERT with the real MiniLM tokenizer, saved like a pretrained checkpoint."""
    from xh.model.backbones import random_backbone, resolve_backbone

    return random_backbone(folder, resolve_backbone(None), layers=3, hidden=64, heads=2, intermediate=128)


def load_rows(path: str, train_end: int = TRAIN_END, edge_mode: str = "hyperlink") -> tuple[list[dict], list[dict]]:
    """(train, dev) graph rows built by the project's graph builder in the distractor setting."""
    from xh.config import GraphsConfig
    from xh.graph.hotpot import distractor_graphs, read_distractor_questions

    items, _ = read_distractor_questions(path)
    outcomes = distractor_graphs(items, GraphsConfig(setting="distractor", edge_mode=edge_mode))
    train = [o.graph for item, o in zip(items, outcomes) if o.graph is not None and item.position <= train_end]
    dev = [o.graph for item, o in zip(items, outcomes) if o.graph is not None and item.position > train_end]
    return train, dev


def scores(rows: list[dict], predictions: list[dict]) -> dict:
    from xh.eval.official import official_metrics

    metrics = official_metrics(rows, predictions, "hotpot")
    return {k: round(float(metrics[k]), 4) for k in ("em", "f1", "sp_em", "sp_f1", "joint_f1")}


# --- XH and GESA ----------------------------------------------------------------------------------------


def run_xh(args, backbone: str, train_rows: list[dict], dev_rows: list[dict], hop_layers: int, variant: str) -> dict:
    """XH (`variant` paper) or GESA (`variant` gesa: `model.hop_variant: gesa`; the rows of edge mode typed)."""
    from xh.config import ModelConfig
    from xh.graph.encode import encode_graph
    from xh.model.batch import collate
    from xh.model.decode import decode
    from xh.model.xh import XHModel

    cfg = ModelConfig(
        backbone=backbone, hop_layers=hop_layers, max_node_tokens=args.max_node_tokens, hop_variant=variant
    )
    torch.manual_seed(args.seed)
    model = XHModel.from_backbone(cfg)
    tokenizer = model.tokenizer

    train_graphs = [encode_graph(r, tokenizer, args.max_node_tokens) for r in train_rows[: args.train]]
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    model.train()
    tokens, seconds = 0, 0.0
    for step in range(args.steps):
        graphs = [train_graphs[(step * args.batch + i) % len(train_graphs)] for i in range(args.batch)]
        batch = collate(graphs)
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
        batch = collate(graphs)
        with torch.inference_mode():
            out = model(batch)
        predictions.extend(decode(graphs, batch, out, cfg.max_answer_tokens))
    infer = time.perf_counter() - start
    return {
        **scores(dev, predictions),
        "train_tokens_per_s": round(tokens / seconds, 1),
        "infer_questions_per_s": round(len(dev) / infer, 3),
    }


# --- DocHopper ------------------------------------------------------------------------------------------


def run_dochopper(args, backbone: str, train_rows: list[dict], dev_rows: list[dict], hops: int) -> dict:
    from xh.model.dochopper.config import DocHopperConfig
    from xh.model.dochopper.model import DocHopper

    torch.manual_seed(args.seed)
    kinds = ("paragraph", "sentence") * (hops // 2)
    lambdas = DocHopperConfig.evidence_lambdas[: hops // 2]
    cfg = DocHopperConfig(
        backbone=backbone, max_paragraph_tokens=args.max_node_tokens, hops=kinds, evidence_lambdas=lambdas
    )
    model = DocHopper.from_backbone(cfg)
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
        **scores(dev, predictions),
        "train_tokens_per_s": round(tokens / seconds, 1),
        "infer_questions_per_s": round(len(dev) / infer, 3),
        "corpus_paragraphs": len(paragraphs),
        "corpus_encode_s": round(corpus_seconds, 2),
        "infer_questions_per_s_with_corpus": round(len(dev) / (infer + corpus_seconds), 3),
    }


SYSTEMS = {  # name -> (kind, K or hops)
    "xh_k3": ("paper", 3),
    "xh_k1": ("paper", 1),
    "xh_k0": ("paper", 0),
    "gesa_k3": ("gesa", 3),
    "gesa_k1": ("gesa", 1),
    "dochopper_h4": ("dochopper", 4),
    "dochopper_h2": ("dochopper", 2),
}


def world_questions(folder: Path, num_questions: int) -> str:
    """A generated world's HotpotQA-format question file (distractor contexts), `xh.synth`."""
    from xh import synth

    synth.write_world(
        synth.WorldSpec(num_docs=2000, seed=7),
        synth.output_under(str(folder)),
        docs_per_shard=1000,
        num_questions=num_questions,
        num_claims=0,
    )
    return str(folder / "hotpot" / "questions.json")


def log_run(args, result: dict) -> None:
    """One MLflow run per (data, system, seed) in one experiment: the UI compares them side by side."""
    import mlflow

    with mlflow.start_run(run_name=f"{result['data']}-{result['system']}-s{result['seed']}"):
        mlflow.log_params({k: v for k, v in result.items() if not isinstance(v, float) or k == "lr"})
        mlflow.log_metrics({k: v for k, v in result.items() if isinstance(v, float)})


def summary_table(results: list[dict]) -> str:
    """Markdown: mean ± sample std over seeds per (data, system)."""
    keys = ["em", "f1", "sp_em", "sp_f1", "joint_f1", "train_tokens_per_s", "infer_questions_per_s"]
    lines = ["| data | system | seeds | " + " | ".join(keys) + " |", "|" + "---|" * (len(keys) + 3)]
    groups: dict[tuple, list[dict]] = {}
    for r in results:
        groups.setdefault((r["data"], r["system"]), []).append(r)
    for (data, system), rs in groups.items():
        cells = []
        for k in keys:
            values = np.array([r[k] for r in rs], float)
            spread = values.std(ddof=1) if len(values) > 1 else 0.0
            cells.append(f"{values.mean():.3g} ± {spread:.2g}")
        lines.append(f"| {data} | {system} | {len(rs)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hotpot", default=str(DEFAULT_HOTPOT))
    parser.add_argument("--data", default="hotpot,world", help="hotpot (the real sample) and/or world (generated)")
    parser.add_argument("--world-questions", type=int, default=300, help="generated questions (80%% train)")
    parser.add_argument("--backbone", default=None, help="default: the offline all-MiniLM-L6-v2")
    parser.add_argument("--tiny", action="store_true", help="a random 3 x 64 BERT instead of the backbone")
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--seeds", default="0", help="comma-separated; the table gives mean ± std over them")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--batch", type=int, default=1, help="questions per training step")
    parser.add_argument("--train", type=int, default=400, help="training questions used (of 0-399)")
    parser.add_argument("--dev", type=int, default=12, help="dev questions scored (of 400-499)")
    parser.add_argument("--eval-batch", type=int, default=4)
    parser.add_argument("--max-node-tokens", type=int, default=128)
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--mlflow", default=None, help="tracking URI; default a SQLite file in the working folder")
    parser.add_argument("--experiment", default="variants")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    unknown = set(args.systems.split(",")) - set(SYSTEMS)
    if unknown:
        raise SystemExit(f"unknown systems {sorted(unknown)}; known: {', '.join(SYSTEMS)}")

    import mlflow

    from xh.model.backbones import resolve_backbone

    mlflow.set_tracking_uri(args.mlflow or f"sqlite:///{Path.cwd() / 'variants-mlflow.db'}")
    mlflow.set_experiment(args.experiment)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        backbone = tiny_backbone(Path(tmp) / "tiny") if args.tiny else resolve_backbone(args.backbone)
        for data in args.data.split(","):
            if data == "hotpot":
                questions, train_end = args.hotpot, TRAIN_END
            elif data == "world":
                questions = world_questions(Path(tmp) / "world", args.world_questions)
                train_end = int(args.world_questions * 0.8)
            else:
                raise SystemExit(f"unknown data {data!r}")
            # the same nodes either way; GESA reads the typed edges (`graphs.edge_mode: typed`)
            rows = {mode: load_rows(questions, train_end, mode) for mode in ("hyperlink", "typed")}
            for seed in [int(x) for x in args.seeds.split(",")]:
                args.seed = seed
                for system in args.systems.split(","):
                    kind, size = SYSTEMS[system]
                    train_rows, dev_rows = rows["typed" if kind == "gesa" else "hyperlink"]
                    if kind == "dochopper":
                        result = run_dochopper(args, backbone, train_rows, dev_rows, hops=size)
                    else:
                        result = run_xh(args, backbone, train_rows, dev_rows, hop_layers=size, variant=kind)
                    result = {
                        "data": data,
                        "system": system,
                        "seed": seed,
                        "steps": args.steps,
                        **result,
                        "backbone": "tiny" if args.tiny else Path(backbone).name,
                        "device": "cpu",
                        "threads": args.threads,
                        "train_questions": min(args.train, len(train_rows)),
                        "dev_questions": min(args.dev, len(dev_rows)),
                        "batch": args.batch,
                        "max_node_tokens": args.max_node_tokens,
                    }
                    log_run(args, result)
                    results.append(result)
                    print(json.dumps(result), flush=True)
    print(summary_table(results), flush=True)


if __name__ == "__main__":
    main()
