"""A fixed training run for `test_step_losses.py`: synthetic graphs, a tiny random BERT, dropout off.

    PYTHONPATH=$PWD .venv/bin/python -m tests.unit.train.step_reference > tests/unit/train/data/step_losses.json

wrote the reference figures from the landed tree before the training step lost its host syncs (commit
066c0d8's forward, `clip_grad_norm_` and a plain AdamW): the test runs the same steps through today's
`xh.train.step` and compares. Only public constructors are used here, so the file keeps working as the
step changes.
"""

from __future__ import annotations

import json

import numpy as np
import torch
from transformers import BertConfig, BertModel

from xh.config import ModelConfig
from xh.graph.encoded import EncodedGraph
from xh.model.batch import collate
from xh.model.packing import pack
from xh.model.xh import XHModel

VOCAB = 120
STEPS = 6
# name -> (task, hop_variant, isolated_nodes, packed)
CASES = {
    "hotpot_paper_collate": ("hotpot", "paper", "self_loop", False),
    "hotpot_paper_packed": ("hotpot", "paper", "self_loop", True),
    "hotpot_gat_packed": ("hotpot", "gat", "zero", True),
    "fever_paper_collate": ("fever", "paper", "self_loop", False),
}


def synthetic_graph(rng: np.random.Generator, qid: str, task: str, labelled: bool = True) -> EncodedGraph:
    """A graph of 1-5 nodes of 8-40 random tokens; labels of every kind the task has (some left unknown)."""
    n = int(rng.integers(1, 6))
    lengths = rng.integers(8, 41, size=n)
    question = 4  # tokens 1..3 are the question, then the paragraph
    ids = [np.concatenate([[1], rng.integers(5, VOCAB, size=int(k) - 1)]).astype(np.int64) for k in lengths]
    types = [(np.arange(k) >= question).astype(np.int64) for k in lengths]
    mask = [np.arange(k) >= question for k in lengths]
    sentences = [
        np.where(np.arange(k) >= question, (np.arange(k) - question) // 6, -1).astype(np.int64) for k in lengths
    ]
    num_sentences = np.array([int(s.max()) + 1 for s in sentences], np.int64)
    pairs = [(s, d) for s in range(n) for d in range(n) if s != d and rng.random() < 0.4]
    spans = np.zeros((0, 3), np.int64)
    answer_type = -1
    if labelled and task == "hotpot":
        answer_type = int(rng.integers(0, 3))
        if answer_type == 0:
            node = int(rng.integers(0, n))
            start = int(rng.integers(question, lengths[node]))
            spans = np.array([[node, start, min(start + 2, int(lengths[node]) - 1)]], np.int64)
    relevance = rng.integers(0, 2, size=n) if labelled else np.full(n, -1)
    sentence_labels = [rng.integers(0, 2, size=int(s)).astype(np.int64) for s in num_sentences] if labelled else []
    return EncodedGraph(
        qid=qid,
        task=task,
        input_ids=ids,
        token_type_ids=types,
        paragraph_mask=mask,
        offsets=[np.full((int(k), 2), -1, np.int64) for k in lengths],
        sentence_ids=sentences,
        edges=np.array(pairs, np.int64).reshape(-1, 2),
        node_doc_ids=[f"{qid}-{i}" for i in range(n)],
        node_titles=[f"t{i}" for i in range(n)],
        node_paragraphs=["" for _ in range(n)],
        num_sentences=num_sentences,
        node_lines=np.arange(n, dtype=np.int64) if task == "fever" else np.full(n, -1, np.int64),
        node_relevance=relevance.astype(np.int64),
        node_has_answer=np.full(n, -1, np.int64),
        answer_spans=spans,
        answer_type=answer_type,
        claim_label=int(rng.integers(0, 3)) if labelled and task == "fever" else -1,
        sentence_labels=sentence_labels if task == "hotpot" else [],
    )


def case_batches(task: str, packed: bool, steps: int = STEPS) -> list:
    """The batches of a case: 3 graphs each (one unlabelled in every other batch), the same every call."""
    rng = np.random.default_rng(7)
    batches = []
    for step in range(steps):
        graphs = [synthetic_graph(rng, f"s{step}g{g}", task, labelled=not (g == 2 and step % 2)) for g in range(3)]
        batches.append(pack(graphs, row_tokens=64, rows=6) if packed else collate(graphs))
    return batches


def case_model(task: str, variant: str, isolated: str) -> XHModel:
    config = BertConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=3,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    cfg = ModelConfig(task=task, hop_layers=2, hop_variant=variant, isolated_nodes=isolated, hop_dropout=0.0)
    model = XHModel(cfg, BertModel(config))
    model.heads.dropout.p = 0.0
    return model.train()


def reference_run(name: str) -> list[dict[str, float]]:
    """The landed step: forward, backward, clip to 1.0, AdamW; per step, the figures read after it."""
    task, variant, isolated, packed = CASES[name]
    model = case_model(task, variant, isolated)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    figures = []
    for batch in case_batches(task, packed):
        out = model(batch)
        out.loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step = {"loss": out.loss.item(), "grad_norm": grad_norm.item()}
        figures.append(step | {f"loss_{key}": value.item() for key, value in out.losses.items()})
    return figures


if __name__ == "__main__":
    print(json.dumps({name: reference_run(name) for name in CASES}, indent=1))
