"""The paper's Fig. 2 analysis: how hop attention spreads over the edges, layer by layer.

    with HopAttentionRecorder(model) as recorder:
        predictions = predict_graphs(model, tokenizer, rows, collect_attention=batches)
    summary = recorder.summary(batches)          # per hop layer and group: mean scaled weight, edge count
    record = attention_record(recorder.weights(batches))   # JSON: per layer and group, a histogram
    fig = plot_hop_attention(record)             # what log_attention_figures logs, and bench/hop_attention.py draws
    log_attention_figures(recorder, batches, mlflow)        # hop_attention.png, hop_attention.json, summary

For every hop layer, the weights of three groups of edges between distinct nodes, as the paper's Fig. 2:
`all` (All -> All), `all_to_answer` (All -> Ans: edges into the gold answer node) and
`supporting_to_answer` (Supp -> Ans: from a node holding a supporting fact into the answer node).
Weights are averaged over heads and scaled by the in-degree of the edge's target node: a node's hop
attention is one softmax over its in-edges, so 1 is the uniform share of that softmax, above 1 an edge
that gets more than its even part, below 1 less. (The paper's x-axis scales by the nodes of the graph,
whose uniform reference is no node's softmax.) Since a node's in-edge weights sum to 1, the mean of the
scaled weights over every in-edge of a set of nodes is exactly 1: the All -> All and All -> Ans means
are fixed by the graphs and say nothing, so only Supp -> Ans, a subset of the answer's in-edges, has
its mean recorded. An edge into a node with a single in-edge always weighs 1 (its softmax has one
term): such edges are counted apart (`single_in_edge`) and left out of the three groups. Self-loops
added for nodes without in-neighbours are left out too.
"""

from __future__ import annotations

import numpy as np

GROUPS = ("all", "all_to_answer", "supporting_to_answer", "single_in_edge")
# The groups whose mean scaled weight is not 1 by construction (module docstring).
MEANINGFUL_MEANS = ("supporting_to_answer",)
LABELS = {
    "all": "All -> All",
    "all_to_answer": "All -> Ans",
    "supporting_to_answer": "Supp -> Ans",
    "single_in_edge": "single in-edge (always 1)",
}


class HopAttentionRecorder:
    """Forward hooks on each hop step: (src, dst, weights) per layer per forward call."""

    def __init__(self, model):
        self.model = model
        self.calls: list[list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = []  # [forward][layer]
        self._handles: list = []

    def __enter__(self) -> HopAttentionRecorder:
        steps = list(self.model.hop_steps)

        def hook(layer: int, module, args, output) -> None:
            graph = args[1]  # a hop step appends its layer's weights (eval) to its graph's `attention`
            weights = graph.attention[-1]
            if layer == 0:
                self.calls.append([])
            self.calls[-1].append(
                (graph.src.cpu().numpy(), graph.dst.cpu().numpy(), weights.detach().float().mean(-1).cpu().numpy())
            )

        for layer, step in enumerate(steps):
            self._handles.append(step.register_forward_hook(lambda m, a, o, layer=layer: hook(layer, m, a, o)))
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
            for layer, (src, dst, w) in enumerate(layers):
                real = src != dst
                in_edges = np.bincount(dst[real], minlength=len(relevant))
                single = real & (in_edges[dst] == 1)
                shared = real & ~single
                scaled = w * in_edges[dst]  # 1: the uniform share of the target's softmax
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
                if len(values) and kind in MEANINGFUL_MEANS:
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


def attention_record(weights: dict[int, dict[str, np.ndarray]], bins: int = 20) -> dict:
    """The figure's data as JSON: per hop layer and group, its edge count, mean (None where it is 1 by
    construction, `MEANINGFUL_MEANS`) and the share of its edges in each bin of scaled weight. The bins, shared by every panel, reach the 99th percentile
    (rounded up so that 1, a uniform share, is a bin edge); weights above it count in the last bin.
    The single-in-edge edges are only counted (their weight is 1)."""
    shown = [v for e in weights.values() for k, v in e.items() if len(v) and k != "single_in_edge"]
    top = float(np.quantile(np.concatenate(shown), 0.99)) if shown else 1.0
    upper = next(b for b in (2, 4, 5, 10, 20, 50, 100, 200, 500, 1000, float("inf")) if b >= top)
    upper = upper if upper != float("inf") else float(np.ceil(top))
    edges = np.linspace(0, upper, bins + 1)
    layers = []
    for layer, e in sorted(weights.items()):
        groups = {}
        for group in GROUPS[:3]:
            values = e[group]
            counts = np.histogram(np.clip(values, 0, upper), bins=edges)[0]
            groups[group] = {
                "edges": int(len(values)),
                "mean": float(values.mean()) if len(values) and group in MEANINGFUL_MEANS else None,
                "share": (counts / max(len(values), 1)).round(6).tolist(),
                "above": int((values > upper).sum()),
            }
        layers.append({"layer": layer + 1, "groups": groups, "single_in_edge": int(len(e["single_in_edge"]))})
    return {"bins": edges.round(6).tolist(), "layers": layers}


COLOURS = {"all": "#4c72b0", "all_to_answer": "#dd8452", "supporting_to_answer": "#55a868"}


def plot_hop_attention(record: dict, title: str = "Hop attention per edge, by hop layer"):
    """One panel per hop layer: for each group of edges, the share of its edges per bin of scaled weight,
    drawn as an outline (groups overlap without blending), and a dashed line at 1, where an edge gets the
    uniform share of its target's in-edges; a triangle on the axis marks Supp -> Ans's mean (the other
    groups' means are 1 by construction)."""
    plt = _pyplot()
    bins = np.array(record["bins"])
    layers = record["layers"]
    fig, axes = plt.subplots(1, len(layers), figsize=(4.6 * len(layers), 5.2), sharey=True, squeeze=False)
    for ax, entry in zip(axes[0], layers):
        for group, data in entry["groups"].items():
            if not data["edges"]:
                continue
            label = f"{LABELS[group]}: {data['edges']} edges"
            if data["mean"] is not None:
                label += f", mean {data['mean']:.2f}"
                mean = min(data["mean"], bins[-1])  # a mean beyond the last bin sits at its edge
                ax.plot([mean], [0], marker="^", markersize=9, color=COLOURS[group], clip_on=False, zorder=3)
            ax.stairs(data["share"], bins, color=COLOURS[group], linewidth=2.0, label=label)
        ax.axvline(1.0, color="black", linestyle="--", linewidth=1.2, label="uniform over the target's in-edges")
        ax.set_title(f"Hop layer {entry['layer']}", fontsize=12)
        ax.set_xlabel("attention weight × in-edges of the target node", fontsize=10)
        ax.set_xlim(bins[0], bins[-1])
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(0.0, -0.2), frameon=False)  # below: no bar hidden
        above = sum(data.get("above", 0) for data in entry["groups"].values())
        notes = [f"last bin: also the {above} edges above {bins[-1]:g}"] if above else []
        if entry["single_in_edge"]:
            notes.append(f"not shown: {entry['single_in_edge']} edges into single-in-edge nodes (weight 1)")
        ax.text(0.0, -0.62, "\n".join(notes), transform=ax.transAxes, fontsize=8, color="dimgray", va="top")
    axes[0][0].set_ylabel("share of the group's edges", fontsize=10)
    fig.suptitle(title, fontsize=13)
    fig.subplots_adjust(left=0.05, right=0.99, top=0.86, bottom=0.42, wspace=0.14)  # room for legends, notes
    return fig


def log_attention_figures(recorder: HopAttentionRecorder, batches: list, mlflow) -> None:
    """The hop-attention figure (`plot_hop_attention`) of the active run as `hop_attention.png`, its data
    as `hop_attention.json` (`attention_record`), and the summary metrics."""
    weights = recorder.weights(batches)
    if not weights:
        return
    record = attention_record(weights)
    fig = plot_hop_attention(record)
    mlflow.log_figure(fig, "hop_attention.png")
    mlflow.log_dict(record, "hop_attention.json")
    _pyplot().close(fig)
    mlflow.log_metrics(recorder.summary(batches))
