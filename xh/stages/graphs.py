"""Evidence graphs on Ray Data: questions -> the sharded `graphs` table, a quarantine table, a summary.

    store = Store.from_config(cfg)
    plan = graphs.plan(cfg, store)          # reads and checks the (small) inputs: no Ray yet
    summary = graphs.build(cfg, store, plan)  # the shards, on the Ray cluster the caller joined

The plan (`xh.graph.build.TaskPlan`) holds one item per question; its items are cut into shards of
`graphs.questions_per_file` questions, and an actor pool of `graphs.workers` builders turns each shard
into one Parquet file of graphs (`<output>/part-NNNNN.parquet`) and one of quarantined questions
(`<quarantine>/...`), and hands back only counts, which make the summary (`<output>/_summary.json`).
HotpotQA's retrieval setting is the question -> graph path of scoring and serving: each question with
the retrieve stage's candidates for it goes through `xh.pipeline.Pipeline.graphs_of` over the node's
`xh.graph.docstore.DocStore` (built once per node, its rows read by id), with the node choice of the
`retrieve` section that proposed the candidates (`retrieve.ir_keep`, `el_per_surface`, `expansion_keep`).

Nothing is dropped silently: questions in = graphs out + quarantined (bad records, "no node contains
the answer", ...), or the run fails.
"""

from __future__ import annotations

import json
import logging
import time
from functools import partial

import pyarrow.compute as pc
import pyarrow.dataset as pads

from xh import schemas
from xh.config import NODE_CHOICE, GraphsConfig, RetrieveConfig, XHConfig
from xh.graph import store as graph_store
from xh.graph.build import ShardBuild, ShardBuilder, TaskPlan, make_plan, outcome_rows, summarize
from xh.storage import locations
from xh.storage.store import Location, Store
from xh.storage.tables import GRAPHS, GRAPHS_QUARANTINE
from xh.storage.uris import join
from xh.tracking import flatten_numbers

log = logging.getLogger("xh.graphs").info


def folder(g: GraphsConfig) -> str:
    """fever, or fever-dev / fever-test for a held-out claim split (`graphs.claims_split`)."""
    return f"{g.task}-{g.claims_split}" if g.task == "fever" and g.claims_split in ("dev", "test") else g.task


def places(cfg: XHConfig, store: Store) -> dict[str, Location]:
    """Where the stage reads (`retrieval`, `tables`) and writes (`output`, `quarantine`)."""
    g = cfg.graphs
    return {
        "output": store.at(locations.graphs(cfg, folder(g), g.output)),
        "quarantine": store.at(locations.graphs(cfg, f"quarantine/{folder(g)}", g.quarantine)),
        # the documented default of `graphs.retrieval`, whatever `retrieve.output` says
        "retrieval": store.at(g.retrieval or join(cfg.storage.root, "retrieval")),
        "tables": store.at(locations.tables(cfg, g.tables)),
    }


def plan(cfg: XHConfig, store: Store) -> TaskPlan:
    """The task's plan; a missing or incomplete input, or an output the stage may not replace, is a
    one-line error here, before any Ray work."""
    g, p = cfg.graphs, places(cfg, store)
    p["output"].check_replaceable(GRAPHS)
    p["quarantine"].check_replaceable(GRAPHS_QUARANTINE)
    if g.task == "fever" or g.setting == "retrieval":
        p["tables"].require_complete("wiki tables", hint=": run `xh wiki process` first")
    if retrieved(cfg):
        p["retrieval"].require_complete("retrieval output", hint=": run `xh retrieve run` first")
        return retrieval_plan(cfg, p["retrieval"], p["tables"])
    return make_plan(g, p["tables"])


def retrieved(cfg: XHConfig) -> bool:
    """HotpotQA's retrieval setting: graphs of the retrieve stage's candidates."""
    return cfg.graphs.task == "hotpot" and cfg.graphs.setting == "retrieval"


def retrieval_plan(cfg: XHConfig, retrieval: Location, tables: Location) -> TaskPlan:
    """The retrieve stage's questions (under `retrieval`), each with those of its candidates a graph can use."""
    r = cfg.retrieve
    fs, root = retrieval.fs_path()
    for name in ("questions", "candidates"):
        if fs.get_file_info(f"{root}/{name}").type.name == "NotFound":
            raise FileNotFoundError(f"no {name} under {retrieval}: run `xh retrieve run` first")
    questions = pads.dataset(f"{root}/questions", filesystem=fs, format="parquet").to_table().to_pylist()
    candidates = pads.dataset(f"{root}/candidates", filesystem=fs, format="parquet").to_table(
        columns=["qid", "doc_id", "source", "score", "rank", "surface"]
    )
    # only candidates a graph can use travel to the builders (`xh.graph.hotpot.select_nodes` picks among them)
    source, rank = candidates["source"], candidates["rank"]
    usable = pc.or_(
        pc.or_(
            pc.and_(pc.equal(source, "ir"), pc.less(rank, r.ir_keep)),
            pc.and_(pc.equal(source, "exp"), pc.less(rank, r.expansion_keep)),
        ),
        pc.equal(source, "el"),
    )
    by_qid: dict[str, list[dict]] = {}
    for row in candidates.filter(usable).to_pylist():
        by_qid.setdefault(row["qid"], []).append(row)
    items = [
        {"position": n, "question": q, "candidates": by_qid.get(q["qid"], [])} for n, q in enumerate(questions, start=1)
    ]
    return TaskPlan(items, [], partial(_pipeline_builder, cfg.graphs, r, tables, retrieval.join("questions").uri))


def _pipeline_builder(settings: GraphsConfig, retrieval: RetrieveConfig, tables: Location, source: str) -> ShardBuild:
    """Once per actor: the graph half of a `Pipeline` over this node's docs and links by id."""
    from xh.graph.docstore import DocStore
    from xh.pipeline import Pipeline

    pipeline = Pipeline(tables=tables, graph=settings, retrieval=retrieval, docs=DocStore.open(tables))

    def build(items: list[dict]):
        candidates = {i["question"]["qid"]: i["candidates"] for i in items}
        return outcome_rows(items, pipeline.graphs_of([i["question"] for i in items], candidates), source)

    return build


def build(cfg: XHConfig, store: Store, plan: TaskPlan) -> dict:
    """Build the plan's graphs; returns the summary (also written to `<output>/_summary.json`)."""
    g, p = cfg.graphs, places(cfg, store)
    start = time.perf_counter()
    # Both folders are built aside and swapped into place, with their `_complete.json`, only when the
    # whole run succeeded: an interrupted build leaves the previous graphs as they were.
    inputs = {"settings": built_with(cfg), "retrieval": p["retrieval"].uri, "tables": p["tables"].uri}
    with (
        p["output"].staged(kind=GRAPHS, stage="graphs", inputs=inputs) as out,
        p["quarantine"].staged(kind=GRAPHS_QUARANTINE, stage="graphs", inputs=inputs) as quarantine,
    ):
        summary = {
            "task": g.task,
            "setting": g.setting,
            "edge_mode": g.edge_mode,
            "settings": built_with(cfg),  # every setting the graphs were built with, for the runs that train on them
            **_build(g, plan, out.location, quarantine.location),
        }
        summary.update(
            output=p["output"].uri, quarantine=p["quarantine"].uri, seconds=round(time.perf_counter() - start, 3)
        )
        out.location.join("_summary.json").write_bytes(json.dumps(summary, indent=1).encode())
        out.rows, quarantine.rows = summary["graphs"], summary["quarantined"]
    log(f"{summary['graphs']:,} graphs, {summary['quarantined']:,} quarantined in {summary['seconds']} s")
    return summary


class _ShardActor:
    """Ray Data actor: one `ShardBuilder` per actor, one shard (a batch of one row) per call."""

    def __init__(self, *builder_args):
        self.build_shard = ShardBuilder(*builder_args)

    def __call__(self, batch: dict) -> dict:
        counts = self.build_shard(int(batch["shard"][0]), json.loads(batch["items"][0]))
        return {key: [value] for key, value in counts.items()}


def built_with(cfg: XHConfig) -> dict:
    """The `graphs` section's settings, and in the retrieval setting the `retrieve` section's node choice
    (under "retrieve"): what the graphs were built with."""
    out = cfg.graphs.model_dump(mode="json", exclude={"questions", "retrieval", "tables", "output", "quarantine"})
    if retrieved(cfg):
        out["retrieve"] = {k: getattr(cfg.retrieve, k) for k in NODE_CHOICE}
    return out


def _build(g: GraphsConfig, plan: TaskPlan, output: Location, quarantine: Location) -> dict:
    """The plan's graphs -> `output` and `quarantine` (staging folders); returns the summary's counts."""
    import ray.data
    from ray.data import ActorPoolStrategy

    shards = [
        {"shard": k, "items": json.dumps(plan.items[i : i + g.questions_per_file])}
        for k, i in enumerate(range(0, len(plan.items), g.questions_per_file))
    ]
    if plan.quarantined:  # records refused before graph building: one file, numbered after the shards
        graph_store.write_shard(plan.quarantined, quarantine, len(shards), schemas.QUARANTINE)
    per_shard: list[dict] = []
    if shards:
        workers = min(g.workers, len(shards))
        log(
            f"building {g.task} graphs ({g.setting}) for {len(plan.items):,} questions in {len(shards)} "
            f"shard(s) with {workers} actor(s) -> {output}"
        )
        per_shard = (
            ray.data.from_items(shards, override_num_blocks=len(shards))
            .map_batches(
                _ShardActor,
                batch_size=1,
                compute=ActorPoolStrategy(size=workers),
                num_cpus=g.cpus_per_worker,
                fn_constructor_args=(plan.make_builder, output, quarantine, g.tokenizer, g.max_node_tokens),
            )
            .take_all()
        )
    if sum(r["items"] for r in per_shard) != len(plan.items):
        raise RuntimeError(
            f"{len(plan.items)} questions went to the builders but {sum(r['items'] for r in per_shard)} came back"
        )
    summary = summarize(len(plan.items), plan.quarantined, per_shard, g.max_node_tokens)
    if summary["questions"] != summary["graphs"] + summary["quarantined"]:
        raise RuntimeError(f"questions in != graphs out + quarantined: {summary}")
    return summary


def log_summary(summary: dict) -> None:
    """Into the active MLflow run: the summary's numbers as metrics (`flatten_numbers`: neither the
    quarantine reasons nor the settings), the summary and the quarantine reasons as files."""
    import mlflow

    mlflow.log_metrics(flatten_numbers(summary))
    mlflow.log_dict(summary, "graphs_summary.json")
    mlflow.log_dict(summary.get("quarantine_reasons", {}), "quarantine_reasons.json")
