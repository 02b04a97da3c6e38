"""The paper's Fig. 2 analysis: how hop attention spreads over the edges, layer by layer.

    with HopAttentionRecorder(model) as recorder:
        predictions = predict_graphs(model, tokenizer, rows, collect_attention=batches)
    summary = recorder.summary(batches)          # per hop layer and group: mean scaled weight, edge count
    log_attention_figures(recorder, batches, mlflow)

For every hop layer, the weights of three groups of edges between distinct nodes, as the paper's Fig. 2:
`all` (All -> All), `all_to_answer` (All -> Ans: edges into the gold answer node) and
`supporting_to_answer` (Supp -> Ans: from a node holding a supporting fact into the answer node).
Weights are averaged over heads and scaled by the number of nodes of the edge's graph (the paper's
x-axis: 1 is a uniform share of a whole graph). An edge into a node with a single in-edge always
weighs 1 (its softmax has one term): such edges say nothing about what the model learned, so they
are counted apart (`single_in_edge`) and left out of the three groups. Self-loops added for nodes
without in-neighbours are left out too.
"""

from __future__ import annotations

import numpy as np

GROUPS = ("all", "all_to_answer", "supporting_to_answer", "single_in_edge")
LABELS = {
    "all": "All -> All",
    "all_to_answer": "All -> Ans",
    "supporting_to_answer": "Supp -> Ans",
    "single_in_edge": "single in-edge (always 1)",
}


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
        """Per layer: the scaled weights of each group of `GROUPS` (module docstring).

        `batches`: what `predict_graphs(collect_attention=...)` gathered, one (graphs, batch, output)
        per forward call, in the order the hooks saw them."""
        out: dict[int, dict[str, list]] = {}
        for layers, (_, batch, _) in zip(self.calls, batches):
            relevant = batch.node_relevance.cpu().numpy() == 1
            answer = np.zeros(len(relevant), dtype=bool)
            nodes = batch.answer_node.cpu().numpy()
            answer[nodes[nodes >= 0]] = True
            node_graph = batch.node_graph.cpu().numpy()
            graph_size = np.bincount(node_graph, minlength=batch.num_graphs)[node_graph]  # per node
            for layer, (src, dst, w) in enumerate(layers):
                real = src != dst
                in_edges = np.bincount(dst[real], minlength=len(relevant))
                single = real & (in_edges[dst] == 1)
                shared = real & ~single
                scaled = w * graph_size[dst]
                entry = out.setdefault(layer, {group: [] for group in GROUPS})
                entry["all"].append(scaled[shared])
                entry["all_to_answer"].append(scaled[shared & answer[dst]])
                entry["supporting_to_answer"].append(scaled[shared & relevant[src] & answer[dst]])
                entry["single_in_edge"].append(scaled[single])
        return {layer: {k: np.concatenate(v) if v else np.zeros(0) for k, v in e.items()} for layer, e in out.items()}

    def summary(self, batches: list) -> dict[str, float]:
        metrics = {}
        for layer, e in self.weights(batches).items():
            for kind, values in e.items():
                metrics[f"hop{layer + 1}_attention_{kind}_edges"] = float(len(values))
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
    """One image, a histogram per hop layer of the three groups, logged to the active run as
    `hop_attention.png`; the edges into single-in-edge nodes are only counted (their weight is 1)."""
    plt = _pyplot()
    weights = recorder.weights(batches)
    if not weights:
        return
    fig, axes = plt.subplots(1, len(weights), figsize=(4 * len(weights), 3.2), squeeze=False)
    top = max(
        (float(v.max()) for e in weights.values() for k, v in e.items() if len(v) and k != "single_in_edge"),
        default=1.0,
    )
    bins = np.linspace(0, max(top, 1.0), 21)
    for ax, (layer, e) in zip(axes[0], sorted(weights.items())):
        for group in GROUPS[:3]:
            if len(e[group]):
                ax.hist(e[group], bins=bins, density=True, alpha=0.5, label=f"{LABELS[group]} ({len(e[group])})")
        ax.set_title(f"hop layer {layer + 1}  (+{len(e['single_in_edge'])} single in-edge edges, weight 1)", fontsize=8)
        ax.set_xlabel("attention weight x nodes in graph")
        ax.legend(fontsize=7)
    fig.tight_layout()
    mlflow.log_figure(fig, "hop_attention.png")
    plt.close(fig)
    mlflow.log_metrics(recorder.summary(batches))
