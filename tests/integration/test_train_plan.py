"""The step plan of a training run (`xh.train.batching.step_plan`), from a Ray dataset of real HotpotQA
graphs (the shared sample, distractor setting) on the session cluster."""

from __future__ import annotations

import pytest

from xh.config import ConfigError, GraphsConfig, load_config

GRAPHS = 24


@pytest.fixture(scope="module")
def rows(shared_data) -> list[dict]:
    from xh.graph.hotpot import distractor_graphs, read_distractor_questions

    items, _ = read_distractor_questions(str(shared_data / "hotpotqa/hotpot_train_sample500.json"))
    return [o.graph for o in distractor_graphs(items[: GRAPHS + 8], GraphsConfig()) if o.graph][:GRAPHS]


def test_token_batching_plans_from_tokens_alone_even_when_batch_graphs_exceeds_the_graphs(
    rows, make_tiny_backbone, ray_cluster
):
    """`batch_graphs` does not apply to token batches: more of them than there are graphs refuses a run
    of graph batches, never one of token batches."""
    import ray.data

    from xh.graph.encode import encode_graphs
    from xh.model.xh import load_tokenizer
    from xh.train.batching import plan_token_batches, step_plan

    backbone = make_tiny_backbone(layers=2)
    settings = [f"model.backbone={backbone}", "model.max_node_tokens=96", f"train.batch_graphs={2 * GRAPHS}"]
    train_ds = ray.data.from_items(rows)
    tokens = load_config(None, [*settings, "train.batching=tokens", "train.batch_tokens=1024"])
    plan = step_plan(tokens, train_ds, GRAPHS)
    expected = plan_token_batches(encode_graphs(rows, load_tokenizer(backbone), 96), GRAPHS, tokens)
    assert plan == expected and plan.total_steps > 0
    with pytest.raises(ConfigError, match=f"{GRAPHS} training graphs are too few for 1 worker"):
        step_plan(load_config(None, [*settings, "train.batching=graphs"]), train_ds, GRAPHS)
