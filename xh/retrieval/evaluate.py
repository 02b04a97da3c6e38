"""Retrieval quality, the measures of the paper's Table 6, overall and per question type.

supp_recall@k   all gold supporting paragraphs are among the first k BM25 candidates
ans_recall@k    the answer string occurs in one of the first k BM25 candidates (span answers only:
                yes/no answers are not in any paragraph)
graph.*         the same over the nodes a graph is built from: BM25 top `ir_keep` ∪ entity links ∪ expansion

report = retrieval_report(question_rows, candidate_rows, docs_by_id, ir_keep=2)
"""

from __future__ import annotations

from collections import defaultdict

from xh.eval.hotpot import normalize_answer  # the official HotpotQA normalisation, one copy

KS = (2, 5, 10, 100)


def retrieval_report(
    questions: list[dict], candidates: list[dict], docs: dict[str, tuple[str, str]], ir_keep: int = 2, ks=KS
) -> dict:
    """`questions`: QUESTIONS rows; `candidates`: CANDIDATES rows; `docs`: doc_id -> (title, text)."""
    by_question: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    for row in candidates:
        by_question[row["qid"]][row["source"]].append(row)
    totals: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for q in questions:
        gold = {f["title"] for f in q.get("supporting_facts") or []}
        answer = normalize_answer(q["answer"] or "") if q.get("answer") not in (None, "yes", "no") else ""
        sources = by_question.get(q["qid"], {})
        ir = [r["doc_id"] for r in sorted(sources.get("ir", []), key=lambda r: r["rank"])]
        graph_nodes = (
            set(ir[:ir_keep])
            | {r["doc_id"] for r in sources.get("el", [])}
            | {r["doc_id"] for r in sources.get("exp", [])}
        )
        measures: dict[str, float] = {}
        for k in ks:
            measures[f"supp_recall@{k}"] = float(bool(gold) and gold <= _titles(ir[:k], docs))
            if answer:
                measures[f"ans_recall@{k}"] = float(_has_answer(ir[:k], docs, answer))
        measures["graph.supp_recall"] = float(bool(gold) and gold <= _titles(graph_nodes, docs))
        measures["graph.nodes"] = float(len(graph_nodes))
        if answer:
            measures["graph.ans_recall"] = float(_has_answer(graph_nodes, docs, answer))
        for group in ("all", q.get("type") or "unknown"):
            totals[group]["questions"] += 1
            totals[group]["span_answers"] += bool(answer)
            for name, value in measures.items():
                totals[group][name] += value
    report = {}
    for group, sums in totals.items():
        n, spans = sums["questions"], sums["span_answers"]
        report[group] = {"questions": int(n), "span_answers": int(spans)}
        for name, value in sums.items():
            if name in ("questions", "span_answers"):
                continue
            report[group][name] = (
                round(value / (spans if "ans_recall" in name else n), 4)
                if (spans if "ans_recall" in name else n)
                else None
            )
    return report


def _titles(doc_ids, docs: dict[str, tuple[str, str]]) -> set[str]:
    return {docs[d][0] for d in doc_ids if d in docs}


def _has_answer(doc_ids, docs: dict[str, tuple[str, str]], answer: str) -> bool:
    # whole words only: "art" is not found in "party"
    return any(f" {answer} " in f" {normalize_answer(docs[d][1])} " for d in doc_ids if d in docs)
