"""XH's predictions for graph rows (`xh.inference.predict_graphs` for an `XHModel`): rows encoded,
batched longest node first within a window, run under autocast and decoded (`xh.model.decode`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import nullcontext

import torch

from xh.graph.encode import encode_graph
from xh.model.batch import GraphBatch, collate
from xh.model.decode import decode


def autocast(device: torch.device, bf16: bool):
    """bf16 autocast on GPUs; CPU stays fp32 (faster and exact there)."""
    if bf16 and device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return nullcontext()


def predict_xh(
    model,
    tokenizer,
    rows: Iterable[dict],
    *,
    batch_graphs: int = 8,
    bf16: bool = True,
    collect_attention: list | None = None,
    make_batch: Callable[[list], GraphBatch] = collate,
    sp_mode: str | None = None,
    sort_window: int = 8,
) -> list[dict]:
    """Predictions of an XHModel for graph rows, in order (the options: `xh.inference.predict_graphs`)."""
    device = next(model.parameters()).device
    cfg = model.cfg
    predictions: list[dict] = []
    window: list[dict] = []

    def run(graphs: list) -> list[dict]:
        batch = make_batch(graphs).to(device)
        with torch.inference_mode(), autocast(device, bf16):
            output = model(batch)
        if collect_attention is not None:
            collect_attention.append((graphs, batch, output))
        return decode(
            graphs,
            batch,
            output,
            cfg.max_answer_tokens,
            sp_mode=sp_mode or cfg.sp_mode,
            by_span=not cfg.node_prediction,
        )

    def flush() -> None:
        graphs = [encode_graph(row, tokenizer, cfg.max_node_tokens) for row in window]
        order = sorted(range(len(graphs)), key=lambda k: -max(map(len, graphs[k].input_ids)))
        out: list[dict | None] = [None] * len(graphs)
        for start in range(0, len(order), batch_graphs):
            picked = order[start : start + batch_graphs]
            for k, prediction in zip(picked, run([graphs[k] for k in picked])):
                out[k] = prediction
        predictions.extend(out)
        window.clear()

    model.eval()
    for row in rows:
        window.append(row)
        if len(window) == batch_graphs * sort_window:
            flush()
    if window:
        flush()
    return predictions
