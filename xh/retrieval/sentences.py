"""The cross-encoder re-ranker (`xh.retrieval.rerank`) on FEVER's claim-sentence pairs: between BM25's
sentence ranking and the top 5 evidence sentences of a claim's graph.

    examples = sentence_examples(claims, builder, negatives_per_positive=3, seed=13)   # training pairs
    examples = xh.graph.fever.sentence_training_examples(claims_uri, tables_uri, 3, 13)  # of a claims file
    xh rerank --set rerank.claims=train-claims.jsonl          # trains it (`workflows.rerank`), as for paragraphs
    xh graphs build --set graphs.task=fever --set graphs.sentence_reranker=runs/demo-fever/models/sentence-reranker

A sentence is read as `passage_text(title, sentence)` ("Title. sentence", as BM25 reads it). Training
pairs: each gold sentence of a SUPPORTS / REFUTES claim is a positive; the negatives are the best
BM25-ranked sentences of the claim's candidate pages that are not gold (hard negatives), up to
`negatives_per_positive` per positive. At graph time BM25's best `rerank_pool` sentences are
re-ordered by the cross-encoder's logit (which becomes the node's score); the rest keep BM25's order.
Give it only training claims (`xh.inputs.claims.write_claim_split`): it learns from their gold.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from xh.retrieval.rerank import Example, passage_text

__all__ = ["sentence_examples", "rerank_sentences"]


def sentence_examples(
    claims: Sequence[dict], builder, negatives_per_positive: int = 3, seed: int = 13
) -> list[Example]:
    """CLAIMS rows -> claim-sentence pairs over `builder`'s pages (`xh.graph.fever.FeverGraphBuilder`)."""
    rng = random.Random(seed)
    examples: list[Example] = []
    verifiable = [c for c in claims if c.get("evidence")]
    for claim, (pages, _) in zip(verifiable, builder.candidate_pages([c["claim"] for c in verifiable])):
        gold = [builder._locate(s["page"], s["line"]) for group in claim["evidence"] for s in group]
        gold = list(dict.fromkeys(g for g in gold if not isinstance(g, str)))
        if not gold:
            continue
        positives = [passage_text(builder.titles[p], builder.sentences[p][line]) for p, line in gold]
        gold_ids = {(builder.doc_ids[p], line) for p, line in gold}
        ranked = [s for s in builder.rank_sentences(claim["claim"], pages) if (s.doc_id, s.line) not in gold_ids]
        negatives = [passage_text(s.title, s.sentence) for s in ranked[: negatives_per_positive * len(positives)]]
        pairs = [(text, 1.0) for text in positives] + [(text, 0.0) for text in negatives]
        rng.shuffle(pairs)
        examples += [Example(claim["qid"], claim["claim"], text, label) for text, label in pairs]
    return examples


def rerank_sentences(encoder, claim: str, ranked: list, pool: int) -> list:
    """BM25-ranked `EvidenceSentence`s with the first `pool` re-ordered by the cross-encoder's logit
    (their score becomes the logit; ties keep BM25's order); the rest follow unchanged."""
    head = ranked[:pool]
    if not head:
        return ranked
    logits = encoder.score(claim, [passage_text(s.title, s.sentence) for s in head])
    order = sorted(range(len(head)), key=lambda i: -float(logits[i]))
    return [head[i]._replace(score=float(logits[i])) for i in order] + ranked[pool:]
