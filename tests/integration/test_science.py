"""The science check of Transformer-XH: hop attention must beat the no-hop ablation where the answer
needs the second hop.

The generated world's bridge questions ask for a fact of page B that is linked from page A, the page
the question names ("In which city was the founder of Arden Motors born?": A = Arden Motors, B = its
founder). The answer is never in A nor in the question (`xh.synth.questions._bridge_question` refuses such
questions), and the eight distractor paragraphs are look-alikes of A and B: namesakes, pages the gold
pages link to, pages of the same kinds. A graph of 400 such questions holds on average 3 other pages
of B's kind (people with a birthplace, cities with a founding year), so without hop attention a node
cannot tell whether it is the one A's paragraph names; with it, B's hub reads A's along the edge
A -> B (distractor setting: A's paragraph mentions B's title; 337 of the 400 graphs have that edge,
the rest name B by a surname only).

Node anchors are removed from these graphs: the mention text a node receives from another paragraph
tells a no-hop model "some paragraph names me", and in 234 of the 400 graphs no other page of B's
kind is named by any paragraph: a shortcut past the hop. Without anchors, what B learns about A
comes through hop attention only.

Same graphs, same seed, same optimizer steps: all-MiniLM-L6-v2 cut to its first 3 layers
(`xh.model.backbones.truncated_backbone`, as in the FEVER test) with K = 3 hop layers against K = 0. The
test asserts that K = 3 wins by MARGIN answer EM and F1, a loose margin against what it measured over
seeds (docs/results/models.md, "HotpotQA science test"). `pytest -s` prints the figures of a run.

The generator of this world for larger runs is `xh.synth.question_graph_rows` (`bench/science.py`). Its
FEVER counterpart (`xh.synth.make_evidence_claims`: claims whose verdict needs two linked pages) is
checked in `test_science_fever.py`.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from xh import synth
from xh.config import load_config
from xh.model.backbones import truncated_backbone

pytestmark = [pytest.mark.slow, pytest.mark.integration]

WORLD = synth.WorldSpec(num_docs=2000, seed=7)
QUESTIONS = 400  # bridge questions only; a quarter is held out as dev by qid hash (93 of them)
MARGIN = 0.05  # K = 3 must beat K = 0 by this much dev answer EM, and F1: half the least of 3 seeds
LAYERS = 3  # MiniLM's first 3 layers: the pretrained lower layers at half the CPU time of all 6
TRAIN_SETTINGS = [
    "train.seed=13",
    "train.epochs=1",
    "train.batch_graphs=4",
    "train.lr=1e-4",
    "train.hop_lr=1e-3",
    "train.dev_fraction=0.25",
    "train.cpus_per_worker=1",
    "train.threads_per_worker=2",
    "model.max_node_tokens=64",
    "train.register_as=null",
    "train.attention_figures=false",
]


def _drop_anchors(folder: Path) -> None:
    for part in folder.glob("*.parquet"):
        table = pq.read_table(part)
        rows = table.to_pylist()
        for row in rows:
            for node in row["nodes"]:
                node["anchors"] = []
        pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), part)


@pytest.fixture(scope="module")
def bridge_graphs(ray_cluster, tmp_path_factory) -> str:
    """Distractor-setting graphs (directed hyperlink edges, no anchors) of 400 generated bridge questions."""
    from workflows.graphs import build

    root = tmp_path_factory.mktemp("science")
    questions = root / "questions.json"
    questions.write_text(json.dumps(synth.make_questions(WORLD, QUESTIONS, seed=0, comparison_fraction=0.0)))
    cfg = load_config(
        None,
        [
            f"storage.root={root}",
            f"ray.address={ray_cluster.address}",
            "graphs.setting=distractor",
            f"graphs.questions={questions}",
            "graphs.workers=1",
            "graphs.edge_mode=hyperlink",
        ],
    )
    summary = build(cfg)
    assert summary["graphs"] == QUESTIONS, summary
    folder = root / "graphs" / "hotpot"
    _drop_anchors(folder)
    return str(folder)


@pytest.fixture(scope="module")
def short_minilm(minilm_path, tmp_path_factory) -> str:
    return truncated_backbone(minilm_path, LAYERS, tmp_path_factory.mktemp("minilm-3"))


def _train(hop_layers: int, graphs: str, backbone: str, cluster, root: Path) -> dict:
    from workflows.train import fit

    cfg = load_config(
        None,
        [
            f"storage.root={root}",
            f"ray.address={cluster.address}",
            f"mlflow.tracking_uri=sqlite:///{root}/mlflow.db",
            f"mlflow.artifact_location={root}/artifacts",
            f"model.backbone={backbone}",
            f"model.hop_layers={hop_layers}",
            f"train.graphs={graphs}",
            f"train.run_name=science-k{hop_layers}",
            *TRAIN_SETTINGS,
        ],
    )
    start = time.perf_counter()
    outcome = fit(cfg)
    outcome["seconds"] = round(time.perf_counter() - start, 1)
    return outcome


@pytest.mark.timeout(1800)  # two trainings of a few minutes each, on CPUs other work may share
def test_hop_attention_beats_the_no_hop_ablation_on_bridge_questions(
    bridge_graphs, short_minilm, ray_cluster, tmp_path
):
    with_hops = _train(3, bridge_graphs, short_minilm, ray_cluster, tmp_path / "k3")
    without = _train(0, bridge_graphs, short_minilm, ray_cluster, tmp_path / "k0")
    report = {
        name: {k: outcome[k] for k in ("step", "train_graphs", "dev_graphs", "seconds")}
        | {k: round(outcome["metrics"][k], 3) for k in ("dev_em", "dev_f1", "dev_sp_f1")}
        for name, outcome in (("k3", with_hops), ("k0", without))
    }
    print(json.dumps(report))
    assert with_hops["step"] == without["step"] == with_hops["planned_steps"]
    assert with_hops["dev_graphs"] == without["dev_graphs"] == 93
    assert with_hops["metrics"]["dev_em"] >= without["metrics"]["dev_em"] + MARGIN, report
    assert with_hops["metrics"]["dev_f1"] >= without["metrics"]["dev_f1"] + MARGIN, report
