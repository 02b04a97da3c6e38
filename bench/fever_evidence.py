"""Benchmark: FEVER evidence recall@5 of BM25 sentence ranking against BM25 + the claim-sentence
re-ranker (`xh.retrieval.sentences`), same claims, same pages, same run.

    .venv/bin/python bench/fever_evidence.py --tables runs/demo-fever/tables \
        --claims runs/demo-fever/eval/test-claims.jsonl --reranker runs/demo-fever/models/sentence-reranker

`recall@5`: the share of SUPPORTS / REFUTES claims whose 5 graph sentences hold a whole gold group
(FEVER's evidence condition, `xh.graph.fever.evidence_recall`; a claim without a graph is a miss).
Prints one JSON line: both recalls, their ratio, the claims and the seconds per claim of each.
"""

from __future__ import annotations

import argparse
import json
import platform
import time

from xh.graph.fever import FeverGraphBuilder, FeverGraphSettings, evidence_recall
from xh.inputs.claims import read_fever_claims


def measure(tables: str, claims: list[dict], reranker: str | None, pool: int) -> dict:
    builder = FeverGraphBuilder.load(tables, FeverGraphSettings(reranker=reranker, rerank_pool=pool))
    unlabelled = [c | {"label": None, "evidence": None} for c in claims]  # retrieval alone, as evaluation builds
    start = time.perf_counter()
    graphs, _ = builder.build(unlabelled)
    seconds = time.perf_counter() - start
    return {"recall@5": evidence_recall(graphs, claims)["evidence_recall"], "s_per_claim": seconds / len(claims)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tables", required=True, help="tables folder with the FEVER docs")
    parser.add_argument("--claims", required=True, help="held-out FEVER claims with gold (JSON lines)")
    parser.add_argument("--reranker", required=True, help="trained sentence re-ranker folder")
    parser.add_argument("--pool", type=int, default=20, help="BM25's best sentences the re-ranker re-orders")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(2)
    claims, _ = read_fever_claims(args.claims)
    bm25 = measure(args.tables, claims, None, args.pool)
    reranked = measure(args.tables, claims, args.reranker, args.pool)
    verifiable = sum(bool(c["evidence"]) for c in claims)
    print(
        json.dumps(
            {
                "claims": len(claims),
                "verifiable_claims": verifiable,
                "bm25": bm25,
                "bm25_reranker": reranked,
                "ratio": reranked["recall@5"] / bm25["recall@5"] if bm25["recall@5"] else None,
                "machine": f"{platform.machine()} {torch.get_num_threads()} threads",
            }
        )
    )


if __name__ == "__main__":
    main()
