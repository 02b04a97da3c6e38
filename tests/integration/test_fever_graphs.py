"""FEVER graphs on the Ray cluster: `workflows.graphs` with graphs.task=fever over a generated world."""

import json

import pyarrow.dataset as pads
import pytest

from workflows import graphs
from xh import synth
from xh.config import load_config
from xh.graph import store
from xh.wiki import process


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A 600-page world's FEVER pages as docs, and its claims plus three bad lines."""
    root = tmp_path_factory.mktemp("fever-graphs")
    spec = synth.WorldSpec(num_docs=600, seed=21)
    synth.write_world(
        spec, synth.output_under(str(root / "world")), docs_per_shard=300, num_questions=10, num_claims=90
    )
    process.process_in_process(
        "fever",
        process.input_files([str(root / "world" / "fever" / "wiki-pages")], "fever"),
        str(root / "tables"),
        partitions=2,
    )
    claims = (root / "world" / "fever" / "claims.jsonl").read_text().splitlines()
    claims += [
        '{"id": 9001, "claim": "broken',
        json.dumps(
            {
                "id": 9002,
                "claim": "Nowhere Town was founded in 1800.",
                "label": "SUPPORTS",
                "evidence": [[[1, 2, "Nowhere_Town", 0]]],
            }
        ),
        json.dumps(
            {
                "id": 9003,
                "claim": "It is what it was.",
                "label": "NOT ENOUGH INFO",
                "evidence": [[[1, None, None, None]]],
            }
        ),
    ]
    (root / "claims.jsonl").write_text("\n".join(claims) + "\n")
    return root


def test_fever_graphs_on_ray(ray_cluster, world, minilm_path):
    overrides = [
        f"storage.root={world}",
        "graphs.task=fever",
        f"graphs.questions={world / 'claims.jsonl'}",
        "graphs.questions_per_file=40",
        "graphs.workers=2",
        f"graphs.tokenizer={minilm_path}",
    ]
    summary = graphs.build(load_config(None, overrides))
    assert summary["questions"] == 93 == summary["graphs"] + summary["quarantined"]
    reasons = summary["quarantine_reasons"]
    assert reasons == {
        "invalid json: Unterminated string starting at": 1,
        "gold evidence missing from the corpus: page 'Nowhere_Town' is not in the docs table": 1,
        "no evidence sentences: only stop words in the query": 1,
    }, reasons
    flags = summary["flags"]
    assert flags["fever_verifiable"] == 60 and flags["fever_gold_group_in_graph"] == 60  # training graphs: gold first
    assert summary["nodes_per_graph"]["max"] == 5
    tokens = summary["tokens_per_node"]
    assert 8 < tokens["mean"] < 64 and summary["nodes_at_token_limit"] == 0

    built = list(store.iter_graphs(summary["output"]))
    assert len(built) == 90 and {g["edge_mode"] for g in built} == {"full"}
    quarantined = pads.dataset(summary["quarantine"], format="parquet").to_table().to_pylist()
    assert sorted(q["position"] for q in quarantined) == [91, 91, 92]  # reader line 91; graph items 91 and 92

    # evaluation graphs: retrieval only; the claim without gold in the corpus is graphed too
    summary = graphs.build(load_config(None, [*overrides, "graphs.require_answer=false"]))
    assert summary["graphs"] == 91 and summary["quarantined"] == 2
    assert summary["flags"]["fever_gold_group_in_graph"] >= 0.9 * summary["flags"]["fever_verifiable"]
