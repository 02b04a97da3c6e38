"""The graphs stage in the retrieval setting is scoring's question -> graph path: the retrieve stage's
candidates, through `Pipeline.graphs_of` over the node's `DocStore`, make the graphs `Pipeline.graphs`
makes of the same questions, with the node choice of the `retrieve` section alone."""

from __future__ import annotations

import json
from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq

from tests.helpers import tables_retriever
from xh import schemas
from xh.config import load_config
from xh.graph.docstore import DocStore
from xh.pipeline import Pipeline
from xh.stages import graphs, retrieve
from xh.storage import locations
from xh.storage.store import Store
from xh.storage.tables import RETRIEVAL


def _sources(graph: dict) -> Counter:
    return Counter(node["source"] for node in graph["nodes"])


def test_the_stage_builds_what_the_pipeline_builds_from_the_same_candidates(synth_tables, tmp_path, monkeypatch):
    monkeypatch.setenv("XH_DOC_CACHE", str(tmp_path / "doc-cache"))
    tables, _ = synth_tables
    cfg = load_config(
        None,
        [
            f"storage.root={tmp_path}",
            f"graphs.tables={tables}",
            f"retrieve.questions={tables.parent / 'world' / 'hotpot' / 'questions.json'}",
            # not the defaults: retrieval seeds expansion with 3 BM25 documents, and graphs keep those 3
            "retrieve.ir_keep=3",
            "retrieve.expansion_keep=4",
            "graphs.questions_per_file=16",
        ],
    )
    store = Store.from_config(cfg)
    retriever = tables_retriever(tables, cfg.retrieve)
    # the retrieve stage's output: its questions, and their candidates from the same retriever
    with store.at(locations.retrieval(cfg)).staged(kind=RETRIEVAL, stage="retrieve") as stage:
        stage.rows = retrieve.write_questions(cfg, store, stage.location)["questions"]
        fs, out = stage.location.fs_path()
        questions = pq.read_table(f"{out}/questions", filesystem=fs).to_pylist()
        rows = retriever.candidates([q["qid"] for q in questions], [q["question"] for q in questions])
        fs.create_dir(f"{out}/candidates")
        table = pa.Table.from_pylist(rows, schema=schemas.CANDIDATES)
        pq.write_table(table, f"{out}/candidates/part-00000.parquet", filesystem=fs)

    plan = graphs.plan(cfg, store)
    assert [item["question"] for item in plan.items] == questions
    # what each actor of the stage does: make the builder once, then build shard after shard (as JSON, as
    # they travel to it)
    build = plan.make_builder()
    built, lost = [], []
    for i in range(0, len(plan.items), 16):
        shard_graphs, shard_lost, _ = build(json.loads(json.dumps(plan.items[i : i + 16])))
        built += shard_graphs
        lost += shard_lost

    pipeline = Pipeline(retriever, str(tables), cfg.graphs, docs=DocStore.open(str(tables)))
    expected, quarantined = pipeline.graphs(questions)
    assert built == expected and len(built) > 30
    assert [(json.loads(q["raw"])["qid"], q["reason"]) for q in lost] == [
        (json.loads(q["raw"])["qid"], q["reason"]) for q in quarantined
    ]
    assert len(built) + len(lost) == len(questions) == 60

    # the retrieve section chose the nodes: 3 BM25 documents, at most 4 expanded ones
    assert max(_sources(graph)["ir"] for graph in expected) == 3
    assert max(_sources(graph)["exp"] for graph in expected) == 4
    assert graphs.built_with(cfg)["retrieve"] == {"ir_keep": 3, "el_per_surface": 1, "expansion_keep": 4}
