"""Retrieval on Ray: build the sharded BM25 index, assemble candidates, evaluate them.

    xh retrieve index  --set retrieve.shards=8                 # docs table -> BM25 shards + manifest
    xh retrieve run    --questions hotpot.json                 # questions -> candidates (ir, el, exp)
    xh retrieve run    --questions q.json --set retrieve.reranker=runs/demo/models/reranker   # re-ranked
    xh retrieve eval                                           # Supp / Ans recall of those candidates
    xh retrieve paths  --questions hotpot_train.json           # a path scorer from their supporting facts
    xh retrieve run    --questions q.json --set retrieve.path_scorer=runs/demo/models/path-scorer
    python -m workflows.retrieve --config my.yaml              # all three

Index: the `docs` table's files are cut into `retrieve.shards` contiguous doc ranges; Ray Data
tasks analyze each range twice — once for its partial corpus statistics (merged on the driver into
the corpus-wide N, avgdl and df that make every shard score exactly like one index), once to build
and save its shard. Candidates: the questions stream through an actor pool whose actors each load
the shards, the entity linker and the link graph once (`xh.retrieval.candidates.Retriever`), and
the re-ranker with the docs' texts when `retrieve.reranker` names one (`workflows.rerank`). The
shards, linker and link graph are laid out once per node first (one task per node,
`xh.retrieval.shared`) and every actor of a node maps that one copy: a second actor adds no copy.
Inputs are checked before anything is written: a run that fails on a missing index or re-ranker
leaves the previous run's questions, quarantine and candidates as they were.
"""

from __future__ import annotations

import json
import time

import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq

from workflows.common import init_ray, log, main, s3_settings
from xh import schemas
from xh.config import ConfigError, RetrieveConfig, XHConfig
from xh.questions import read_hotpot_questions
from xh.retrieval.bm25 import CorpusStats
from xh.retrieval.candidates import Retriever
from xh.retrieval.evaluate import retrieval_report
from xh.retrieval.index import build_shard, doc_ranges, index_exists, range_stats, staged_index, write_manifest
from xh.storage import join, open_output, resolve
from xh.tables import RETRIEVAL, require_complete, staged


def _paths(cfg: XHConfig) -> dict[str, str]:
    r, root = cfg.retrieve, cfg.storage.root
    return {
        "tables": r.tables or join(root, "tables"),
        "index": r.index or join(root, "index", "bm25"),
        "output": r.output or join(root, "retrieval"),
    }


def build_index(cfg: XHConfig) -> dict:
    """The docs table -> BM25 shards (one Ray Data task per doc range, twice) and the manifest."""
    s3, paths, r = s3_settings(cfg), _paths(cfg), cfg.retrieve
    tables = require_complete(paths["tables"], s3, "wiki tables", hint=": run `xh wiki process` first")
    start = time.perf_counter()
    ranges = doc_ranges(join(paths["tables"], "docs"), r.shards, s3)
    if not ranges or not sum(g["num_docs"] for g in ranges):
        raise FileNotFoundError(f"no documents under {paths['tables']}/docs: run `xh wiki process` first")
    # built aside and swapped in whole: a killed rebuild leaves the previous index as it was
    inputs = {"tables": paths["tables"], "tables_marker": tables, "shards": r.shards, "titles": r.index_titles}
    with staged_index(paths["index"], s3, inputs=inputs) as stage:  # refuses a folder it may not replace
        init_ray(cfg)
        stats, shards = _build_index(cfg, ranges, stage.uri)
        stage.rows = stats.num_docs
    return {
        "index": paths["index"],
        "docs": stats.num_docs,
        "shards": len(shards),
        "vocabulary": len(stats.doc_freqs),
        "seconds": round(time.perf_counter() - start, 3),
    }


def _build_index(cfg: XHConfig, ranges: list[dict], index_uri: str) -> tuple[CorpusStats, list[dict]]:
    """The shards and manifest of `ranges` under `index_uri` (a staging folder); returns (stats, shard entries)."""
    import ray
    import ray.data

    s3, paths, r = s3_settings(cfg), _paths(cfg), cfg.retrieve
    log(
        "retrieve",
        f"indexing {sum(g['num_docs'] for g in ranges):,} docs in {len(ranges)} shard(s) -> {paths['index']}",
    )

    def over_ranges(fn):
        """`fn(range)` for each doc range, one Ray Data task each (ranges and results travel as JSON)."""
        ds = ray.data.from_items([{"range": json.dumps(g)} for g in ranges], override_num_blocks=len(ranges))
        out = ds.map_batches(lambda b: {"out": [json.dumps(fn(json.loads(b["range"][0])))]}, batch_size=1, num_cpus=1)
        return [json.loads(row["out"]) for row in out.take_all()]

    def partial_stats(doc_range: dict) -> dict:
        stats = range_stats(doc_range, r.index_titles, s3)
        return {"num_docs": stats.num_docs, "total_length": stats.total_length, "doc_freqs": stats.doc_freqs}

    stats = CorpusStats.merge(CorpusStats(**part) for part in over_ranges(partial_stats))
    stats_ref = ray.put(stats)
    shards = over_ranges(lambda doc_range: build_shard(doc_range, ray.get(stats_ref), index_uri, r.index_titles, s3))
    write_manifest(index_uri, stats, shards, paths["tables"], r.index_titles, s3)
    return stats, shards


class _QueryActor:
    """Ray Data actor: loads the retriever once, then turns question batches into candidate rows."""

    def __init__(
        self, index_uri: str, tables_uri: str, settings: RetrieveConfig, s3, torch_threads: int, searcher=None
    ):
        if settings.reranker:
            import torch

            torch.set_num_threads(torch_threads)  # the actor's CPU share, not every core of the node
        self.retriever = Retriever.load(index_uri, tables_uri, settings, s3, searcher=searcher)

    def __call__(self, batch: pa.Table) -> pa.Table:
        rows = self.retriever.candidates(batch["qid"].to_pylist(), batch["question"].to_pylist())
        return pa.Table.from_pylist(rows, schema=schemas.CANDIDATES)


def check_inputs(cfg: XHConfig) -> None:
    """The BM25 index and the re-ranker and path scorer (when named) exist: a one-line error otherwise."""
    from xh.retrieval.paths import SCORER_FILE, PathScorer
    from xh.retrieval.rerank import CONFIG_FILE as RERANKER_CONFIG

    s3, paths, r = s3_settings(cfg), _paths(cfg), cfg.retrieve
    if not index_exists(paths["index"], s3):
        raise FileNotFoundError(f"no BM25 index at {paths['index']}: build it with `xh retrieve index`")
    for what, folder, file, command in (
        ("path scorer", r.path_scorer, SCORER_FILE, "xh retrieve paths"),
        ("re-ranker", r.reranker, RERANKER_CONFIG, "xh rerank"),
    ):
        if folder:
            fs, path = resolve(join(folder, file), s3)
            if fs.get_file_info(path).type.name == "NotFound":
                raise FileNotFoundError(f"no {what} at {folder} (missing {file}): train one with `{command}`")
    if r.path_scorer:
        PathScorer.load(r.path_scorer, s3)  # a broken file: one line here, not a traceback from every actor
    require_complete(paths["tables"], s3, "wiki tables", hint=": run `xh wiki process` first")


def _staged_output(cfg: XHConfig):
    """The retrieval folder (questions, quarantine, candidates) is built aside and handed on whole."""
    r = cfg.retrieve
    inputs = {"questions": r.questions, "index": _paths(cfg)["index"], "reranker": r.reranker, "settings": r}
    return staged(_paths(cfg)["output"], s3_settings(cfg), kind=RETRIEVAL, stage="retrieve", inputs=inputs)


def run_candidates(cfg: XHConfig) -> dict:
    """`xh retrieve run`: check the inputs, then write the questions and their candidates, together: a run
    that fails at any point leaves the previous run's folder (and its `_complete.json`) as it was."""
    check_inputs(cfg)
    with _staged_output(cfg) as stage:
        questions = write_questions(cfg, stage.uri)
        summary = {"questions": questions, **retrieve(cfg, stage.uri)}
        stage.rows = questions["questions"]
    return summary


def write_questions(cfg: XHConfig, output: str | None = None) -> dict:
    """The question file -> `<output>/questions` (and bad records -> `<output>/quarantine`).

    `output` is a staging folder of `run_candidates`; without one, the retrieval folder is replaced by one
    holding the questions only (complete, without candidates)."""
    s3 = s3_settings(cfg)
    if not cfg.retrieve.questions:
        raise FileNotFoundError("no questions given: set retrieve.questions (or pass --questions)")
    if output is None:
        with _staged_output(cfg) as stage:
            counts = write_questions(cfg, stage.uri)
            stage.rows = counts["questions"]
        return counts
    rows, quarantined = read_hotpot_questions(cfg.retrieve.questions, s3)
    fs, out = resolve(output, s3)
    for name, schema, table_rows in (
        ("questions", schemas.QUESTIONS, rows),
        ("quarantine", schemas.QUARANTINE, quarantined),
    ):
        fs.create_dir(f"{out}/{name}", recursive=True)
        fs.delete_dir_contents(f"{out}/{name}")
        pq.write_table(
            pa.Table.from_pylist(table_rows, schema=schema), f"{out}/{name}/part-00000.parquet", filesystem=fs
        )
    return {"questions": len(rows), "quarantined": len(quarantined)}


def retrieve(cfg: XHConfig, output: str) -> dict:
    """The questions under `output` (a staging folder of `run_candidates`) -> `<output>/candidates`."""
    import ray
    import ray.data
    from ray.data import ActorPoolStrategy

    s3, paths, r = s3_settings(cfg), _paths(cfg), cfg.retrieve
    check_inputs(cfg)  # say so here, not from inside an actor
    init_ray(cfg)
    start = time.perf_counter()
    fs, out = resolve(output, s3)
    # Every task around the actor pool asks for a fraction of a CPU: with actors spread over small
    # nodes, a task wanting a whole CPU finds no node with one free and waits for ever. Questions are
    # small next to the corpus, so the driver reads them and hands them over as blocks (no read task).
    table = pads.dataset(f"{out}/questions", filesystem=fs, format="parquet").to_table(columns=["qid", "question"])
    step = max(r.batch_size, -(-table.num_rows // (r.workers * 4)))
    questions = ray.data.from_arrow([table.slice(i, step) for i in range(0, max(table.num_rows, 1), step)])
    layout = prepare_layouts(paths["index"], paths["tables"], s3)
    searcher = start_fanout(paths["index"], paths["tables"], s3, r.shard_budget_gib) if r.shard_budget_gib else None
    log("retrieve", f"retrieving candidates for {table.num_rows:,} questions with {r.workers} actor(s)")
    candidates = questions.map_batches(
        _QueryActor,
        batch_size=r.batch_size,
        batch_format="pyarrow",
        compute=ActorPoolStrategy(size=r.workers),
        num_cpus=r.cpus_per_worker,
        fn_constructor_args=(paths["index"], paths["tables"], r, s3, max(1, round(r.cpus_per_worker)), searcher),
    )
    try:
        candidates.write_parquet(f"{out}/candidates", filesystem=fs, ray_remote_args={"num_cpus": 0.25})
    finally:
        for actor in searcher.groups if searcher else []:
            ray.kill(actor)
    table = pads.dataset(f"{out}/candidates", filesystem=fs, format="parquet").to_table(columns=["qid", "source"])
    counts = table.group_by("source").aggregate([("qid", "count")]).to_pylist()
    return {
        "candidates": {row["source"]: row["qid_count"] for row in counts},
        "ranker": (f"reranker {r.reranker}" if r.reranker else "bm25 / commonness (no trained re-ranker)")
        + (f", path scorer {r.path_scorer}" if r.path_scorer else ""),
        "layout_seconds": layout,
        "seconds": round(time.perf_counter() - start, 3),
    }


def prepare_layouts(index_uri: str, tables_uri: str, s3) -> float:
    """The retrieval state's layout on every node with CPUs (`xh.retrieval.shared`), one task per node, before
    the query actors start: they then only map it, and no actor holds the memory of building it (the task's
    process exits after it). A node that joins later is laid out by its first actor. Returns the seconds."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    start = time.perf_counter()
    nodes = [n["NodeID"] for n in ray.nodes() if n["Alive"] and n["Resources"].get("CPU", 0) > 0]
    task = ray.remote(num_cpus=0, max_calls=1)(_prepare_layout)
    strategy = [NodeAffinitySchedulingStrategy(node, soft=False) for node in nodes]
    ray.get([task.options(scheduling_strategy=s).remote(index_uri, tables_uri, s3) for s in strategy])
    return round(time.perf_counter() - start, 3)


def start_fanout(index_uri: str, tables_uri: str, s3, budget_gib: float):
    """The BM25 shards grouped under `budget_gib` (mapped bytes, measured on a node's layout), each group on its
    own actor (`xh.retrieval.fanout`); a shard larger than the budget alone is a ConfigError."""
    import ray

    from xh.retrieval.fanout import FanoutShards, shard_groups

    sizes = ray.get(ray.remote(num_cpus=0)(_layout_sizes).remote(index_uri, tables_uri, s3))
    try:
        groups = shard_groups(sizes, budget_gib * 2**30)
    except ValueError as e:
        raise ConfigError(f"retrieve.shard_budget_gib: {e}") from None
    log("retrieve", f"BM25 over {len(groups)} shard actor(s) of at most {budget_gib} GiB: shards {groups}")
    return FanoutShards.start(index_uri, tables_uri, groups, s3)


def _layout_sizes(index_uri: str, tables_uri: str, s3) -> list[int]:
    from xh.retrieval.fanout import layout_shard_bytes
    from xh.retrieval.shared import ensure_layout

    return layout_shard_bytes(ensure_layout(index_uri, tables_uri, s3))


def _prepare_layout(index_uri: str, tables_uri: str, s3) -> str:
    from xh.retrieval.shared import ensure_layout

    return str(ensure_layout(index_uri, tables_uri, s3))


def evaluate(cfg: XHConfig) -> dict:
    """Table 6's measures for the candidates of the questions that have supporting facts."""
    s3, paths = s3_settings(cfg), _paths(cfg)
    require_complete(paths["output"], s3, "retrieval output", hint=": run `xh retrieve run` first")
    fs, out = resolve(paths["output"], s3)
    questions = pads.dataset(f"{out}/questions", filesystem=fs, format="parquet").to_table().to_pylist()
    candidates = pads.dataset(f"{out}/candidates", filesystem=fs, format="parquet").to_table().to_pylist()
    wanted = pa.array(sorted({c["doc_id"] for c in candidates}), pa.string())
    tables_fs, tables = resolve(paths["tables"], s3)
    docs = pads.dataset(f"{tables}/docs", filesystem=tables_fs, format="parquet").to_table(
        columns=["doc_id", "title", "text"], filter=pads.field("doc_id").isin(wanted)
    )
    by_id = {d: (t, x) for d, t, x in zip(*(docs[c].to_pylist() for c in ("doc_id", "title", "text")))}
    report = retrieval_report(questions, candidates, by_id, ir_keep=cfg.retrieve.ir_keep)
    with open_output(join(paths["output"], "eval.json"), s3) as f:
        f.write(json.dumps(report, indent=1).encode())
    return report


def _fit_path_scorer(index_uri: str, tables_uri: str, settings: RetrieveConfig, s3, questions: list[dict]) -> dict:
    """In one Ray task (it holds a query actor's retriever): each question's path candidates, its gold
    pair (the supporting-fact titles' docs), and the scorer fitted on them."""
    from xh.retrieval.paths import PathScorer

    retriever = Retriever.load(index_uri, tables_uri, settings.model_copy(update={"path_scorer": None}), s3)
    titles = sorted({f["title"] for q in questions for f in q["supporting_facts"]})
    fs, root = resolve(tables_uri, s3)
    docs = pads.dataset(f"{root}/docs", filesystem=fs, format="parquet").to_table(
        columns=["doc_id", "title"], filter=pads.field("title").isin(pa.array(titles, pa.string()))
    )
    by_title = dict(zip(docs["title"].to_pylist(), docs["doc_id"].to_pylist()))
    gold = [{by_title.get(f["title"], f"missing:{f['title']}") for f in q["supporting_facts"]} for q in questions]
    groups = retriever.question_paths([q["question"] for q in questions])
    scorer = PathScorer.fit(groups, gold, seed=settings.path_seed)
    found = [g for g, pair in zip(groups, gold) if any(set(p) == pair for p in g.pairs)]
    chosen = [set(scorer.best_pair(g) or ()) == pair for g, pair in zip(groups, gold)]
    scorer.metrics |= {
        # a supporting-fact title with no doc: its question's pair can never be among the candidates
        "gold_titles_not_in_docs": sum(
            t not in by_title for q in questions for t in {f["title"] for f in q["supporting_facts"]}
        ),
        "pair_among_candidates": len(found) / max(1, len(groups)),
        "train_supp_recall@2": sum(chosen) / max(1, len(groups)),
    }
    return {"scorer": scorer}


def fit_paths(cfg: XHConfig) -> dict:
    """`xh retrieve paths`: a path scorer (`xh.retrieval.paths`) trained on `retrieve.questions`' supporting
    facts, in one Ray task beside the cluster's data, written to `retrieve.path_scorer_output`. The BM25
    index is built first when there is none. Tracked: the config as params, the figures as metrics,
    the scorer as a file."""
    import mlflow
    import ray

    from xh.tracking import flatten_numbers, stage_run

    s3, paths, r = s3_settings(cfg), _paths(cfg), cfg.retrieve
    if not r.questions:
        raise FileNotFoundError("no questions given: set retrieve.questions (or pass --questions)")
    index = "existing" if index_exists(paths["index"], s3) else build_index(cfg)
    check_inputs(cfg.model_copy(update={"retrieve": r.model_copy(update={"path_scorer": None})}))
    read, quarantined = read_hotpot_questions(r.questions, s3)
    # a pair is learnt from two supporting-fact titles: the others are counted, not used
    rows = [q for q in read if len({f["title"] for f in q.get("supporting_facts") or []}) == 2]
    if not rows:
        raise ConfigError(f"{r.questions} has no question with two supporting-fact titles to learn pairs from")
    init_ray(cfg)
    start = time.perf_counter()
    output = r.path_scorer_output or join(cfg.storage.root, "models", "path-scorer")
    log("retrieve", f"path scorer: features of {len(rows):,} questions, training -> {output}")
    with stage_run(cfg, "retrieve", run_name="path-scorer", s3=s3) as tracked:
        task = ray.remote(num_cpus=r.cpus_per_worker)(_fit_path_scorer)
        scorer = ray.get(task.remote(paths["index"], paths["tables"], r, s3, rows))["scorer"]
        scorer.save(output, s3)
        summary = {
            "index": index,
            "output": output,
            "questions": len(rows),
            "without_two_titles": len(read) - len(rows),
            "quarantined": len(quarantined),
            **scorer.metrics,
            "seconds": round(time.perf_counter() - start, 3),
        }
        mlflow.log_metrics(flatten_numbers({k: v for k, v in summary.items() if k != "index"}))
        mlflow.log_dict(json.loads(scorer.to_json()), "path_scorer.json")
    return {"mlflow_run_id": tracked.info.run_id, **summary}


def run(cfg: XHConfig) -> dict:
    """`retrieve.step`: the index, the candidates, their evaluation, or all three (the index only when
    there is none)."""
    step = cfg.retrieve.step
    if step != "all":
        return {"index": build_index, "run": run_candidates, "eval": evaluate, "paths": fit_paths}[step](cfg)
    s3, paths = s3_settings(cfg), _paths(cfg)
    summary = {"index": "existing" if index_exists(paths["index"], s3) else build_index(cfg)}
    done = run_candidates(cfg)
    summary["questions"] = done.pop("questions")
    summary["retrieve"] = done
    summary["eval"] = evaluate(cfg)
    return summary


if __name__ == "__main__":
    main("retrieve", run)
