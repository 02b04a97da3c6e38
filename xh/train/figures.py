"""The paper's Fig. 2 analysis: how hop attention spreads over the edges, layer by layer.

    with HopAttentionRecorder(model) as recorder:
        predictions = predict_graphs(model, tokenizer, rows, collect_attention=batches)
    summary = recorder.summary(batches)          # per hop layer: mean weight, all edges vs supporting -> answer
    log_attention_figures(recorder, batches, mlflow)

For every hop layer it compares the weights on all edges between distinct nodes with those on edges
from a supporting-fact node into the answer node: a model that hops usefully puts more weight there.
Weights are averaged over heads. Self-loops added for nodes without in-neighbours are left out.
"""

from __future__ import annotations

import numpy as np


class HopAttentionRecorder:
    """Forward hooks on each hop step's attention module: (src, dst, weights) per layer per forward call."""

    def __init__(self, model):
        self.model = model
        self.calls: list[list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = []  # [forward][layer]
        self._handles: list = []

    def __enter__(self) -> HopAttentionRecorder:
        steps = list(self.model.hop_steps)

        def hook(layer: int, module, args, output) -> None:
            graph, weights = args[1], output[1]
            if layer == 0:
                self.calls.append([])
            self.calls[-1].append(
                (graph.src.cpu().numpy(), graph.dst.cpu().numpy(), weights.detach().float().mean(-1).cpu().numpy())
            )

        for layer, step in enumerate(steps):
            self._handles.append(
                step.attention.register_forward_hook(lambda m, a, o, layer=layer: hook(layer, m, a, o))
            )
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()

    def weights(self, batches: list) -> dict[int, dict[str, np.ndarray]]:
        """Per layer: `all` (every edge between distinct nodes) and `supporting_to_answer` weights.

        `batches`: what `predict_graphs(collect_attention=...)` gathered, one (graphs, batch, output)
        per forward call, in the order the hooks saw them."""
        out: dict[int, dict[str, list]] = {}
        for layers, (_, batch, _) in zip(self.calls, batches):
            relevant = batch.node_relevance.cpu().numpy() == 1
            answer = np.zeros(len(relevant), dtype=bool)
            nodes = batch.answer_node.cpu().numpy()
            answer[nodes[nodes >= 0]] = True
            for layer, (src, dst, w) in enumerate(layers):
                real = src != dst
                picked = real & relevant[src] & answer[dst]
                entry = out.setdefault(layer, {"all": [], "supporting_to_answer": []})
                entry["all"].append(w[real])
                entry["supporting_to_answer"].append(w[picked])
        return {layer: {k: np.concatenate(v) if v else np.zeros(0) for k, v in e.items()} for layer, e in out.items()}

    def summary(self, batches: list) -> dict[str, float]:
        metrics = {}
        for layer, e in self.weights(batches).items():
            for kind, values in e.items():
                if len(values):
                    metrics[f"hop{layer + 1}_attention_{kind}_mean"] = float(values.mean())
        return metrics


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # no display on a worker
    import matplotlib.pyplot as plt

    return plt


def log_training_curves(mlflow, run_id: str, names=("loss", "lr", "dev_f1", "graphs_per_s")) -> None:
    """Loss, learning rate, dev metric and throughput against the step, as `training_curves.png`."""
    plt = _pyplot()
    client = mlflow.MlflowClient()
    series = {n: client.get_metric_history(run_id, n) for n in names}
    series = {n: sorted((m.step, m.value) for m in h) for n, h in series.items() if h}
    if not series:
        return
    fig, axes = plt.subplots(1, len(series), figsize=(4 * len(series), 3.2), squeeze=False)
    for ax, (name, points) in zip(axes[0], series.items()):
        steps, values = zip(*points)
        ax.plot(steps, values, marker="." if len(points) < 30 else None)
        ax.set_title(name)
        ax.set_xlabel("step")
    fig.tight_layout()
    mlflow.log_figure(fig, "training_curves.png")
    plt.close(fig)


def log_attention_figures(recorder: HopAttentionRecorder, batches: list, mlflow) -> None:
    """One image, a histogram per hop layer, logged to the active run as `hop_attention.png`."""
    plt = _pyplot()
    weights = recorder.weights(batches)
    if not weights:
        return
    fig, axes = plt.subplots(1, len(weights), figsize=(4 * len(weights), 3.2), squeeze=False)
    bins = np.linspace(0, 1, 21)
    for ax, (layer, e) in zip(axes[0], sorted(weights.items())):
        ax.hist(e["all"], bins=bins, density=True, alpha=0.6, label=f"all -> all ({len(e['all'])})")
        if len(e["supporting_to_answer"]):
            ax.hist(
                e["supporting_to_answer"],
                bins=bins,
                density=True,
                alpha=0.6,
                label=f"supporting -> answer ({len(e['supporting_to_answer'])})",
            )
        ax.set_title(f"hop layer {layer + 1}")
        ax.set_xlabel("attention weight")
        ax.legend(fontsize=7)
    fig.tight_layout()
    mlflow.log_figure(fig, "hop_attention.png")
    plt.close(fig)
    mlflow.log_metrics(recorder.summary(batches))
