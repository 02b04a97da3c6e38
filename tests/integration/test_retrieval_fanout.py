"""Retrieval's shared state and fan-out on the Ray cluster: an s3:// index laid out once per node, shard groups
served by Ray actors on both nodes, and their merged top-k and candidates identical to one retriever holding
every shard."""

from __future__ import annotations

import json
import uuid

import pytest

from xh import synth
from xh.config import ConfigError, RetrieveConfig
from xh.retrieval import shared
from xh.retrieval.analyzer import Analyzer
from xh.retrieval.bm25 import search_shards
from xh.retrieval.candidates import DocPositions, Retriever
from xh.retrieval.entity_linking import EntityLinker
from xh.retrieval.expansion import LinkGraph
from xh.retrieval.fanout import FanoutShards, layout_shard_bytes, same_results
from xh.retrieval.index import build_shard, doc_ranges, load_index, range_stats, write_manifest
from xh.stages import wiki
from xh.storage.store import Store


@pytest.fixture(scope="module")
def s3_world(tmp_path_factory, s3_endpoint):
    """A generated world's tables on S3 and a 3-shard index built there; the questions."""
    from xh.retrieval.bm25 import CorpusStats

    root = tmp_path_factory.mktemp("fanout")
    synth.write_world(
        synth.WorldSpec(num_docs=900, seed=3), synth.output_under(str(root / "world")), num_questions=60, num_claims=0
    )
    wiki.write_tables(
        Store().at(str(root / "tables")), [Store().at(str(root / "world" / "wiki"))], "hotpot", partitions=2, local=True
    )
    prefix = f"s3://xh-test/fanout-{uuid.uuid4().hex[:8]}"
    store = Store(s3=s3_endpoint)
    tables, index = store.at(prefix, "tables"), store.at(prefix, "index")
    tables.upload(root / "tables")
    ranges = doc_ranges(tables.join("docs"), 3)
    stats = CorpusStats.merge(range_stats(r, True, store) for r in ranges)
    entries = [build_shard(r, stats, index, True) for r in ranges]
    write_manifest(index, stats, entries, tables.uri, True)
    questions = [q["question"] for q in json.loads((root / "world" / "hotpot" / "questions.json").read_text())]
    return index, tables, questions


def test_shard_actors_on_both_nodes_give_the_results_of_one_retriever_over_every_shard(
    ray_cluster, s3_endpoint, s3_world, tmp_path
):
    index, tables, questions = s3_world
    cache = tmp_path / "cache"
    settings = RetrieveConfig(ir_candidates=40)
    one = Retriever(load_index(index), EntityLinker.load(tables), LinkGraph.load(tables), settings)

    # an s3:// index: its arrays are fetched into the layout once, and every process maps them from there
    state = shared.node_state(index, tables, cache_dir=cache)
    layout = json.loads((state.folder / shared.READY).read_text())
    assert all(meta["files"] == {"weights": "weights.npy", "doc_index": "doc_index.npy"} for meta in layout["shards"])

    searcher = FanoutShards.start(index, tables, [[0], [1, 2]], cache_dir=str(cache))
    try:
        fan = Retriever(
            state.shards,
            state.linker,
            state.graph,
            settings,
            positions=DocPositions(state.shards, state.positions),
            searcher=searcher,
        )
        analyzed = [Analyzer().analyze(q) for q in questions]
        assert same_results(searcher.search(analyzed, 40), search_shards(one.shards, analyzed, 40))
        qids = [str(i) for i in range(len(questions))]
        expected = one.candidates(qids, questions)
        assert {r["source"] for r in expected} == {"ir", "el", "exp"}
        assert fan.candidates(qids, questions) == expected
    finally:
        import ray

        for actor in searcher.groups:
            ray.kill(actor)


def test_xh_retrieve_run_with_a_shard_budget_writes_the_candidates_of_the_shared_layout(ray_cluster, tmp_path):
    """`retrieve.shard_budget_gib` small enough for one shard a group: the query actors send BM25 to 3 shard
    actors; the candidates are those of the same run with every shard mapped by each query actor."""
    import pyarrow.dataset as pads

    from workflows import retrieve
    from xh.config import load_config

    synth.write_world(
        synth.WorldSpec(num_docs=900, seed=4), synth.output_under(str(tmp_path / "world")), num_questions=50
    )
    wiki.write_tables(
        Store().at(str(tmp_path / "tables")),
        [Store().at(str(tmp_path / "world" / "wiki"))],
        "hotpot",
        partitions=2,
        local=True,
    )
    questions = tmp_path / "world" / "hotpot" / "questions.json"
    base = [f"storage.root={tmp_path}", f"retrieve.questions={questions}", "retrieve.shards=3"]
    retrieve.index(load_config(None, base))

    def candidates(*overrides: str) -> list[dict]:
        output = tmp_path / f"retrieval-{len(overrides)}"
        retrieve.run(load_config(None, [*base, f"retrieve.output={output}", *overrides]))
        rows = pads.dataset(str(output / "candidates")).to_table().to_pylist()
        return sorted(rows, key=lambda r: (r["qid"], r["source"], r["rank"], r["doc_id"]))

    shared_layout = candidates()
    # the node's layout is there now (the run laid it out): a budget that fits each shard alone, not two
    sizes = layout_shard_bytes(shared.ensure_layout(str(tmp_path / "index" / "bm25"), str(tmp_path / "tables")))
    assert min(sizes) * 2 > max(sizes) * 1.01
    fanned = candidates(f"retrieve.shard_budget_gib={max(sizes) * 1.01 / 2**30}")
    assert {r["source"] for r in shared_layout} == {"ir", "el", "exp"} and fanned == shared_layout

    with pytest.raises(ConfigError, match="shard_budget_gib: shard 0 maps"):
        candidates(f"retrieve.shard_budget_gib={min(sizes) / 2 / 2**30}", "retrieve.workers=1")
