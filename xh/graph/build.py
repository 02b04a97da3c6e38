"""Building the `graphs` table in shards: a task's plan, one shard's build, the stage's summary.

    store = Store.from_config(cfg)
    plan = make_plan(cfg.graphs, store.at("runs/demo/tables"))   # distractor setting or FEVER
    build_shard = ShardBuilder(
        plan.make_builder, store.at("runs/demo/graphs/hotpot"), store.at("runs/demo/graphs/quarantine/hotpot")
    )
    per_shard = [build_shard(k, plan.items[i : i + 2000]) for k, i in enumerate(range(0, len(plan.items), 2000))]
    summary = summarize(len(plan.items), plan.quarantined, per_shard, max_node_tokens=512)

`xh.stages.graphs` runs the same with one `ShardBuilder` per Ray actor, one shard per call.

A plan (`TaskPlan`) holds a task's inputs, one JSON-able item per question, and a factory, run once
per builder, of the function that turns a list of items into (graph rows, quarantine rows, flag
counts). HotpotQA's distractor setting (`distractor_plan`) reads a question file with contexts; FEVER
(`fever_plan`) claims over the docs of `xh wiki process --format fever`. HotpotQA's retrieval setting
builds its graphs as scoring does (`xh.pipeline.Pipeline.graphs_of`), from `xh.stages.graphs`' plan of
the retrieve stage's questions and candidates. The rules of a graph are `xh.graph.hotpot`'s and
`xh.graph.fever`'s; with a tokenizer, a shard's graphs are also encoded (`xh.graph.encode`) for the
tokens-per-node figures.

Nothing is dropped silently: records refused upfront (`TaskPlan.quarantined`) + quarantined
questions + graphs = the questions read; the summary counts each.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import numpy as np

from xh import schemas
from xh.config import ConfigError, GraphsConfig
from xh.graph import store
from xh.graph.fever import FeverGraphBuilder, FeverGraphSettings, holds_gold_group
from xh.graph.hotpot import (
    NO_ANSWER,
    DistractorItem,
    Outcome,
    distractor_graphs,
    graph_stats,
    read_distractor_questions,
)
from xh.inputs.claims import claim_split, read_fever_claims
from xh.schemas import RAW_LIMIT
from xh.storage.store import Location

# items -> (GRAPHS rows, QUARANTINE rows, counted flags)
ShardBuild = Callable[[list[dict]], tuple[list[dict], list[dict], Counter]]


@dataclass
class TaskPlan:
    items: list[dict]  # one per question, JSON-able, each with its 1-based input "position"
    quarantined: list[dict]  # QUARANTINE rows of input records refused before graph building
    make_builder: Callable[[], ShardBuild]  # called once per builder (Ray actor)


def make_plan(settings: GraphsConfig, tables: Location) -> TaskPlan:
    """The plan of `settings.task` in a setting that retrieves nothing: HotpotQA's distractor setting, FEVER.
    `tables` holds the docs and links (question and claim files, `settings.questions`, are read through the
    same store); HotpotQA's retrieval setting is `xh.stages.graphs`' own (`xh.pipeline.Pipeline.graphs_of`)."""
    if settings.task == "hotpot":
        return distractor_plan(settings, tables)
    if settings.task == "fever":
        return fever_plan(settings, tables)
    raise ConfigError(f"graphs.task={settings.task!r} has no graph builder yet (built: fever, hotpot)")


# --- HotpotQA --------------------------------------------------------------------------------


def outcome_rows(items: list[dict], outcomes: list[Outcome], source: str) -> tuple[list[dict], list[dict], Counter]:
    """One outcome per item -> (GRAPHS rows, QUARANTINE rows naming `source`, the questions' file, flags)."""
    graphs, quarantined, flags = [], [], Counter()
    for item, outcome in zip(items, outcomes):
        flags.update(outcome.flags)
        if outcome.graph is not None:
            graphs.append(outcome.graph)
        else:
            raw = json.dumps(item["question"])[:RAW_LIMIT]
            quarantined.append({"source": source, "position": item["position"], "reason": outcome.reason, "raw": raw})
    return graphs, quarantined, flags


def _distractor_builder(settings: GraphsConfig, source: str) -> ShardBuild:
    def build(items: list[dict]):
        pairs = [DistractorItem(i["question"], [tuple(p) for p in i["context"]], i["position"]) for i in items]
        return outcome_rows(items, distractor_graphs(pairs, settings), source)

    return build


def distractor_plan(settings: GraphsConfig, tables: Location) -> TaskPlan:
    """HotpotQA questions with their contexts (`settings.questions`): a graph of each question's own paragraphs."""
    if not settings.questions:
        raise FileNotFoundError("no questions given: set graphs.questions (a HotpotQA file with contexts)")
    items, quarantined = read_distractor_questions(tables.store.at(settings.questions))
    plan_items = [{"position": i.position, "question": i.question, "context": i.context} for i in items]
    return TaskPlan(plan_items, quarantined, partial(_distractor_builder, settings, settings.questions))


# --- FEVER -----------------------------------------------------------------------------------


def _fever_builder(tables: Location, settings: FeverGraphSettings) -> ShardBuild:
    builder = FeverGraphBuilder.load(tables, settings)  # the page index, once per actor

    def build(items: list[dict]):
        claims = [i["claim"] for i in items]
        graphs, quarantined = builder.build(claims, [i["position"] for i in items])
        claim_of = {c["qid"]: c for c in claims}
        verdicts = [holds_gold_group(graph, claim_of[graph["qid"]]) for graph in graphs]
        flags = Counter(
            fever_verifiable=sum(v is not None for v in verdicts),
            fever_gold_group_in_graph=sum(v is True for v in verdicts),
        )
        return graphs, quarantined, flags

    return build


def fever_plan(settings: GraphsConfig, tables: Location) -> TaskPlan:
    """FEVER claims (`graphs.questions`, a FEVER JSON-lines file) over the docs of `xh wiki process --format fever`.

    `graphs.require_answer` plays its HotpotQA part, "training labels required": gold evidence
    sentences first, and verifiable claims whose gold is not in the corpus quarantined. With
    `graphs.claims_split` = dev or test only that split's claims are built, and by retrieval alone
    (no gold first, nothing quarantined for missing gold), whatever `require_answer` says. Graphs are
    always fully connected (the paper's FEVER graphs), whatever `graphs.edge_mode` says.
    """
    if not settings.questions:
        raise FileNotFoundError("no claims given: set graphs.questions (a FEVER claims file, JSON lines)")
    claims, quarantined = read_fever_claims(tables.store.at(settings.questions))
    items = [{"position": n, "claim": c} for n, c in enumerate(claims, start=1)]
    split = settings.claims_split
    if split != "all":  # one split: claims of the other splits are not this build's input
        fractions = settings.dev_fraction, settings.test_fraction
        items = [i for i in items if claim_split(i["claim"]["qid"], *fractions) == split]
    # Evaluation graphs are retrieval only, by construction: gold never chooses or orders their nodes.
    gold_first = settings.require_answer and split in ("all", "train")
    fever_settings = FeverGraphSettings(
        gold_evidence=gold_first, reranker=settings.sentence_reranker, rerank_pool=settings.sentence_rerank_pool
    )
    return TaskPlan(items, quarantined, partial(_fever_builder, tables, fever_settings))


# --- one shard -------------------------------------------------------------------------------


class ShardBuilder:
    """One shard of a plan's items per call -> its graphs file, its quarantine file, and its counts.

    The task's builder (`make_builder()`) and the tokenizer load once, when this is made.
    """

    def __init__(
        self,
        make_builder: Callable[[], ShardBuild],
        output: Location,
        quarantine: Location,
        tokenizer: str | None = None,
        max_node_tokens: int = 512,
    ):
        self.build = make_builder()
        self.output, self.quarantine, self.max_node_tokens = output, quarantine, max_node_tokens
        self.tokenizer = None
        if tokenizer:
            from transformers import AutoTokenizer

            self.tokenizer = AutoTokenizer.from_pretrained(tokenizer)

    def __call__(self, shard: int, items: list[dict]) -> dict:
        """Build and write shard `shard`; returns its counts for `summarize` (lists and dicts as JSON text,
        so that the counts of a shard are one flat row)."""
        graphs, quarantined, flags = self.build(items)
        if graphs:
            store.write_shard(graphs, self.output, shard, schemas.GRAPHS)
        if quarantined:
            store.write_shard(quarantined, self.quarantine, shard, schemas.QUARANTINE)
        stats = [graph_stats(g) for g in graphs]
        tokens, answer_kept = [], []
        if self.tokenizer is not None:
            from xh.graph.encode import encode_graph

            for graph in graphs:
                encoded = encode_graph(graph, self.tokenizer, self.max_node_tokens)
                tokens += [len(ids) for ids in encoded.input_ids]
                if graph.get("answer_type") == "span":
                    answer_kept.append(bool(len(encoded.answer_spans)))
        return {
            "items": len(items),
            "graphs": len(graphs),
            "quarantined": len(quarantined),
            "reasons": json.dumps(Counter(q["reason"] for q in quarantined)),
            "flags": json.dumps(flags),
            "stats": json.dumps(stats),
            "tokens": json.dumps(tokens),
            "answer_kept": json.dumps(answer_kept),
        }


# --- the summary -----------------------------------------------------------------------------


def _distribution(values: list[float]) -> dict | None:
    if not values:
        return None
    a = np.asarray(values, dtype=np.float64)
    return {
        "min": float(a.min()),
        "mean": round(float(a.mean()), 2),
        "p50": float(np.percentile(a, 50)),
        "p90": float(np.percentile(a, 90)),
        "max": float(a.max()),
    }


def summarize(plan_in: int, upfront: list[dict], per_shard: list[dict], max_node_tokens: int) -> dict:
    """The stage's figures from the plan's item count, its upfront quarantine and the shards' counts."""
    reasons = Counter(q["reason"] for q in upfront)
    flags: Counter = Counter()
    stats, tokens, kept = [], [], []
    for row in per_shard:
        reasons.update(json.loads(row["reasons"]))
        flags.update(json.loads(row["flags"]))
        stats += json.loads(row["stats"])
        tokens += json.loads(row["tokens"])
        kept += json.loads(row["answer_kept"])
    graphs = sum(r["graphs"] for r in per_shard)
    with_answer = sum(1 for s in stats if s["has_answer"])
    span_questions = sum(1 for s in stats if s["has_answer"] is not None) + reasons.get(NO_ANSWER, 0)
    with_facts = [s["supp_complete"] for s in stats if s["supp_complete"] is not None]
    return {
        "questions": plan_in + len(upfront),
        "graphs": graphs,
        "quarantined": sum(reasons.values()),
        "quarantine_reasons": dict(reasons),
        "flags": dict(flags),
        # share of span-answer questions (graphed or not) whose graph has a node holding the answer
        "answer_recall": round(with_answer / span_questions, 4) if span_questions else None,
        "answer_recall_after_truncation": round(sum(kept) / span_questions, 4) if span_questions and tokens else None,
        # share of graphs (quarantined questions aside) holding every gold supporting paragraph
        "supp_recall_in_graphs": round(sum(with_facts) / len(with_facts), 4) if with_facts else None,
        "nodes_per_graph": _distribution([s["nodes"] for s in stats]),
        "edges_per_graph": _distribution([s["edges"] for s in stats]),
        "tokens_per_node": _distribution(tokens),
        "nodes_at_token_limit": round(sum(t >= max_node_tokens for t in tokens) / len(tokens), 4) if tokens else None,
    }
