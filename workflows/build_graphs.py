"""Evidence graphs on Ray Data: questions -> the sharded `graphs` table, a quarantine table, a summary.

    xh graphs build                                                    # retrieval setting, from <root>/retrieval
    xh graphs build --set graphs.setting=distractor \\
        --set graphs.questions=../shared/data/hotpotqa/hotpot_train_sample500.json
    python -m workflows.build_graphs --config my.yaml --set graphs.edge_mode=bidirectional

    for row in read_graphs("runs/demo/graphs/hotpot").iter_rows(): ...   # for the trainer (a Ray dataset)

The driver reads the (small) inputs and cuts them into shards of `graphs.questions_per_file`
questions; an actor pool of `graphs.workers` builders turns each shard into one Parquet file of
graphs (`<output>/part-NNNNN.parquet`) and one of quarantined questions (`<quarantine>/...`), and
hands back only counts. A retrieval-setting builder first loads the docs and links of the documents
its questions can use (never the whole corpus). The rules of a graph are the library's
(`xh.graph.hotpot`); with `graphs.tokenizer` set, each builder also encodes its graphs
(`xh.graph.encode`) for the tokens-per-node figures.

Nothing is dropped silently: questions in = graphs out + quarantined (bad records, "no node contains
the answer", ...), or the run fails. `run` logs the config and the summary to an MLflow run;
`build` does the same work without tracking, for drivers that track it themselves (the demo).

A task is a `TaskPlan`: its inputs (one JSON-able item per question) and a factory, run once per
actor, of the function that turns a list of items into (graph rows, quarantine rows, flag counts).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass
from functools import partial
from typing import Callable

import numpy as np
import pyarrow.compute as pc
import pyarrow.dataset as pads

from workflows.common import init_ray, log, main, s3_settings
from xh import schemas
from xh.config import ConfigError, XHConfig
from xh.graph import store
from xh.graph.hotpot import (
    NO_ANSWER, DistractorItem, GraphSettings, HotpotGraphBuilder, Outcome, distractor_graphs, graph_stats,
    read_distractor_questions,
)  # fmt: skip
from xh.schemas import RAW_LIMIT
from xh.storage import S3Settings, join, open_output, resolve

# items -> (GRAPHS rows, QUARANTINE rows, counted flags)
ShardBuild = Callable[[list[dict]], tuple[list[dict], list[dict], Counter]]


@dataclass
class TaskPlan:
    items: list[dict]  # one per question, JSON-able, each with its 1-based input "position"
    quarantined: list[dict]  # QUARANTINE rows of input records refused before graph building
    make_builder: Callable[[], ShardBuild]  # called once per actor
    source: str  # what quarantine rows name as their source


def paths(cfg: XHConfig) -> dict[str, str]:
    g, root = cfg.graphs, cfg.storage.root
    return {
        "output": g.output or join(root, "graphs", g.task),
        "quarantine": g.quarantine or join(root, "graphs", "quarantine", g.task),
        "retrieval": g.retrieval or join(root, "retrieval"),
        "tables": g.tables or join(root, "tables"),
    }


def settings_of(cfg: XHConfig) -> GraphSettings:
    g = cfg.graphs
    return GraphSettings(ir_keep=g.ir_keep, el_per_surface=g.el_per_surface, expansion_keep=g.expansion_keep,
                         edge_mode=g.edge_mode, comparison_full=g.comparison_full, seed=g.seed,
                         require_answer=g.require_answer)  # fmt: skip


# --- HotpotQA --------------------------------------------------------------------------------


def _rows_of(items: list[dict], outcomes: list[Outcome], source: str) -> tuple[list[dict], list[dict], Counter]:
    graphs, quarantined, flags = [], [], Counter()
    for item, outcome in zip(items, outcomes):
        flags.update(outcome.flags)
        if outcome.graph is not None:
            graphs.append(outcome.graph)
        else:
            raw = json.dumps(item["question"])[:RAW_LIMIT]
            quarantined.append({"source": source, "position": item["position"], "reason": outcome.reason, "raw": raw})
    return graphs, quarantined, flags


def _distractor_builder(settings: GraphSettings, source: str) -> ShardBuild:
    def build(items: list[dict]):
        pairs = [DistractorItem(i["question"], [tuple(p) for p in i["context"]], i["position"]) for i in items]
        return _rows_of(items, distractor_graphs(pairs, settings), source)

    return build


def _retrieval_builder(tables: str, doc_ids: list[str], settings: GraphSettings, s3: S3Settings, source: str) -> ShardBuild:
    builder = HotpotGraphBuilder.load(tables, doc_ids, settings, s3)

    def build(items: list[dict]):
        questions = [i["question"] for i in items]
        outcomes = builder.build_many(questions, {i["question"]["qid"]: i["candidates"] for i in items})
        return _rows_of(items, outcomes, source)

    return build


def hotpot_plan(cfg: XHConfig) -> TaskPlan:
    g, s3, p, settings = cfg.graphs, s3_settings(cfg), paths(cfg), settings_of(cfg)
    if g.setting == "distractor":
        if not g.questions:
            raise FileNotFoundError("no questions given: set graphs.questions (a HotpotQA file with contexts)")
        items, quarantined = read_distractor_questions(g.questions, s3)
        plan_items = [{"position": i.position, "question": i.question, "context": i.context} for i in items]
        return TaskPlan(plan_items, quarantined, partial(_distractor_builder, settings, g.questions), g.questions)

    fs, root = resolve(p["retrieval"], s3)
    for name in ("questions", "candidates"):
        if fs.get_file_info(f"{root}/{name}").type.name == "NotFound":
            raise FileNotFoundError(f"no {name} under {p['retrieval']}: run `xh retrieve run` first")
    questions = pads.dataset(f"{root}/questions", filesystem=fs, format="parquet").to_table().to_pylist()
    candidates = pads.dataset(f"{root}/candidates", filesystem=fs, format="parquet").to_table(
        columns=["qid", "doc_id", "source", "score", "rank", "surface"]
    )
    # only candidates a graph can use travel to the builders
    source, rank = candidates["source"], candidates["rank"]
    usable = pc.or_(
        pc.or_(
            pc.and_(pc.equal(source, "ir"), pc.less(rank, settings.ir_keep)),
            pc.and_(pc.equal(source, "exp"), pc.less(rank, settings.expansion_keep)),
        ),
        pc.equal(source, "el"),
    )
    candidates = candidates.filter(usable)
    by_qid: dict[str, list[dict]] = {}
    for row in candidates.to_pylist():
        by_qid.setdefault(row["qid"], []).append(row)
    doc_ids = sorted(set(candidates["doc_id"].to_pylist()))
    items = [{"position": n, "question": q, "candidates": by_qid.get(q["qid"], [])} for n, q in enumerate(questions, start=1)]
    source_name = join(p["retrieval"], "questions")
    return TaskPlan(items, [], partial(_retrieval_builder, p["tables"], doc_ids, settings, s3, source_name), source_name)


# --- FEVER -----------------------------------------------------------------------------------


def _fever_builder(tables: str, settings, s3: S3Settings) -> ShardBuild:
    from xh.graph.fever import FeverGraphBuilder, holds_gold_group

    builder = FeverGraphBuilder.load(tables, settings, s3)  # the page index, once per actor

    def build(items: list[dict]):
        claims = [i["claim"] for i in items]
        graphs, quarantined = builder.build(claims, [i["position"] for i in items])
        claim_of = {c["qid"]: c for c in claims}
        verdicts = [holds_gold_group(g, claim_of[g["qid"]]) for g in graphs]
        flags = Counter(fever_verifiable=sum(v is not None for v in verdicts), fever_gold_group_in_graph=sum(v is True for v in verdicts))
        return graphs, quarantined, flags

    return build


def fever_plan(cfg: XHConfig) -> TaskPlan:
    """FEVER claims (`graphs.questions`, a FEVER JSON-lines file) over the docs of `xh wiki process --format fever`.

    `graphs.require_answer` plays its HotpotQA part, "training labels required": gold evidence
    sentences first, and verifiable claims whose gold is not in the corpus quarantined. Graphs are
    always fully connected (the paper's FEVER graphs), whatever `graphs.edge_mode` says.
    """
    from xh.fever import read_fever_claims
    from xh.graph.fever import FeverGraphSettings

    g, s3, p = cfg.graphs, s3_settings(cfg), paths(cfg)
    if not g.questions:
        raise FileNotFoundError("no claims given: set graphs.questions (a FEVER claims file, JSON lines)")
    claims, quarantined = read_fever_claims(g.questions, s3)
    items = [{"position": n, "claim": c} for n, c in enumerate(claims, start=1)]
    settings = FeverGraphSettings(gold_evidence=g.require_answer)
    return TaskPlan(items, quarantined, partial(_fever_builder, p["tables"], settings, s3), g.questions)


# Each task's plan.
PLANS: dict[str, Callable[[XHConfig], TaskPlan]] = {"hotpot": hotpot_plan, "fever": fever_plan}


# --- the Ray part ----------------------------------------------------------------------------


class _ShardWorker:
    """Ray Data actor: builds the task's builder once, then one shard of items per call -> two files + counts."""

    def __init__(self, make_builder, output: str, quarantine: str, tokenizer: str | None, max_node_tokens: int, s3):
        self.build = make_builder()
        self.output, self.quarantine, self.s3, self.max_node_tokens = output, quarantine, s3, max_node_tokens
        self.tokenizer = None
        if tokenizer:
            from transformers import AutoTokenizer

            self.tokenizer = AutoTokenizer.from_pretrained(tokenizer)

    def __call__(self, batch: dict) -> dict:
        shard, items = int(batch["shard"][0]), json.loads(batch["items"][0])
        graphs, quarantined, flags = self.build(items)
        if graphs:
            store.write_shard(graphs, self.output, shard, schemas.GRAPHS, self.s3)
        if quarantined:
            store.write_shard(quarantined, self.quarantine, shard, schemas.QUARANTINE, self.s3)
        stats = [graph_stats(g) for g in graphs]
        tokens, answer_kept = [], []
        if self.tokenizer is not None:
            from xh.graph.encode import encode_graph

            for graph in graphs:
                encoded = encode_graph(graph, self.tokenizer, self.max_node_tokens)
                tokens += [len(ids) for ids in encoded.input_ids]
                if graph.get("answer_type") == "span":
                    answer_kept.append(bool(len(encoded.answer_spans)))
        row = {
            "items": len(items),
            "graphs": len(graphs),
            "quarantined": len(quarantined),
            "reasons": json.dumps(Counter(q["reason"] for q in quarantined)),
            "flags": json.dumps(flags),
            "stats": json.dumps(stats),
            "tokens": json.dumps(tokens),
            "answer_kept": json.dumps(answer_kept),
        }
        return {key: [value] for key, value in row.items()}


def _distribution(values: list[float]) -> dict | None:
    if not values:
        return None
    a = np.asarray(values, dtype=np.float64)
    return {"min": float(a.min()), "mean": round(float(a.mean()), 2), "p50": float(np.percentile(a, 50)),
            "p90": float(np.percentile(a, 90)), "max": float(a.max())}  # fmt: skip


def summarize(plan_in: int, upfront: list[dict], per_shard: list[dict], max_node_tokens: int) -> dict:
    """The stage's figures from the shards' counts (see `build`)."""
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


def build(cfg: XHConfig) -> dict:
    """Build the graphs of `cfg.graphs.task`; returns the summary (also written to `<output>/_summary.json`)."""
    import ray.data
    from ray.data import ActorPoolStrategy

    g, s3, p = cfg.graphs, s3_settings(cfg), paths(cfg)
    if g.task not in PLANS:
        raise ConfigError(f"graphs.task={g.task!r} has no graph builder yet (built: {', '.join(sorted(PLANS))})")
    start = time.perf_counter()
    plan = PLANS[g.task](cfg)
    store.clear_folder(p["output"], s3)
    store.clear_folder(p["quarantine"], s3)
    shards = [
        {"shard": k, "items": json.dumps(plan.items[i : i + g.questions_per_file])}
        for k, i in enumerate(range(0, len(plan.items), g.questions_per_file))
    ]
    if plan.quarantined:  # records refused before graph building: one file, numbered after the shards
        store.write_shard(plan.quarantined, p["quarantine"], len(shards), schemas.QUARANTINE, s3)
    per_shard: list[dict] = []
    if shards:
        init_ray(cfg)
        workers = min(g.workers, len(shards))
        log("graphs", f"building {g.task} graphs ({g.setting}) for {len(plan.items):,} questions in {len(shards)} "
                      f"shard(s) with {workers} actor(s) -> {p['output']}")  # fmt: skip
        per_shard = (
            ray.data.from_items(shards, override_num_blocks=len(shards))
            .map_batches(
                _ShardWorker,
                batch_size=1,
                compute=ActorPoolStrategy(size=workers),
                num_cpus=g.cpus_per_worker,
                fn_constructor_args=(plan.make_builder, p["output"], p["quarantine"], g.tokenizer, g.max_node_tokens, s3),
            )
            .take_all()
        )
    if sum(r["items"] for r in per_shard) != len(plan.items):
        raise RuntimeError(f"{len(plan.items)} questions went to the builders but {sum(r['items'] for r in per_shard)} came back")
    summary = {"task": g.task, "setting": g.setting, "edge_mode": g.edge_mode,
               **summarize(len(plan.items), plan.quarantined, per_shard, g.max_node_tokens)}  # fmt: skip
    if summary["questions"] != summary["graphs"] + summary["quarantined"]:
        raise RuntimeError(f"questions in != graphs out + quarantined: {summary}")
    summary.update(output=p["output"], quarantine=p["quarantine"], seconds=round(time.perf_counter() - start, 3))
    with open_output(join(p["output"], "_summary.json"), s3) as f:
        f.write(json.dumps(summary, indent=1).encode())
    log("graphs", f"{summary['graphs']:,} graphs, {summary['quarantined']:,} quarantined in {summary['seconds']} s")
    return summary


def run(cfg: XHConfig) -> dict:
    """`build`, tracked: the stage's config as params, the summary's numbers as metrics, the summary as a file."""
    import mlflow

    from xh.tracking import flatten_numbers
    from xh.tracking import stage_run

    with stage_run(cfg, "graphs", s3=s3_settings(cfg)) as tracked:
        summary = build(cfg)
        mlflow.log_metrics(flatten_numbers(summary))
        mlflow.log_dict(summary, "graphs_summary.json")
    return {"mlflow_run_id": tracked.info.run_id, **summary}


def read_graphs(uri: str, s3: S3Settings | None = None, num_cpus: float = 0.25):
    """A graphs folder as a Ray dataset of GRAPHS rows (`xh.graph.store.iter_graphs` reads it without Ray).

    Read tasks ask for a fraction of a CPU, so that they still run beside actors or trainers holding the rest.
    """
    import ray.data

    fs, path = resolve(uri, s3)
    if fs.get_file_info(path).type.name == "NotFound":
        raise FileNotFoundError(f"no graphs at {uri} (run `xh graphs build` first)")
    return ray.data.read_parquet(path, filesystem=fs, file_extensions=["parquet"], num_cpus=num_cpus)


if __name__ == "__main__":
    main("build_graphs", run)
