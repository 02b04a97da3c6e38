"""Evidence graphs on Ray Data: questions -> the sharded `graphs` table, a quarantine table, a summary.

    store = Store.from_config(cfg)
    plan = graphs.plan(cfg, store)          # reads and checks the (small) inputs: no Ray yet
    summary = graphs.build(cfg, store, plan)  # the shards, on the Ray cluster the caller joined

The plan (`xh.graph.build`) holds one item per question; its items are cut into shards of
`graphs.questions_per_file` questions, and an actor pool of `graphs.workers` builders turns each shard
into one Parquet file of graphs (`<output>/part-NNNNN.parquet`) and one of quarantined questions
(`<quarantine>/...`), and hands back only counts, which make the summary (`<output>/_summary.json`).
In the retrieval setting, Ray tasks first route the docs and links each shard needs to that shard's
folder (one task per table file, `xh.graph.build.route_file`): the corpus is read once, by file.

Nothing is dropped silently: questions in = graphs out + quarantined (bad records, "no node contains
the answer", ...), or the run fails.
"""

from __future__ import annotations

import json
import logging
import time
from functools import partial

from xh import locations, schemas
from xh.config import GraphsConfig, XHConfig
from xh.graph import store as graph_store
from xh.graph.build import ShardBuilder, TaskPlan, make_plan, route_file, shard_docs, summarize
from xh.storage import join
from xh.store import Location, Store
from xh.tables import GRAPHS, GRAPHS_QUARANTINE
from xh.tracking import flatten_numbers

ROUTED = "_routed"  # the docs and links routed to each shard, inside the staging output; removed when built

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
    if g.task == "hotpot" and g.setting == "retrieval":
        p["retrieval"].require_complete("retrieval output", hint=": run `xh retrieve run` first")
    return make_plan(g, p["retrieval"], p["tables"])


def build(cfg: XHConfig, store: Store, plan: TaskPlan) -> dict:
    """Build the plan's graphs; returns the summary (also written to `<output>/_summary.json`)."""
    g, p = cfg.graphs, places(cfg, store)
    start = time.perf_counter()
    # Both folders are built aside and swapped into place, with their `_complete.json`, only when the
    # whole run succeeded: an interrupted build leaves the previous graphs as they were.
    inputs = {"settings": g, "retrieval": p["retrieval"].uri, "tables": p["tables"].uri}
    with (
        p["output"].staged(kind=GRAPHS, stage="graphs", inputs=inputs) as out,
        p["quarantine"].staged(kind=GRAPHS_QUARANTINE, stage="graphs", inputs=inputs) as quarantine,
    ):
        summary = _build(g, plan, out.location, quarantine.location)
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
    make_builder = plan.make_builder
    routed = output.join(ROUTED)
    if shards:
        if plan.route is not None:
            make_builder = partial(plan.make_builder, routed=_route(plan, shards, routed, g))
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
                fn_constructor_args=(make_builder, output, quarantine, g.tokenizer, g.max_node_tokens),
            )
            .take_all()
        )
    if plan.route is not None:
        graph_store.clear_folder(routed)
        fs, path = routed.fs_path()
        fs.delete_dir(path)
    if sum(r["items"] for r in per_shard) != len(plan.items):
        raise RuntimeError(
            f"{len(plan.items)} questions went to the builders but {sum(r['items'] for r in per_shard)} came back"
        )
    summary = {
        "task": g.task,
        "setting": g.setting,
        "edge_mode": g.edge_mode,
        # every setting the graphs were built with, for the runs that train on them
        "settings": g.model_dump(mode="json", exclude={"questions", "retrieval", "tables", "output", "quarantine"}),
        **summarize(len(plan.items), plan.quarantined, per_shard, g.max_node_tokens),
    }
    if summary["questions"] != summary["graphs"] + summary["quarantined"]:
        raise RuntimeError(f"questions in != graphs out + quarantined: {summary}")
    return summary


def _route(plan: TaskPlan, shards: list[dict], routed: Location, g: GraphsConfig) -> Location:
    """Route the docs and links each shard needs to its folder under `routed` (`xh.graph.build.route_file`):
    one Ray task per table file, each reading its file once; returns `routed`."""
    import ray

    wanted = ray.put(shard_docs([json.loads(s["items"]) for s in shards]))
    task = ray.remote(num_cpus=g.cpus_per_worker)(route_file)
    files = plan.route.files()
    start = time.perf_counter()
    rows = ray.get([task.remote(kind, file, wanted, routed) for kind in ("docs", "links") for file in files[kind]])
    log(
        f"routed {sum(rows):,} docs and links rows from {sum(map(len, files.values()))} file(s) to {len(shards)} "
        f"shard(s) in {time.perf_counter() - start:.1f} s"
    )
    return routed


def log_summary(summary: dict) -> None:
    """Into the active MLflow run: the summary's numbers as metrics (`flatten_numbers`: neither the
    quarantine reasons nor the settings), the summary and the quarantine reasons as files."""
    import mlflow

    mlflow.log_metrics(flatten_numbers(summary))
    mlflow.log_dict(summary, "graphs_summary.json")
    mlflow.log_dict(summary.get("quarantine_reasons", {}), "quarantine_reasons.json")
