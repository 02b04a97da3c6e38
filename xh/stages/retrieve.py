"""Retrieval as library calls: the sharded BM25 index, the candidates of a question file, their recall,
and the path scorer; each `verb(cfg, store) -> summary`, with Ray already joined by the caller
(`workflows/retrieve.py`; the check before each verb says what is missing before Ray starts).

    store = Store.from_config(cfg)
    index(cfg, store)        # the docs table -> BM25 shards + manifest
    run(cfg, store)          # questions -> candidates (ir, el, exp), written with the questions
    evaluate(cfg, store)     # Supp / Ans recall of those candidates (no Ray)
    paths(cfg, store)        # a path scorer from the questions' supporting facts
    all_steps(cfg, store)    # the index (when there is none), the candidates, their recall

Index: the `docs` table's files are cut into `retrieve.shards` contiguous doc ranges; Ray Data tasks analyze
each range twice: once for its partial corpus statistics (merged here into the corpus-wide N, avgdl and df
that make every shard score exactly like one index), once to build and save its shard. Candidates: the
questions stream through an actor pool whose actors each load the shards, the entity linker and the link
graph once (`xh.retrieval.candidates.Retriever`), and the re-ranker with the docs' texts when
`retrieve.reranker` names one. The shards, linker and link graph are laid out once per node first (one task
per node, `xh.retrieval.shared`) and every actor of a node maps that one copy: a second actor adds no copy.
Inputs are checked before anything is written: a run that fails on a missing index or re-ranker leaves the
previous run's questions, quarantine and candidates as they were.
"""

from __future__ import annotations

import json
import logging
import time

import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq

from xh import schemas
from xh.config import ConfigError, RetrieveConfig, XHConfig
from xh.inputs.questions import read_hotpot_questions
from xh.retrieval.bm25 import CorpusStats
from xh.retrieval.candidates import Retriever
from xh.retrieval.evaluate import retrieval_report
from xh.retrieval.index import build_shard, doc_ranges, index_exists, range_stats, staged_index, write_manifest
from xh.storage import locations
from xh.storage.store import Location, Store
from xh.storage.tables import RETRIEVAL

log = logging.getLogger("xh.retrieve")
TABLES_HINT = ": run `xh wiki process` first"
NO_QUESTIONS = "no questions given: set retrieve.questions (or pass --questions)"


def _tables(cfg: XHConfig, store: Store) -> Location:
    return store.at(locations.tables(cfg, cfg.retrieve.tables))


def _index(cfg: XHConfig, store: Store) -> Location:
    return store.at(locations.index(cfg))


# --- the index -------------------------------------------------------------------------------


def check_index_inputs(cfg: XHConfig, store: Store) -> tuple[dict, list[dict]]:
    """The wiki tables are complete and hold documents; returns their marker and the doc ranges the shards
    are built from."""
    tables = _tables(cfg, store)
    marker = tables.require_complete("wiki tables", hint=TABLES_HINT)
    ranges = doc_ranges(tables.join("docs"), cfg.retrieve.shards)
    if not ranges or not sum(g["num_docs"] for g in ranges):
        raise FileNotFoundError(f"no documents under {tables}/docs: run `xh wiki process` first")
    return marker, ranges


def index(cfg: XHConfig, store: Store) -> dict:
    """The docs table -> BM25 shards (one Ray Data task per doc range, twice) and the manifest."""
    r, tables, target = cfg.retrieve, _tables(cfg, store), _index(cfg, store)
    marker, ranges = check_index_inputs(cfg, store)
    start = time.perf_counter()
    # built aside and swapped in whole: a killed rebuild leaves the previous index as it was
    inputs = {"tables": tables.uri, "tables_marker": marker, "shards": r.shards, "titles": r.index_titles}
    with staged_index(target, inputs=inputs) as stage:  # refuses a folder it may not replace
        log.info(f"indexing {sum(g['num_docs'] for g in ranges):,} docs in {len(ranges)} shard(s) -> {target}")
        stats, shards = _build_index(ranges, stage.location, tables, r.index_titles)
        stage.rows = stats.num_docs
    return {
        "index": target.uri,
        "docs": stats.num_docs,
        "shards": len(shards),
        "vocabulary": len(stats.doc_freqs),
        "seconds": round(time.perf_counter() - start, 3),
    }


def _build_index(
    ranges: list[dict], building: Location, tables: Location, index_titles: bool
) -> tuple[CorpusStats, list[dict]]:
    """The shards and manifest of `ranges` under `building` (a staging folder); returns (stats, shard entries)."""
    import ray
    import ray.data

    def over_ranges(fn):
        """`fn(range)` for each doc range, one Ray Data task each (ranges and results travel as JSON)."""
        ds = ray.data.from_items([{"range": json.dumps(g)} for g in ranges], override_num_blocks=len(ranges))
        out = ds.map_batches(lambda b: {"out": [json.dumps(fn(json.loads(b["range"][0])))]}, batch_size=1, num_cpus=1)
        return [json.loads(row["out"]) for row in out.take_all()]

    def partial_stats(doc_range: dict) -> dict:
        stats = range_stats(doc_range, index_titles, building.store)
        return {"num_docs": stats.num_docs, "total_length": stats.total_length, "doc_freqs": stats.doc_freqs}

    stats = CorpusStats.merge(CorpusStats(**part) for part in over_ranges(partial_stats))
    stats_ref = ray.put(stats)
    shards = over_ranges(lambda doc_range: build_shard(doc_range, ray.get(stats_ref), building, index_titles))
    write_manifest(building, stats, shards, tables.uri, index_titles)
    return stats, shards


def ensure_index(cfg: XHConfig, store: Store) -> dict | str:
    """The index's summary when it had to be built, "existing" when there is one."""
    return "existing" if index_exists(_index(cfg, store)) else index(cfg, store)


# --- the candidates --------------------------------------------------------------------------


class _QueryActor:
    """Ray Data actor: loads the retriever once, then turns question batches into candidate rows."""

    def __init__(self, index: Location, tables: Location, settings: RetrieveConfig, torch_threads: int, searcher=None):
        if settings.reranker:
            import torch

            torch.set_num_threads(torch_threads)  # the actor's CPU share, not every core of the node
        self.retriever = Retriever.load(index, tables, settings, searcher=searcher)

    def __call__(self, batch: pa.Table) -> pa.Table:
        rows = self.retriever.candidates(batch["qid"].to_pylist(), batch["question"].to_pylist())
        return pa.Table.from_pylist(rows, schema=schemas.CANDIDATES)


def check_inputs(cfg: XHConfig, store: Store) -> None:
    """A question file, the BM25 index and the re-ranker and path scorer (when named): a one-line error
    when one is missing."""
    from xh.retrieval.paths import SCORER_FILE, PathScorer
    from xh.retrieval.rerank import CONFIG_FILE as RERANKER_CONFIG

    r, where = cfg.retrieve, _index(cfg, store)
    if not r.questions:
        raise FileNotFoundError(NO_QUESTIONS)
    if not index_exists(where):
        raise FileNotFoundError(f"no BM25 index at {where}: build it with `xh retrieve index`")
    for what, folder, file, command in (
        ("path scorer", r.path_scorer, SCORER_FILE, "xh retrieve paths"),
        ("re-ranker", r.reranker, RERANKER_CONFIG, "xh rerank"),
    ):
        if folder and not store.at(folder, file).exists():
            raise FileNotFoundError(f"no {what} at {folder} (missing {file}): train one with `{command}`")
    if r.path_scorer:
        PathScorer.load(store.at(r.path_scorer))  # a broken file: one line here, not a traceback from every actor
    _tables(cfg, store).require_complete("wiki tables", hint=TABLES_HINT)


def _staged_output(cfg: XHConfig, store: Store):
    """The retrieval folder (questions, quarantine, candidates) is built aside and handed on whole."""
    r = cfg.retrieve
    inputs = {"questions": r.questions, "index": locations.index(cfg), "reranker": r.reranker, "settings": r}
    return store.at(locations.retrieval(cfg)).staged(kind=RETRIEVAL, stage="retrieve", inputs=inputs)


def run(cfg: XHConfig, store: Store) -> dict:
    """`xh retrieve run`: check the inputs, then write the questions and their candidates, together: a run
    that fails at any point leaves the previous run's folder (and its `_complete.json`) as it was."""
    check_inputs(cfg, store)
    with _staged_output(cfg, store) as stage:
        questions = write_questions(cfg, store, stage.location)
        summary = {"questions": questions, **candidates(cfg, store, stage.location)}
        stage.rows = questions["questions"]
    return summary


def write_questions(cfg: XHConfig, store: Store, output: Location | None = None) -> dict:
    """The question file -> `<output>/questions` (and bad records -> `<output>/quarantine`).

    `output` is a staging folder of `run`; without one, the retrieval folder is replaced by one holding the
    questions only (complete, without candidates)."""
    if not cfg.retrieve.questions:
        raise FileNotFoundError(NO_QUESTIONS)
    if output is None:
        with _staged_output(cfg, store) as stage:
            counts = write_questions(cfg, store, stage.location)
            stage.rows = counts["questions"]
        return counts
    rows, quarantined = read_hotpot_questions(store.at(cfg.retrieve.questions))
    fs, out = output.fs_path()
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


def candidates(cfg: XHConfig, store: Store, output: Location) -> dict:
    """The questions under `output` (a staging folder of `run`) -> `<output>/candidates`."""
    import ray
    import ray.data
    from ray.data import ActorPoolStrategy

    r, index_at, tables = cfg.retrieve, _index(cfg, store), _tables(cfg, store)
    check_inputs(cfg, store)  # say so here, not from inside an actor
    start = time.perf_counter()
    fs, out = output.fs_path()
    # Every task around the actor pool asks for a fraction of a CPU: with actors spread over small
    # nodes, a task wanting a whole CPU finds no node with one free and waits for ever. Questions are
    # small next to the corpus, so the driver reads them and hands them over as blocks (no read task).
    table = pads.dataset(f"{out}/questions", filesystem=fs, format="parquet").to_table(columns=["qid", "question"])
    step = max(r.batch_size, -(-table.num_rows // (r.workers * 4)))
    questions = ray.data.from_arrow([table.slice(i, step) for i in range(0, max(table.num_rows, 1), step)])
    layout = prepare_layouts(index_at, tables)
    searcher = start_fanout(index_at, tables, r.shard_budget_gib) if r.shard_budget_gib else None
    log.info(f"retrieving candidates for {table.num_rows:,} questions with {r.workers} actor(s)")
    rows = questions.map_batches(
        _QueryActor,
        batch_size=r.batch_size,
        batch_format="pyarrow",
        compute=ActorPoolStrategy(size=r.workers),
        num_cpus=r.cpus_per_worker,
        fn_constructor_args=(index_at, tables, r, max(1, round(r.cpus_per_worker)), searcher),
    )
    try:
        rows.write_parquet(f"{out}/candidates", filesystem=fs, ray_remote_args={"num_cpus": 0.25})
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


def prepare_layouts(index: Location, tables: Location) -> float:
    """The retrieval state's layout on every node with CPUs (`xh.retrieval.shared`), one task per node, before
    the query actors start: they then only map it, and no actor holds the memory of building it (the task's
    process exits after it). A node that joins later is laid out by its first actor. Returns the seconds."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    start = time.perf_counter()
    nodes = [n["NodeID"] for n in ray.nodes() if n["Alive"] and n["Resources"].get("CPU", 0) > 0]
    task = ray.remote(num_cpus=0, max_calls=1)(_prepare_layout)
    strategy = [NodeAffinitySchedulingStrategy(node, soft=False) for node in nodes]
    ray.get([task.options(scheduling_strategy=s).remote(index, tables) for s in strategy])
    return round(time.perf_counter() - start, 3)


def start_fanout(index: Location, tables: Location, budget_gib: float):
    """The BM25 shards grouped under `budget_gib` (mapped bytes, measured on a node's layout), each group on its
    own actor (`xh.retrieval.fanout`); a shard larger than the budget alone is a ConfigError."""
    import ray

    from xh.retrieval.fanout import FanoutShards, shard_groups

    sizes = ray.get(ray.remote(num_cpus=0)(_layout_sizes).remote(index, tables))
    try:
        groups = shard_groups(sizes, budget_gib * 2**30)
    except ValueError as e:
        raise ConfigError(f"retrieve.shard_budget_gib: {e}") from None
    log.info(f"BM25 over {len(groups)} shard actor(s) of at most {budget_gib} GiB: shards {groups}")
    return FanoutShards.start(index, tables, groups)


def _layout_sizes(index: Location, tables: Location) -> list[int]:
    from xh.retrieval.fanout import layout_shard_bytes
    from xh.retrieval.shared import ensure_layout

    return layout_shard_bytes(ensure_layout(index, tables))


def _prepare_layout(index: Location, tables: Location) -> str:
    from xh.retrieval.shared import ensure_layout

    return str(ensure_layout(index, tables))


# --- their recall ----------------------------------------------------------------------------


def evaluate(cfg: XHConfig, store: Store) -> dict:
    """Table 6's measures for the candidates of the questions that have supporting facts."""
    output = store.at(locations.retrieval(cfg))
    output.require_complete("retrieval output", hint=": run `xh retrieve run` first")
    fs, out = output.fs_path()
    questions = pads.dataset(f"{out}/questions", filesystem=fs, format="parquet").to_table().to_pylist()
    rows = pads.dataset(f"{out}/candidates", filesystem=fs, format="parquet").to_table().to_pylist()
    wanted = pa.array(sorted({c["doc_id"] for c in rows}), pa.string())
    tables_fs, tables = _tables(cfg, store).fs_path()
    docs = pads.dataset(f"{tables}/docs", filesystem=tables_fs, format="parquet").to_table(
        columns=["doc_id", "title", "text"], filter=pads.field("doc_id").isin(wanted)
    )
    by_id = {d: (t, x) for d, t, x in zip(*(docs[c].to_pylist() for c in ("doc_id", "title", "text")))}
    report = retrieval_report(questions, rows, by_id, ir_keep=cfg.retrieve.ir_keep)
    output.join("eval.json").write_bytes(json.dumps(report, indent=1).encode())
    return report


def all_steps(cfg: XHConfig, store: Store) -> dict:
    """The index (only when there is none), the candidates and their evaluation."""
    summary = {"index": ensure_index(cfg, store)}
    done = run(cfg, store)
    summary["questions"] = done.pop("questions")
    summary["retrieve"] = done
    summary["eval"] = evaluate(cfg, store)
    return summary


# --- the path scorer -------------------------------------------------------------------------


def _fit_path_scorer(index: Location, tables: Location, settings: RetrieveConfig, questions: list[dict]) -> dict:
    """In one Ray task (it holds a query actor's retriever): each question's path candidates, its gold
    pair (the supporting-fact titles' docs), and the scorer fitted on them."""
    from xh.retrieval.paths import PathScorer

    retriever = Retriever.load(index, tables, settings.model_copy(update={"path_scorer": None}))
    titles = sorted({f["title"] for q in questions for f in q["supporting_facts"]})
    fs, root = tables.fs_path()
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


def check_paths_inputs(cfg: XHConfig, store: Store) -> None:
    """A question file is named, and the tables hold documents when the index is still to be built."""
    if not cfg.retrieve.questions:
        raise FileNotFoundError(NO_QUESTIONS)
    if not index_exists(_index(cfg, store)):
        check_index_inputs(cfg, store)


def paths(cfg: XHConfig, store: Store) -> dict:
    """`xh retrieve paths`: a path scorer (`xh.retrieval.paths`) trained on `retrieve.questions`' supporting
    facts, in one Ray task beside the cluster's data, written to `retrieve.path_scorer_output`. The BM25
    index is built first when there is none. Tracked: the config as params, the figures as metrics,
    the scorer as a file."""
    import mlflow
    import ray

    from xh.tracking import flatten_numbers, stage_run

    r = cfg.retrieve
    check_paths_inputs(cfg, store)
    built = ensure_index(cfg, store)
    check_inputs(cfg.model_copy(update={"retrieve": r.model_copy(update={"path_scorer": None})}), store)
    read, quarantined = read_hotpot_questions(store.at(r.questions))
    # a pair is learnt from two supporting-fact titles: the others are counted, not used
    rows = [q for q in read if len({f["title"] for f in q.get("supporting_facts") or []}) == 2]
    if not rows:
        raise ConfigError(f"{r.questions} has no question with two supporting-fact titles to learn pairs from")
    start = time.perf_counter()
    output = store.at(locations.path_scorer(cfg))
    log.info(f"path scorer: features of {len(rows):,} questions, training -> {output}")
    with stage_run(cfg, "retrieve", run_name="path-scorer", store=store) as tracked:
        task = ray.remote(num_cpus=r.cpus_per_worker)(_fit_path_scorer)
        scorer = ray.get(task.remote(_index(cfg, store), _tables(cfg, store), r, rows))["scorer"]
        scorer.save(output)
        summary = {
            "index": built,
            "output": output.uri,
            "questions": len(rows),
            "without_two_titles": len(read) - len(rows),
            "quarantined": len(quarantined),
            **scorer.metrics,
            "seconds": round(time.perf_counter() - start, 3),
        }
        mlflow.log_metrics(flatten_numbers({k: v for k, v in summary.items() if k != "index"}))
        mlflow.log_dict(json.loads(scorer.to_json()), "path_scorer.json")
    return {"mlflow_run_id": tracked.info.run_id, **summary}
