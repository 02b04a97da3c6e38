"""Benchmark: BM25 against BM25 + the cross-encoder re-ranker, recall@k on real HotpotQA, same run.

    .venv/bin/python bench/rerank.py --hotpot ../shared/data/hotpotqa/hotpot_train_sample500.json --train
    .venv/bin/python bench/rerank.py --hotpot FILE --reranker runs/demo/models/reranker   # a trained one
    .venv/bin/python bench/rerank.py --hotpot FILE                                        # BM25 alone

The corpus: every context paragraph of the file (one per title; 4,968 for the 500-question sample),
indexed as retrieval indexes it ("Title. paragraph", `xh.retrieval.bm25`). Questions `--eval`
(default records 400-499) get BM25's top `--top`; the re-ranker re-orders those same paragraphs.
`--train` first fine-tunes one on records `--train-records` (default 0-399) with the `rerank`
section's settings (`--set rerank.max_length=128` ...), in this process: the steps of
`xh.train.rerank` without Ray. Printed, for BM25 and the re-ranker (the measures of
`xh.retrieval.evaluate`, Table 6 of the paper):

    supp_recall@k   both gold paragraphs among the first k (k = 2, 5, 10)
    ans_recall@k    the answer string in one of the first k (span answers only)
    ratio           re-ranker / BM25 for each

Re-ranking cannot find what BM25's top `--top` misses: `supp_recall@{top}` of BM25 is the ceiling.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import time
from pathlib import Path

import torch

KS = (2, 5, 10)


def _span(text: str) -> slice:
    a, b = text.split(":")
    return slice(int(a), int(b))


def corpus_of(records: list[dict]) -> dict[str, tuple[str, str]]:
    """doc_id -> (title, text): every context paragraph of the records, one per title."""
    by_title: dict[str, str] = {}
    for record in records:
        for title, sentences in record["context"]:
            if sentences:
                by_title.setdefault(title, "".join(sentences))
    return {str(i): (t, x) for i, (t, x) in enumerate(by_title.items())}


def bm25_candidates(docs: dict[str, tuple[str, str]], questions: list[dict], top: int) -> list[dict]:
    from xh.retrieval.analyzer import Analyzer
    from xh.retrieval.bm25 import BM25Shard, CorpusStats
    from xh.retrieval.rerank import passage_text

    analyzer = Analyzer()
    ids = list(docs)
    tokens = analyzer.analyze_batch([passage_text(*docs[d]) for d in ids])
    shard = BM25Shard.build(ids, tokens, CorpusStats.from_token_lists(tokens))
    hits = shard.search(analyzer.analyze_batch([q["question"] for q in questions]), k=top)
    return [
        {"qid": q["qid"], "doc_id": d, "source": "ir", "score": float(s), "rank": rank}
        for q, hit in zip(questions, hits)
        for rank, (d, s) in enumerate(zip(hit.doc_ids, hit.scores))
    ]


def reranked(encoder, docs, questions: list[dict], candidates: list[dict]) -> list[dict]:
    from xh.retrieval.rerank import passage_text

    text = {q["qid"]: q["question"] for q in questions}
    rows = []
    for qid in text:
        mine = [r for r in candidates if r["qid"] == qid]
        scores = encoder.score(text[qid], [passage_text(*docs[r["doc_id"]]) for r in mine])
        order = sorted(range(len(mine)), key=lambda i: -scores[i])  # stable: BM25 order breaks ties
        rows += [mine[i] | {"score": float(scores[i]), "rank": rank} for rank, i in enumerate(order)]
    return rows


def train(records: list[dict], r, backbone: str, log_every: int = 10):
    """A re-ranker fine-tuned as `xh.train.rerank` does (one process, no Ray): the same pairs, loss and schedule."""
    from xh.retrieval.rerank import CrossEncoder, epoch_batches, examples_from_hotpot, listwise_loss, pair_loss
    from xh.train.rerank import training_units
    from xh.train.worker import adamw_with_warmup, optimizer_step, plan_steps, start_worker

    start_worker(r.seed, r.threads_per_worker)
    examples = examples_from_hotpot(records, r.negatives_per_positive, r.seed, r.negatives, r.bm25_pool)
    units, per_step, unit = training_units(r, examples)
    plan = plan_steps(len(units), workers=1, batch_size=per_step, epochs=r.epochs, max_steps=r.max_steps, unit=unit)
    encoder = CrossEncoder.from_backbone(backbone, r.max_length, pooling=r.pooling)
    optimizer, scheduler = adamw_with_warmup(
        [{"params": list(encoder.parameters()), "lr": r.lr, "weight_decay": 0.01}], plan.total_steps, r.warmup_fraction
    )
    loss_of = listwise_loss if r.loss == "listwise" else pair_loss
    print(f"training: {len(examples)} pairs, {len(units)} {unit}, {plan.total_steps} steps", flush=True)
    step, losses, start = 0, [], time.perf_counter()
    encoder.train()
    for epoch in range(math.ceil(plan.total_steps / plan.batches_per_epoch)):
        for batch in epoch_batches(units, per_step, r.seed, epoch)[: plan.total_steps - step]:
            loss = loss_of(encoder, encoder, batch)
            loss.backward()
            optimizer_step(encoder, optimizer, scheduler, max_grad_norm=1.0)
            step, losses = step + 1, [*losses, loss.item()]
            if step % log_every == 0:
                recent = sum(losses[-log_every:]) / log_every
                print(
                    f"  step {step}/{plan.total_steps} loss {recent:.4f} {time.perf_counter() - start:.0f}s", flush=True
                )
    first = losses[: max(1, len(losses) // 10)]
    last = losses[-max(1, len(losses) // 10) :]
    return encoder.eval(), {
        "pairs": len(examples),
        unit: len(units),
        "steps": plan.total_steps,
        "loss_first_10pct": round(sum(first) / len(first), 4),
        "loss_last_10pct": round(sum(last) / len(last), 4),
        "train_seconds": round(time.perf_counter() - start, 1),
    }


def main() -> None:
    from xh.backbones import resolve_backbone
    from xh.config import load_config
    from xh.retrieval.evaluate import retrieval_report
    from xh.retrieval.rerank import CrossEncoder

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hotpot", type=Path, required=True, help="HotpotQA file, distractor format")
    parser.add_argument("--eval", type=_span, default=_span("400:500"), help="records evaluated (default 400:500)")
    parser.add_argument("--train-records", type=_span, default=_span("0:400"), help="records trained on (--train)")
    parser.add_argument("--top", type=int, default=20, help="BM25 candidates the re-ranker re-orders")
    what = parser.add_mutually_exclusive_group()  # neither: BM25 alone
    what.add_argument("--reranker", help="a saved re-ranker folder")
    what.add_argument("--train", action="store_true", help="fine-tune one first (the `rerank` settings)")
    parser.add_argument("--set", action="append", default=[], help="rerank.KEY=VALUE overrides for --train")
    parser.add_argument("--save", help="--train: save the re-ranker here")
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    parser.add_argument("--json", type=Path, help="write the results here too")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    records = json.loads(args.hotpot.read_text())
    docs = corpus_of(records)
    evaluated = records[args.eval]
    questions = [
        {
            "qid": r["_id"],
            "question": r["question"],
            "answer": r.get("answer"),
            "type": r.get("type"),
            "supporting_facts": [{"title": t, "sent": i} for t, i in r.get("supporting_facts") or []],
        }
        for r in evaluated
    ]
    candidates = bm25_candidates(docs, questions, args.top)
    result: dict = {"corpus": len(docs), "questions": len(questions), "top": args.top, "machine": platform.node()}
    if args.train:
        cfg = load_config(None, [f"rerank.threads_per_worker={args.threads}", *args.set])
        result["settings"] = cfg.rerank.model_dump(mode="json")
        encoder, result["training"] = train(
            records[args.train_records], cfg.rerank, resolve_backbone(cfg.rerank.backbone)
        )
        if args.save:
            encoder.save(args.save)
    elif args.reranker:
        encoder = CrossEncoder.load(args.reranker)
    ks = tuple(sorted({*KS, args.top}))
    report = {"bm25": retrieval_report(questions, candidates, docs, ks=ks)["all"]}
    if args.train or args.reranker:
        start = time.perf_counter()
        rows = reranked(encoder, docs, questions, candidates)
        result["rerank_seconds"] = round(time.perf_counter() - start, 1)
        report["reranker"] = retrieval_report(questions, rows, docs, ks=ks)["all"]
    result["report"] = report
    print(f"{'measure':<18}{'BM25':>8}{'re-ranker':>11}{'ratio':>8}")
    for name in [f"{m}@{k}" for m in ("supp_recall", "ans_recall") for k in ks]:
        a, b = report["bm25"].get(name), report.get("reranker", {}).get(name, float("nan"))
        print(f"{name:<18}{a:>8.3f}{b:>11.3f}{(b / a if a else float('nan')):>8.2f}")
    print(json.dumps({k: v for k, v in result.items() if k != "report"}, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
