"""Evidence graphs on Ray Data: questions -> the sharded `graphs` table, a quarantine table, a summary.

    xh graphs build                                                    # retrieval setting, from <root>/retrieval
    xh graphs build --set graphs.setting=distractor \\
        --set graphs.questions=../shared/data/hotpotqa/hotpot_train_sample500.json
    python -m workflows.graphs --config my.yaml --set graphs.edge_mode=bidirectional

    xh.graph.store.read_graphs("runs/demo/graphs/hotpot")             # the result, as a Ray dataset (trainer)

The driver reads the (small) inputs into a plan (`xh.graph.build`) and cuts its items into shards of
`graphs.questions_per_file` questions; an actor pool of `graphs.workers` builders turns each shard
into one Parquet file of graphs (`<output>/part-NNNNN.parquet`) and one of quarantined questions
(`<quarantine>/...`), and hands back only counts, which make the summary (`<output>/_summary.json`).
In the retrieval setting, Ray tasks first route the docs and links each shard needs to that shard's
folder (one task per table file, `xh.graph.build.route_file`): the corpus is read once, by file.

Nothing is dropped silently: questions in = graphs out + quarantined (bad records, "no node contains
the answer", ...), or the run fails. `run` logs the config and the summary to an MLflow run;
`build` does the same work without tracking, for drivers that track it themselves (the demo).
"""

from __future__ import annotations

import json
import time
from functools import partial

from workflows.common import init_ray, log, main, s3_settings
from xh import schemas
from xh.config import XHConfig
from xh.graph import store
from xh.graph.build import ShardBuilder, make_plan, route_file, shard_docs, summarize
from xh.graph.store import read_graphs  # noqa: F401  (its old import path; docs/graphs.md names xh.graph.store)
from xh.storage import join, open_output, resolve
from xh.tables import GRAPHS, GRAPHS_QUARANTINE, require_complete, staged

ROUTED = "_routed"  # the docs and links routed to each shard, inside the staging output; removed when built


def paths(cfg: XHConfig) -> dict[str, str]:
    g, root = cfg.graphs, cfg.storage.root
    return {
        "output": g.output or join(root, "graphs", _folder(g)),
        "quarantine": g.quarantine or join(root, "graphs", "quarantine", _folder(g)),
        "retrieval": g.retrieval or join(root, "retrieval"),
        "tables": g.tables or join(root, "tables"),
    }


def _folder(g) -> str:
    """fever, or fever-dev / fever-test for a held-out claim split (`graphs.claims_split`)."""
    return f"{g.task}-{g.claims_split}" if g.task == "fever" and g.claims_split in ("dev", "test") else g.task


class _ShardActor:
    """Ray Data actor: one `ShardBuilder` per actor, one shard (a batch of one row) per call."""

    def __init__(self, *builder_args):
        self.build_shard = ShardBuilder(*builder_args)

    def __call__(self, batch: dict) -> dict:
        counts = self.build_shard(int(batch["shard"][0]), json.loads(batch["items"][0]))
        return {key: [value] for key, value in counts.items()}


def build(cfg: XHConfig) -> dict:
    """Build the graphs of `cfg.graphs.task`; returns the summary (also written to `<output>/_summary.json`)."""
    g, s3, p = cfg.graphs, s3_settings(cfg), paths(cfg)
    start = time.perf_counter()
    if g.task == "fever" or g.setting == "retrieval":
        require_complete(p["tables"], s3, "wiki tables", hint=": run `xh wiki process` first")
    if g.task == "hotpot" and g.setting == "retrieval":
        require_complete(p["retrieval"], s3, "retrieval output", hint=": run `xh retrieve run` first")
    plan = make_plan(g, p["retrieval"], p["tables"], s3)
    # Both folders are built aside and swapped into place, with their `_complete.json`, only when the
    # whole run succeeded: an interrupted build leaves the previous graphs as they were.
    inputs = {"settings": g, "retrieval": p["retrieval"], "tables": p["tables"]}
    with (
        staged(p["output"], s3, kind=GRAPHS, stage="graphs", inputs=inputs) as out,
        staged(p["quarantine"], s3, kind=GRAPHS_QUARANTINE, stage="graphs", inputs=inputs) as quarantine,
    ):
        summary = _build(cfg, plan, out.uri, quarantine.uri, s3)
        summary.update(output=p["output"], quarantine=p["quarantine"], seconds=round(time.perf_counter() - start, 3))
        with open_output(join(out.uri, "_summary.json"), s3) as f:
            f.write(json.dumps(summary, indent=1).encode())
        out.rows, quarantine.rows = summary["graphs"], summary["quarantined"]
    log("graphs", f"{summary['graphs']:,} graphs, {summary['quarantined']:,} quarantined in {summary['seconds']} s")
    return summary


def _build(cfg: XHConfig, plan, output: str, quarantine: str, s3) -> dict:
    """The plan's graphs -> `output` and `quarantine` (staging folders); returns the summary's counts."""
    import ray.data
    from ray.data import ActorPoolStrategy

    g = cfg.graphs
    p = {"output": output, "quarantine": quarantine}
    shards = [
        {"shard": k, "items": json.dumps(plan.items[i : i + g.questions_per_file])}
        for k, i in enumerate(range(0, len(plan.items), g.questions_per_file))
    ]
    if plan.quarantined:  # records refused before graph building: one file, numbered after the shards
        store.write_shard(plan.quarantined, p["quarantine"], len(shards), schemas.QUARANTINE, s3)
    per_shard: list[dict] = []
    make_builder = plan.make_builder
    if shards:
        init_ray(cfg)
        if plan.route is not None:
            make_builder = partial(plan.make_builder, routed=_route(plan, shards, join(output, ROUTED), s3, g))
        workers = min(g.workers, len(shards))
        log(
            "graphs",
            f"building {g.task} graphs ({g.setting}) for {len(plan.items):,} questions in {len(shards)} "
            f"shard(s) with {workers} actor(s) -> {p['output']}",
        )
        per_shard = (
            ray.data.from_items(shards, override_num_blocks=len(shards))
            .map_batches(
                _ShardActor,
                batch_size=1,
                compute=ActorPoolStrategy(size=workers),
                num_cpus=g.cpus_per_worker,
                fn_constructor_args=(
                    make_builder,
                    p["output"],
                    p["quarantine"],
                    g.tokenizer,
                    g.max_node_tokens,
                    s3,
                ),
            )
            .take_all()
        )
    if plan.route is not None:
        store.clear_folder(join(output, ROUTED), s3)
        fs, routed = resolve(join(output, ROUTED), s3)
        fs.delete_dir(routed)
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


def _route(plan, shards: list[dict], routed: str, s3, g) -> str:
    """Route the docs and links each shard needs to its folder under `routed` (`xh.graph.build.route_file`):
    one Ray task per table file, each reading its file once; returns `routed`."""
    import ray

    wanted = ray.put(shard_docs([json.loads(s["items"]) for s in shards]))
    task = ray.remote(num_cpus=g.cpus_per_worker)(route_file)
    files = plan.route.files(s3)
    start = time.perf_counter()
    rows = ray.get([task.remote(kind, uri, wanted, routed, s3) for kind in ("docs", "links") for uri in files[kind]])
    log(
        "graphs",
        f"routed {sum(rows):,} docs and links rows from {sum(map(len, files.values()))} file(s) to {len(shards)} "
        f"shard(s) in {time.perf_counter() - start:.1f} s",
    )
    return routed


def metrics(summary: dict) -> dict[str, float]:
    """The summary's numbers as MLflow metrics, without the quarantine reasons: those are data (free text,
    quotes and brackets included) and go to the run as a file, never into metric names."""
    from xh.tracking import flatten_numbers

    return flatten_numbers({k: v for k, v in summary.items() if k not in ("quarantine_reasons", "settings")})


def run(cfg: XHConfig) -> dict:
    """`build`, tracked: the stage's config as params, the summary's numbers as metrics, the summary as a file."""
    import mlflow

    from xh.tracking import stage_run

    with stage_run(cfg, "graphs", s3=s3_settings(cfg)) as tracked:
        summary = build(cfg)
        mlflow.log_metrics(metrics(summary))
        mlflow.log_dict(summary, "graphs_summary.json")
        mlflow.log_dict(summary.get("quarantine_reasons", {}), "quarantine_reasons.json")
    return {"mlflow_run_id": tracked.info.run_id, **summary}


if __name__ == "__main__":
    main("graphs", run)
