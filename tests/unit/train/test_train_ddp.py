"""Training wraps the model in DDP with `find_unused_parameters=False` (`xh.train.loop`): that is only
right when every trainable parameter gets a gradient in every step, whichever labels the batch holds.
Checked here for each architecture and hop variant, on a batch of one bridge question alone (no
comparison) and on a mixed batch."""

from __future__ import annotations

import pytest
import torch

from tests.unit.model.test_variants import RECORDS, graph_rows
from xh.config import ModelConfig
from xh.model.variants import new_model, training_batch

VARIANTS = {
    "xh-paper-k3": {"hop_layers": 3},
    "xh-gat-k2": {"hop_layers": 2, "hop_variant": "gat"},
    "xh-k0": {"hop_layers": 0},
    "gesa-hub-relations": {"hop_layers": 2, "hop_variant": "gesa", "hub_relations": True},
    "dochopper": {"architecture": "dochopper"},
}


@pytest.mark.parametrize("name", sorted(VARIANTS))
@pytest.mark.parametrize("questions", [["b1"], ["b1", "c1"]], ids=["bridge-only", "mixed"])
def test_every_parameter_gets_a_gradient_in_every_step(tiny_backbone, name, questions):
    assert {r["_id"] for r in RECORDS} >= set(questions)
    cfg = ModelConfig(backbone=tiny_backbone, max_node_tokens=48, **VARIANTS[name])
    torch.manual_seed(0)
    model = new_model(cfg).train()
    rows = [r for r in graph_rows("typed") if r["qid"] in questions]
    batch = training_batch(model, rows, model.tokenizer, cfg.max_node_tokens)
    model(batch).loss.backward()
    without = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    assert without == []
