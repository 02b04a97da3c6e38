"""The FEVER science check of Transformer-XH: on multi-evidence claims, hop attention must tell the
linked page's fact from a look-alike's, which the no-hop ablation cannot.

The claims are `xh.synth.make_evidence_claims`' multi-evidence slice: "The founder of Glenbridge
Records was born in New Havbrook." Page A (the one the claim names) links to page B ("It was founded
in 1962 by Draper."), and B's sentence states the fact ("He was born in Elworth Springs."). Among the
7 candidate sentences is a decoy D of B's kind stating the same fact (Jasper Garrow: "He was born in
New Havbrook."): in SUPPORTS claims D states another value, in REFUTES claims D states the claimed
value and B another. Each node reads only `claim [SEP] title [SEP] sentence` (its anchor is its own
title), so without hops B's and D's nodes look alike: which of them did A name? The graphs keep the
hyperlink edges only (`evidence_graph_rows(..., "hyperlink")`: A's sentence to the sentences of the
page it names), so with hop attention B's hub reads A's along the edge A -> B, and D's has no such
edge.

Same graphs, seed and optimizer steps (the project's parameter groups and AdamW schedule), K = 3 hop
layers against K = 0, on all-MiniLM-L6-v2 cut to its first 3 layers (a CPU budget). The test asserts
that the K = 3 model puts more importance p(s|τ) on B's fact sentence than on the decoy's in at least
MARGIN more dev claims than K = 0 does: the evidence the verdict needs, the second hop of a multi-
evidence claim. The verdict itself (label accuracy) is not learned by either model at this budget
and is only printed; the measurement over seeds is in docs/results/models.md (Variants). `pytest -s` prints
the figures of a run.
"""

from __future__ import annotations

import json
import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import pytest
import torch

from xh import synth
from xh.config import ModelConfig, TrainConfig
from xh.graph.encode import encode_graph
from xh.model.backbones import truncated_backbone
from xh.model.batch import collate
from xh.model.xh import XHModel
from xh.train.loop import parameter_groups
from xh.train.worker import adamw_with_warmup, optimizer_step

pytestmark = [pytest.mark.slow, pytest.mark.integration]

WORLD = synth.WorldSpec(num_docs=2000, seed=7)
TRAIN_CLAIMS, DEV_CLAIMS = 400, 100  # multi-evidence claims only, SUPPORTS and REFUTES alternating
LAYERS = 3  # MiniLM's first 3 layers; K = 3 puts a hop step after each
NODE_TOKENS = 40  # claim, title and sentence fit in 99% of the nodes
STEPS, BATCH = 100, 4  # one epoch of the training claims
SEED = 0
TRAIN = TrainConfig(lr=1e-4, hop_lr=1e-3)
MARGIN = 0.05  # K = 3 must rank B's fact above the decoy's in this much more of the dev claims than K = 0


@pytest.fixture(scope="module")
def claim_graphs() -> tuple[list[dict], list[dict]]:
    claims = synth.make_evidence_claims(WORLD, TRAIN_CLAIMS + DEV_CLAIMS, seed=0, multi_fraction=1.0, nei_fraction=0.0)
    rows = synth.evidence_graph_rows(claims, "hyperlink")
    assert len(rows) == TRAIN_CLAIMS + DEV_CLAIMS and {r["_slice"] for r in rows} == {"multi"}
    return rows[DEV_CLAIMS:], rows[:DEV_CLAIMS]


@pytest.fixture(scope="module")
def short_minilm(minilm_path, tmp_path_factory) -> str:
    return truncated_backbone(minilm_path, LAYERS, tmp_path_factory.mktemp("minilm-3"))


def _fact_and_decoy(row: dict) -> tuple[int, int]:
    """Node positions of B's fact sentence (the gold group's last) and of the decoy stating the same fact."""
    fact = row["evidence"][0][-1]
    nodes = [(n["doc_id"], n["line"]) for n in row["nodes"]]
    return nodes.index((fact["page"], fact["line"])), row["_decoy"]


def train_and_score(hop_layers: int, backbone: str, train_rows: list[dict], dev_rows: list[dict], seed: int = SEED):
    """STEPS steps of BATCH claims, then on the dev claims: the share where the fact outweighs the decoy,
    and label accuracy."""
    torch.manual_seed(seed)
    cfg = ModelConfig(backbone=backbone, task="fever", hop_layers=hop_layers, max_node_tokens=NODE_TOKENS)
    model = XHModel.from_backbone(cfg)
    train = [encode_graph(r, model.tokenizer, NODE_TOKENS) for r in train_rows]
    dev = [encode_graph(r, model.tokenizer, NODE_TOKENS) for r in dev_rows]
    optimizer, scheduler = adamw_with_warmup(parameter_groups(model, TRAIN), STEPS, TRAIN.warmup_fraction)
    order = np.random.default_rng(seed).permutation(len(train))
    start = time.perf_counter()
    model.train()
    for step in range(STEPS):
        picked = [order[(step * BATCH + i) % len(order)] for i in range(BATCH)]
        model(collate([train[k] for k in picked])).loss.backward()
        optimizer_step(model, optimizer, scheduler, TRAIN.max_grad_norm)
    seconds = time.perf_counter() - start
    model.eval()
    fact_first, correct = [], []
    with torch.inference_mode():
        for first in range(0, len(dev), 25):
            batch = collate(dev[first : first + 25])
            out = model(batch)
            correct += (out.claim_log_probs.argmax(-1) == batch.claim_label).tolist()
            offsets = batch.graph_offsets.tolist()
            for g, row in enumerate(dev_rows[first : first + 25]):
                fact, decoy = _fact_and_decoy(row)
                fact_first.append(bool(out.importance[offsets[g] + fact] > out.importance[offsets[g] + decoy]))
    return {
        "fact_over_decoy": float(np.mean(fact_first)),
        "label_accuracy": float(np.mean(correct)),
        "train_seconds": round(seconds, 1),
    }


def _on_one_thread(*args) -> dict:
    torch.set_num_threads(1)  # as measured; more threads than free cores spin on a shared box
    return train_and_score(*args)


@pytest.mark.xfail(
    reason="known failure since 2026-11-28 (#39): K=3 no longer beats K=0 by 0.05 on fact-over-decoy at seed 0 (0.57 "
    "vs 0.59; 958aa72 gave 0.74). Bisected to 2e55535: only the hop dropout's draw layout changed, which moves every "
    "later dropout mask; the old layout on today's tree gives 0.74 again and one extra random draw gives 0.70 "
    "(docs/training.md): the figure depends on the dropout stream, a fragile setting not yet made robust",
    strict=False,
)
@pytest.mark.timeout(1200)  # two trainings of about a minute each, on CPUs other work may share
def test_hop_attention_tells_the_linked_fact_from_the_decoy_on_multi_evidence_claims(claim_graphs, short_minilm):
    train_rows, dev_rows = claim_graphs
    # the two models side by side, a process each: the same one-thread arithmetic as one after the other
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as pool:
        runs = [pool.submit(_on_one_thread, k, short_minilm, train_rows, dev_rows) for k in (3, 0)]
        with_hops, without = (run.result() for run in runs)
    report = {"k3": with_hops, "k0": without}
    print(json.dumps(report))
    assert with_hops["fact_over_decoy"] >= without["fact_over_decoy"] + MARGIN, report
