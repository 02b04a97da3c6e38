"""Training batches (`xh.train.batching`): real HotpotQA graphs (the shared sample, distractor setting)
through MiniLM's tokenizer and a tiny random BERT. Packed batches train and evaluate as collated ones do."""

from __future__ import annotations

import pytest
import torch

from xh.config import ConfigError, GraphsConfig, ModelConfig, load_config
from xh.graph.encode import GraphEncoder, encode_graphs
from xh.inference import predict_graphs
from xh.model.batch import collate
from xh.model.xh import XHModel, load_tokenizer
from xh.train.batching import LENGTH_MULTIPLE, BatchLayout, BatchStats, in_lockstep, plan_token_batches


@pytest.fixture(scope="module")
def rows(shared_data) -> list[dict]:
    from xh.graph.hotpot import distractor_graphs, read_distractor_questions

    items, _ = read_distractor_questions(str(shared_data / "hotpotqa/hotpot_train_sample500.json"))
    return [o.graph for o in distractor_graphs(items[:32], GraphsConfig()) if o.graph]


@pytest.fixture(scope="module")
def backbone(make_tiny_backbone) -> str:
    return make_tiny_backbone(layers=2)


@pytest.fixture(scope="module")
def graphs(rows, backbone) -> list:
    from xh.model.xh import load_tokenizer

    return encode_graphs(rows, load_tokenizer(backbone), MAX_TOKENS)


MAX_TOKENS = 300  # rows of 320 tokens


def config(backbone: str, *overrides: str):
    return load_config(
        None, [f"model.backbone={backbone}", f"model.max_node_tokens={MAX_TOKENS}", "model.hop_layers=2", *overrides]
    )


def model_of(cfg) -> XHModel:
    torch.manual_seed(0)
    model = XHModel.from_backbone(ModelConfig.model_validate(cfg.model.model_dump() | {"hop_dropout": 0.0}))
    return model.eval()


def chunks(rows: list[dict], size: int) -> list[list[dict]]:
    return [rows[i : i + size] for i in range(0, len(rows), size)]


def test_token_batches_have_one_shape_and_hold_every_graph_once(graphs, backbone):
    cfg = config(backbone, "train.batching=tokens", "train.batch_tokens=3200")
    layout = BatchLayout.of(cfg)
    assert (layout.rows, layout.row_tokens) == (10, 320)  # 300 rounded up to a multiple of 64
    stats, plain, qids = BatchStats(), BatchStats(), []
    for group in layout.groups([graphs[:20], graphs[20:]]):
        stats.add(layout.make(group))
        qids += [g.qid for g in group]
    for chunk in chunks(graphs, 4):
        plain.add(collate(chunk))
    assert stats.shapes == {(10, 320)} and len(plain.shapes) > 1
    assert stats.real_tokens == plain.real_tokens and stats.real_token_fraction > 0.8 > plain.real_token_fraction
    assert sorted(qids) == sorted(g.qid for g in graphs) and len(qids) == len(graphs)
    assert layout.make(graphs[:3]).input_ids.shape[1] % LENGTH_MULTIPLE == 0  # the heads' node rows too


def test_a_resumed_epoch_makes_the_same_batches_from_where_it_stopped(rows, backbone):
    cfg = config(backbone, "train.batching=tokens", "train.batch_tokens=1280")
    layout = BatchLayout.of(cfg)
    with GraphEncoder(load_tokenizer(backbone), MAX_TOKENS) as encoder:
        batches = list(layout.batches(encoder.map(chunks(rows[:12], 4))))
        resumed = list(layout.batches(encoder.map(chunks(rows[:12], 4)), skip=2, limit=len(batches) - 1))
    assert len(batches) > 4 and len(resumed) == len(batches) - 3
    assert all(torch.equal(a.row_input_ids, b.row_input_ids) for a, b in zip(resumed, batches[2:]))


def test_a_token_batch_trains_with_the_loss_and_gradients_of_its_collated_graphs(graphs, backbone):
    cfg = config(backbone, "train.batching=tokens", "train.batch_tokens=1920")
    model, layout = model_of(cfg), BatchLayout.of(cfg)
    group = next(layout.groups([graphs]))
    results = []
    for batch in (layout.make(group), collate(group)):
        model.zero_grad(set_to_none=True)
        loss = model(batch).loss
        loss.backward()
        results.append((loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
    (packed_loss, packed_grads), (loss, grads) = results
    torch.testing.assert_close(packed_loss, loss, rtol=1e-4, atol=1e-5)
    for name, grad in grads.items():
        torch.testing.assert_close(packed_grads[name], grad, rtol=1e-3, atol=1e-5, msg=name)


def test_dev_evaluation_on_packed_batches_predicts_what_collated_batches_do(rows, backbone):
    cfg = config(backbone, "train.batching=tokens")
    model = model_of(cfg)
    packed = predict_graphs(
        model, model.tokenizer, rows[:8], batch_graphs=4, make_batch=BatchLayout.of(cfg).eval_batcher()
    )
    plain = predict_graphs(model, model.tokenizer, rows[:8], batch_graphs=4)
    assert [p["answer"] for p in packed] == [p["answer"] for p in plain]
    assert [p["supporting_facts"] for p in packed] == [p["supporting_facts"] for p in plain]
    torch.testing.assert_close(
        torch.tensor([p["node_score"] for p in packed]), torch.tensor([p["node_score"] for p in plain])
    )


def test_predictions_come_back_in_input_order_whatever_the_length_sorting(rows, backbone):
    model = model_of(config(backbone))
    lengths = [max(map(len, g.input_ids)) for g in encode_graphs(rows[:12], model.tokenizer, MAX_TOKENS)]
    assert lengths != sorted(lengths, reverse=True)  # the sorting has something to reorder
    seen: list = []
    sorted_ = predict_graphs(model, model.tokenizer, rows[:12], batch_graphs=4, collect_attention=seen)
    one_by_one = predict_graphs(model, model.tokenizer, rows[:12], batch_graphs=1, sort_window=1)
    assert [p["qid"] for p in sorted_] == [r["qid"] for r in rows[:12]]
    assert [p["answer"] for p in sorted_] == [p["answer"] for p in one_by_one]
    torch.testing.assert_close(
        torch.tensor([p["node_score"] for p in sorted_]), torch.tensor([p["node_score"] for p in one_by_one])
    )
    # batched longest node first: each batch's longest node is no longer than the previous batch's
    longest = [max(max(map(len, g.input_ids)) for g in graphs) for graphs, _, _ in seen]
    assert longest == sorted(longest, reverse=True) and len(seen) == 3


def test_the_token_plan_comes_close_to_the_batches_an_epoch_makes(graphs, backbone):
    cfg = config(backbone, "train.batching=tokens", "train.batch_tokens=1920", "train.workers=1")
    made = sum(1 for _ in BatchLayout.of(cfg).groups([graphs]))
    plan = plan_token_batches(graphs[:20], len(graphs), cfg)
    assert abs(plan.batches_per_epoch - made) <= max(1, made // 5)
    assert plan.steps_per_epoch == plan.batches_per_epoch


def test_a_batch_smaller_than_one_row_is_a_one_line_error(backbone):
    with pytest.raises(ConfigError, match="train.batch_tokens=128 is less than one row of 320 tokens"):
        BatchLayout.of(config(backbone, "train.batching=tokens", "train.batch_tokens=128"))


def test_without_a_process_group_lockstep_passes_items_through():
    assert list(in_lockstep(iter(range(5)), torch.device("cpu"))) == [0, 1, 2, 3, 4]


@pytest.mark.gpu
def test_on_cuda_prefetched_token_batches_arrive_pinned_and_train_in_bf16_as_in_float32(rows, backbone):
    from xh.model.predict import autocast
    from xh.train.prefetch import Prefetcher

    cfg = config(backbone, "train.batching=tokens", "train.batch_tokens=1920")
    model, layout, device = model_of(cfg).cuda(), BatchLayout.of(cfg), torch.device("cuda")
    with GraphEncoder(model.tokenizer, MAX_TOKENS, processes=1) as encoder:
        made = layout.batches(encoder.map(chunks(rows[:8], 4)))
        with Prefetcher(made, pin_memory=True) as batches:
            for batch in in_lockstep(batches, device):
                assert batch.row_input_ids.is_pinned()
                batch = batch.to(device, non_blocking=True)
                with torch.no_grad():
                    full = model(batch).loss
                with autocast(device, bf16=True):
                    half = model(batch)
                half.loss.backward()
                assert half.loss.dtype == torch.float32 and torch.isfinite(half.loss)
                torch.testing.assert_close(half.loss.detach(), full, rtol=0.05, atol=0.05)
    assert all(p.grad is None or torch.isfinite(p.grad).all() for p in model.parameters())
