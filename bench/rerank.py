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

Re-ranking cannot find what BM25's top `--top` misses: `supp_recall@{top}` of BM25 is the ceiling
(the path scorer's second documents may also come from the links, past that ceiling).

`--paths` also trains a path re-ranker (`xh.retrieval.rerank.path_examples_from_hotpot`: the question
against two paragraphs at once, `--set rerank.max_length=...` shared) and reports `reranker+paths`:
the re-ranker's order with the best-scoring pair of its first `--path-top` moved to the front
(`best_path_first`), and `reranker+paths+fused`: the same with each pair's path logit plus both
paragraphs' re-ranker logits. `--path-scorer` trains the path scorer (`xh.retrieval.paths`) on the same
records and retrieves with it as a query actor does (`Retriever`: the BM25 shard, an entity linker
over the titles, links where a paragraph names another's title); `--path-neighbours 0` and
`--drop-features a_links_b b_links_a` are its ablations; `--path-expansion off` ranks expansion
neighbours by BM25 instead, and `graph.*` (the documents a graph would hold: the first two ir, the
entity links and `--expansion-keep` expansion documents) shows what that changes. It also times
retrieval of the evaluated questions (one call, as a query actor's batch) with the scorer and with BM25
alone, alternated, the best of `--timing-repeats` each: `retrieve_qps_with_scorer`,
`retrieve_qps_without_scorer` and their ratio `retrieve_with_over_without`. `--seeds 13 14 15` repeats the training per seed and adds the mean and sample std
of each measure over the seeds. `--device cuda` trains and scores on a GPU (bf16 autocast).
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


def bm25_shard(docs: dict[str, tuple[str, str]]):
    """The corpus as one BM25 shard, indexed as retrieval indexes it ("Title. paragraph")."""
    from xh.retrieval.analyzer import Analyzer
    from xh.retrieval.bm25 import BM25Shard, CorpusStats
    from xh.retrieval.rerank import passage_text

    analyzer = Analyzer()
    tokens = analyzer.analyze_batch([passage_text(*docs[d]) for d in docs])
    return BM25Shard.build(list(docs), tokens, CorpusStats.from_token_lists(tokens), analyzer=analyzer)


def bm25_candidates(docs: dict[str, tuple[str, str]], questions: list[dict], top: int, shard=None) -> list[dict]:
    shard = shard or bm25_shard(docs)
    hits = shard.search(shard.analyzer.analyze_batch([q["question"] for q in questions]), k=top)
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


def path_first(encoder, docs, questions: list[dict], ranked: list[dict], top: int, fuse: bool = False) -> list[dict]:
    """`ranked` (rows with a rank) with the path re-ranker's best pair of each question's first `top` in front;
    `fuse`: a pair's score adds the rows' own scores (the re-ranker's logits)."""
    from xh.retrieval.rerank import best_path_first, passage_text

    rows = []
    for q in questions:
        mine = sorted((r for r in ranked if r["qid"] == q["qid"]), key=lambda r: r["rank"])
        single = [r["score"] for r in mine] if fuse else None
        passages = [passage_text(*docs[r["doc_id"]]) for r in mine]
        order = best_path_first(encoder, q["question"], passages, top, single_scores=single)
        rows += [mine[i] | {"rank": rank} for rank, i in enumerate(order)]
    return rows


def corpus_retriever(docs: dict[str, tuple[str, str]], shard, ir_candidates: int):
    """The corpus as a query actor holds it (`xh.retrieval.candidates.Retriever`): the BM25 shard, an
    entity linker over the titles, and a link graph. The sample's paragraphs carry no hyperlinks, so a
    paragraph links to each paragraph whose title the same linker finds in its text (as the distractor
    graphs' `mention_links` do within one question's context)."""
    import pyarrow as pa

    from xh import schemas
    from xh.config import RetrieveConfig
    from xh.retrieval.candidates import Retriever
    from xh.retrieval.entity_linking import EntityLinker
    from xh.retrieval.expansion import LinkGraph

    ids = list(docs)
    titles = pa.table({"doc_id": ids, "title": [docs[d][0] for d in ids]})
    linker = EntityLinker.from_tables(pa.Table.from_pylist([], schema=schemas.ANCHORS), titles)
    rows = [
        {"src_doc_id": d, "target_title": docs[m.doc_id][0], "target_doc_id": m.doc_id}
        | {"anchor": m.surface, "sentence": 0, "missing": False}
        for d, mentions in zip(ids, linker.link_batch([docs[d][1] for d in ids]))
        for m in mentions
        if m.doc_id != d
    ]
    graph = LinkGraph.from_table(pa.Table.from_pylist(rows, schema=schemas.LINKS))
    return Retriever([shard], linker, graph, RetrieveConfig(ir_candidates=ir_candidates)), len(rows)


def path_scorer_runs(records, docs, shard, questions, args, ks) -> tuple[dict, list[dict]]:
    """`--path-scorer`: one scorer per seed trained on `--train-records`, evaluated as retrieval runs it."""
    import numpy as np

    from xh.retrieval.evaluate import retrieval_report
    from xh.retrieval.paths import FEATURES, PathCandidates, PathScorer

    start = time.perf_counter()
    retriever, num_links = corpus_retriever(docs, shard, max(args.top, 100))
    update = {"path_neighbours": args.path_neighbours, "path_expansion": args.path_expansion == "on"}
    retriever.settings = retriever.settings.model_copy(update=update | {"expansion_keep": args.expansion_keep})
    dropped = [FEATURES.index(f) for f in args.drop_features]

    def without(features: np.ndarray) -> np.ndarray:
        """An ablation: the dropped features read 0, in training and at retrieval."""
        kept = features.copy()
        kept[:, dropped] = 0.0
        return kept

    by_title = {title: d for d, (title, _) in docs.items()}
    train = records[args.train_records]
    groups = [
        PathCandidates(g.pairs, without(g.features)) for g in retriever.question_paths([r["question"] for r in train])
    ]
    gold = [{by_title.get(t, f"missing:{t}") for t, _ in r["supporting_facts"]} for r in train]
    info = {
        "links": num_links,
        "pairs_per_question": sum(len(g.pairs) for g in groups) / len(groups),
        "train_pair_among_candidates": sum(any(set(p) == g for p in c.pairs) for c, g in zip(groups, gold)) / len(gold),
        "feature_seconds": round(time.perf_counter() - start, 1),
    }
    qids, texts = [q["qid"] for q in questions], [q["question"] for q in questions]
    retriever.candidates(qids[:5], texts[:5])  # warm-up

    def timed(scorer) -> tuple[float, list[dict]]:
        """Seconds to retrieve every evaluated question (one call, as an actor's batch) and the rows."""
        retriever.path_scorer = scorer
        start = time.perf_counter()
        rows = retriever.candidates(qids, texts)
        return time.perf_counter() - start, rows

    runs, bm25_alone = [], []
    for seed in args.seeds or [13]:
        start = begin = time.perf_counter()
        scorer = PathScorer.fit(groups, gold, seed=seed)
        scorer.score = lambda features, fitted=scorer.score: fitted(without(features))
        info.setdefault("fit_seconds", []).append(round(time.perf_counter() - start, 2))
        timed(scorer)  # warm-up
        # BM25 alone (entity links, expansion: what the scorer adds to) and with the scorer, alternated so
        # that other work on the machine slows both alike; the best of `--timing-repeats` each
        alone, scored = [], []
        for _ in range(args.timing_repeats):
            alone.append(timed(None)[0])
            seconds, rows = timed(scorer)
            scored.append(seconds)
        bm25_alone.append(min(alone))
        info.setdefault("retrieve_qps_with_scorer", []).append(round(len(qids) / min(scored), 1))
        info.setdefault("retrieve_with_over_without", []).append(round(min(alone) / min(scored), 3))
        report = retrieval_report(questions, rows, docs, ks=ks)
        by_type = {f"{t}.supp_recall@2": report[t]["supp_recall@2"] for t in ("bridge", "comparison") if t in report}
        runs.append({"seed": seed, "seconds": round(time.perf_counter() - begin, 1), **report["all"], **by_type})
        print(json.dumps({"path_scorer_seed": seed, **{k: runs[-1][k] for k in ("supp_recall@2", "ans_recall@2")}}))
    info["retrieve_qps_without_scorer"] = round(len(qids) / min(bm25_alone), 1)
    return info, runs


def autocast(device: str):
    """bf16 autocast on a GPU (as training runs there), nothing on a CPU."""
    import contextlib

    return torch.autocast("cuda", dtype=torch.bfloat16) if device.startswith("cuda") else contextlib.nullcontext()


def train(records: list[dict], r, backbone: str, device: str = "cpu", paths: bool = False, log_every: int = 10):
    """A re-ranker fine-tuned as `xh.train.rerank` does (one process, no Ray): the same pairs, loss and schedule;
    `paths`: a path re-ranker (pairs of paragraphs, listwise over each question's pairs)."""
    from xh.retrieval.rerank import (
        CrossEncoder,
        epoch_batches,
        examples_from_hotpot,
        listwise_loss,
        pair_loss,
        path_examples_from_hotpot,
    )
    from xh.train.rerank import training_units
    from xh.train.worker import adamw_with_warmup, optimizer_step, plan_steps, start_worker

    start_worker(r.seed, r.threads_per_worker)
    if paths:
        examples = path_examples_from_hotpot(records, r.path_negatives, r.seed, r.bm25_pool)
    else:
        examples = examples_from_hotpot(records, r.negatives_per_positive, r.seed, r.negatives, r.bm25_pool)
    units, per_step, unit = training_units(r, examples)
    plan = plan_steps(len(units), workers=1, batch_size=per_step, epochs=r.epochs, max_steps=r.max_steps, unit=unit)
    encoder = CrossEncoder.from_backbone(backbone, r.max_length, pooling=r.pooling).to(device)
    optimizer, scheduler = adamw_with_warmup(
        [{"params": list(encoder.parameters()), "lr": r.lr, "weight_decay": 0.01}], plan.total_steps, r.warmup_fraction
    )
    loss_of = listwise_loss if r.loss == "listwise" else pair_loss
    print(f"training: {len(examples)} pairs, {len(units)} {unit}, {plan.total_steps} steps", flush=True)
    step, losses, start = 0, [], time.perf_counter()
    encoder.train()
    for epoch in range(math.ceil(plan.total_steps / plan.batches_per_epoch)):
        for batch in epoch_batches(units, per_step, r.seed, epoch)[: plan.total_steps - step]:
            with autocast(device):
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
        "kind": "paths" if paths else "paragraphs",
        "pairs": len(examples),
        unit: len(units),
        "steps": plan.total_steps,
        "loss_first_10pct": round(sum(first) / len(first), 4),
        "loss_last_10pct": round(sum(last) / len(last), 4),
        "train_seconds": round(time.perf_counter() - start, 1),
    }


def main() -> None:
    from xh.config import load_config
    from xh.model.backbones import resolve_backbone
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
    parser.add_argument("--paths", action="store_true", help="--train: a path re-ranker too")
    parser.add_argument(
        "--path-scorer", action="store_true", help="a path scorer (xh.retrieval.paths) per seed, as retrieval runs it"
    )
    parser.add_argument("--path-neighbours", type=int, default=10, help="--path-scorer: retrieve.path_neighbours")
    parser.add_argument(
        "--path-expansion", choices=("on", "off"), default="on", help="--path-scorer: retrieve.path_expansion"
    )
    parser.add_argument("--expansion-keep", type=int, default=15, help="--path-scorer: retrieve.expansion_keep")
    parser.add_argument(
        "--timing-repeats", type=int, default=5, help="--path-scorer: timed retrievals with and without it (best kept)"
    )
    parser.add_argument(
        "--drop-features", nargs="+", default=[], help="--path-scorer ablation: these FEATURES read 0 (a_links_b ...)"
    )
    parser.add_argument("--path-top", type=int, default=10, help="pairs among the re-ranker's first N (--paths)")
    parser.add_argument("--seeds", type=int, nargs="+", help="--train: one training per seed (rerank.seed)")
    parser.add_argument("--set", action="append", default=[], help="rerank.KEY=VALUE overrides for --train")
    parser.add_argument("--save", help="--train: save the (last seed's) re-ranker here")
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
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
    shard = bm25_shard(docs)
    candidates = bm25_candidates(docs, questions, args.top, shard)
    ks = tuple(sorted({*KS, args.top}))
    result: dict = {"corpus": len(docs), "questions": len(questions), "top": args.top, "machine": platform.node()}
    result["device"] = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    bm25 = retrieval_report(questions, candidates, docs, ks=ks)
    by_type = {f"{t}.supp_recall@2": bm25[t]["supp_recall@2"] for t in ("bridge", "comparison") if t in bm25}
    report = {"bm25": bm25["all"] | by_type}

    def evaluate(encoder, paths=None) -> dict:
        start = time.perf_counter()
        with autocast(args.device):
            rows = reranked(encoder, docs, questions, candidates)
            out = {"reranker": retrieval_report(questions, rows, docs, ks=ks)["all"]}
            if paths is not None:
                for name, fuse in (("reranker+paths", False), ("reranker+paths+fused", True)):
                    ordered = path_first(paths, docs, questions, rows, args.path_top, fuse)
                    out[name] = retrieval_report(questions, ordered, docs, ks=ks)["all"]
        out["seconds"] = round(time.perf_counter() - start, 1)
        return out

    if args.train:
        runs = []
        for seed in args.seeds or [None]:
            seed_set = [f"rerank.seed={seed}"] if seed is not None else []
            cfg = load_config(None, [f"rerank.threads_per_worker={args.threads}", *args.set, *seed_set])
            result["settings"] = cfg.rerank.model_dump(mode="json")
            backbone = resolve_backbone(cfg.rerank.backbone)
            encoder, training = train(records[args.train_records], cfg.rerank, backbone, args.device)
            paths = None
            if args.paths:
                paths, training["paths"] = train(records[args.train_records], cfg.rerank, backbone, args.device, True)
            run = {"seed": cfg.rerank.seed, "training": training, **evaluate(encoder, paths)}
            print(json.dumps({"seed": run["seed"], **{k: v for k, v in run.items() if k != "seed"}}), flush=True)
            runs.append(run)
            if args.save:
                encoder.save(args.save)
        result["runs"] = runs
        for name in ("reranker", "reranker+paths", "reranker+paths+fused"):
            if name in runs[0]:
                report[name] = spread([run[name] for run in runs])
    elif args.reranker:
        report.update(evaluate(CrossEncoder.load(args.reranker).to(args.device)))
        report.pop("seconds")
    if args.path_scorer:
        result["path_scorer"], result["path_scorer_runs"] = path_scorer_runs(records, docs, shard, questions, args, ks)
        report["path scorer"] = spread(result["path_scorer_runs"])
    result["report"] = report
    names = [n for n in ("reranker", "reranker+paths", "reranker+paths+fused", "path scorer") if n in report]
    print(f"{'measure':<18}{'BM25':>8}" + "".join(f"{n:>22}" for n in names))
    graph = ["graph.supp_recall", "graph.ans_recall", "graph.nodes"] if args.path_scorer else []
    for measure in [f"{m}@{k}" for m in ("supp_recall", "ans_recall") for k in ks] + list(by_type) + graph:
        bm25_value = report["bm25"].get(measure) if not measure.startswith("graph.") else None
        row = f"{measure:<18}" + (f"{bm25_value:>8.3f}" if bm25_value is not None else f"{'-':>8}")
        for n in names:
            value, std = report[n].get(measure), report[n].get(f"{measure}_std", 0.0)
            row += f"{value:>16.3f} ±{std:.3f}" if value is not None else f"{'-':>22}"
        print(row)
    print(json.dumps({k: v for k, v in result.items() if k not in ("report", "runs")}, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


def spread(reports: list[dict]) -> dict:
    """The mean of each measure over seeds, with its sample std (`<measure>_std`, 0 for one seed)."""
    import statistics

    out = {}
    for measure, value in reports[0].items():
        if isinstance(value, (int, float)):
            values = [r[measure] for r in reports]
            out[measure] = statistics.fmean(values)
            out[f"{measure}_std"] = statistics.stdev(values) if len(values) > 1 else 0.0
    return out


if __name__ == "__main__":
    main()
