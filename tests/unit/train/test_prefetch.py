"""Batches made ahead of the step: `Prefetcher` (a background thread) and `GraphEncoder` (worker processes)."""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest
import torch

from xh.graph.encode import GraphEncoder, encode_graph, own_rows
from xh.train.prefetch import Prefetcher, timed


def slow_items(count: int, seconds: float):
    for k in range(count):
        time.sleep(seconds)
        yield k


def test_timers_on_a_chain_nest_each_counting_what_feeds_it():
    seconds: dict[str, float] = {}
    inner = timed(slow_items(3, 0.02), seconds, "inner")
    outer = timed((k for k in inner if time.sleep(0.01) is None), seconds, "outer")
    assert list(outer) == [0, 1, 2]
    assert seconds["inner"] >= 0.06  # three items of 20 ms
    assert seconds["outer"] - seconds["inner"] >= 0.03  # the outer step's own 10 ms an item


def test_items_arrive_in_order_and_the_wait_is_measured():
    with Prefetcher(slow_items(5, 0.02), depth=2) as items:
        assert list(items) == [0, 1, 2, 3, 4]
        assert items.count == 5
        assert 0.05 < items.wait_seconds < 1.0  # nothing else to do here: the consumer waited for each item
    assert list(items) == []  # exhausted stays exhausted


def test_work_done_while_the_consumer_is_busy_is_not_waited_for():
    with Prefetcher(slow_items(4, 0.02), depth=4) as items:
        time.sleep(0.3)  # a long "step": everything is made meanwhile
        assert list(items) == [0, 1, 2, 3]
        assert items.wait_seconds < 0.02


def test_an_error_in_the_chain_reaches_the_consumer_at_its_item():
    def failing():
        yield 1
        raise ValueError("graph 'q7' has no nodes")

    items = Prefetcher(failing())
    assert next(items) == 1
    with pytest.raises(ValueError, match="graph 'q7' has no nodes"):
        next(items)
    items.close()


def test_closing_early_stops_the_thread():
    before = threading.active_count()
    items = Prefetcher(slow_items(1000, 0.001), depth=2)
    next(items)
    items.close()
    assert threading.active_count() == before


def row(qid: str, words: int) -> dict:
    node = {
        "doc_id": "d",
        "title": "T",
        "sentences": ["word " * words + "end."],
        "anchors": [],
        "source": "ir",
        "score": 1.0,
        "line": -1,
        "answer_spans": None,
        "supporting_sentences": None,
        "is_evidence": None,
    }
    return {
        "qid": qid,
        "task": "hotpot",
        "question": "which word?",
        "question_type": "bridge",
        "answer": None,
        "answer_type": None,
        "claim_label": None,
        "supporting_facts": None,
        "nodes": [node, node],
        "edges": [{"src": 0, "dst": 1}],
        "edge_mode": "hyperlink",
    }


def test_a_slice_of_a_table_goes_to_an_encoder_process_without_its_parents_rows():
    import pickle

    import pyarrow as pa

    table = pa.table({"qid": [f"q{k}" for k in range(2000)], "question": ["x" * 500] * 2000})
    chunk = table.slice(1000, 16)
    assert len(pickle.dumps(chunk)) > 1_000_000  # pyarrow pickles a slice's parent buffers whole
    assert len(pickle.dumps(own_rows(chunk))) < 20_000
    assert own_rows(chunk).equals(chunk)


@pytest.mark.slow
@pytest.mark.parametrize("processes", [0, 2])
def test_the_graph_encoder_gives_encode_graphs_output_chunk_by_chunk(minilm_path, processes):
    import pyarrow as pa
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(minilm_path)
    chunks = [[row(f"q{c}{k}", 5 + 7 * c + k) for k in range(3)] for c in range(4)]
    table = pa.Table.from_pylist([r for rows in chunks for r in rows])
    slices = [table.slice(3 * c, 3) for c in range(4)]  # as Ray Data hands them: slices of a block
    with GraphEncoder(tokenizer, max_node_tokens=32, processes=processes) as encoder:
        encoded = list(encoder.map(iter(chunks)))
        assert [[g.qid for g in graphs] for graphs in encoder.map(slices)] == [[g.qid for g in gs] for gs in encoded]
        if processes:  # each worker tokenizes on one thread: the processes are the parallelism
            assert set(encoder._pool.map(os.getenv, ["TOKENIZERS_PARALLELISM"] * 4)) == {"false"}
    assert [[g.qid for g in graphs] for graphs in encoded] == [[r["qid"] for r in rows] for rows in chunks]
    for rows, graphs in zip(chunks, encoded):
        for r, g in zip(rows, graphs):
            expected = encode_graph(r, tokenizer, 32)
            assert all(np.array_equal(a, b) for a, b in zip(g.input_ids, expected.input_ids))


@pytest.mark.gpu
def test_batches_come_pinned_and_copy_to_the_gpu_asynchronously():
    from tests.unit.model.test_packing import graphs
    from xh.model.packing import pack

    with Prefetcher((pack(graphs(seed), row_tokens=128) for seed in range(3)), pin_memory=True) as batches:
        for batch in batches:
            assert batch.row_input_ids.is_pinned() and batch.token_index.is_pinned()
            on_gpu = batch.to("cuda", non_blocking=True)
            torch.cuda.synchronize()
            assert torch.equal(on_gpu.row_input_ids.cpu(), batch.row_input_ids)
