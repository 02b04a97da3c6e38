"""The figures of docs/results/ drawn from the benchmarks' own JSON: scale bars and recall curves.

    .venv/bin/python bench/figures.py scale docs/img/scale.jsonl docs/img/scale.png
    .venv/bin/python bench/figures.py recall docs/img/recall.json docs/img/recall.png

`scale` reads the `{"name": "scale", ...}` lines `bench/scale.py` prints (one per world size) and draws,
per stage, the largest Ray worker's peak RSS and the node's total (every Ray worker's PSS, shared pages
counted once) as one bar per world size, with the ratio of the largest size's figure to the smallest's.
`recall` reads `bench/rerank.py --path-scorer --json` and draws supporting-pair and answer recall at k
for BM25 and the path scorer (the mean over seeds, the band their min..max).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

STAGE_ORDER = ("synth", "wiki", "index", "layout", "paths", "retrieve_1actor", "retrieve", "graphs", "score")


def scale_series(records: list[dict]) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """{stage: {"worker_rss": [(docs, MiB)], "node_pss": [(docs, MiB)]}}, sizes ascending."""
    out: dict = {}
    for record in sorted(records, key=lambda r: r["docs"]):
        for stage, figures in record["stages"].items():
            series = out.setdefault(stage, {"worker_rss": [], "node_pss": []})
            series["worker_rss"].append((record["docs"], figures["worker_peak_mib"]))
            series["node_pss"].append((record["docs"], figures["workers_total_peak_mib"]["pss"]))
    return {stage: out[stage] for stage in sorted(out, key=lambda s: STAGE_ORDER.index(s) if s in STAGE_ORDER else 99)}


def recall_series(result: dict) -> dict[str, dict[str, list[tuple[int, list[float]]]]]:
    """{measure: {system: [(k, [value per seed])]}} for supp_recall@k and ans_recall@k: BM25 from the
    report (it has no seed), the path scorer from each seed's run."""
    runs = {"bm25": [result["report"]["bm25"]], "path_scorer": result.get("path_scorer_runs") or []}
    out: dict = {}
    for system, system_runs in runs.items():
        for run in system_runs:
            for key, value in run.items():
                measure, _, k = key.partition("@")
                if measure in ("supp_recall", "ans_recall") and k.isdigit():
                    out.setdefault(measure, {}).setdefault(system, {}).setdefault(int(k), []).append(value)
    return {m: {s: sorted(ks.items()) for s, ks in systems.items()} for m, systems in out.items()}


def _short(n: int) -> str:
    return f"{n / 1e6:g}M" if n >= 1_000_000 else f"{n / 1e3:g}k"


def _plot_scale(series: dict, png: Path, title: str) -> None:
    """Per stage, one horizontal bar per corpus size (a handful of sizes: bars, not lines between two
    points), its MiB at the bar's end and, right of the largest, how many times the smallest size's
    figure it is against how many times the documents: a flat stage stays near x1."""
    import matplotlib.pyplot as plt
    import numpy as np

    stages = list(series)
    sizes = sorted({n for s in series.values() for n, _ in s["worker_rss"]})
    fig, axes = plt.subplots(1, 2, figsize=(13, 0.36 * len(stages) * len(sizes) + 1.8), sharey=True)
    height = 0.8 / len(sizes)
    for ax, key, label in (
        (axes[0], "worker_rss", "largest Ray worker, peak RSS (MiB)"),
        (axes[1], "node_pss", "all Ray workers of the node, peak PSS sum (MiB)"),
    ):
        top = max(mib for s in series.values() for _, mib in s[key])
        for j, size in enumerate(sizes):
            y = np.arange(len(stages)) + (j - (len(sizes) - 1) / 2) * height
            mib = [dict(series[stage][key]).get(size, np.nan) for stage in stages]
            ax.barh(y, mib, height=height * 0.95, color=f"C{j}", label=f"{_short(size)} documents")
            for yy, m in zip(y, mib):
                if not np.isnan(m):
                    ax.text(m + top * 0.01, yy, f"{m:,.0f}", va="center", fontsize=7)
        for i, stage in enumerate(stages):
            points = dict(series[stage][key])
            if sizes[0] in points and sizes[-1] in points:
                ratio = points[sizes[-1]] / points[sizes[0]]
                ax.text(top * 1.32, i, f"x{ratio:.2f}", va="center", ha="right", fontsize=8, color="dimgray")
        ax.set_xlim(0, top * 1.34)
        ax.set_title(label, fontsize=11)
        ax.grid(axis="x", alpha=0.3)
    axes[0].set_yticks(range(len(stages)), stages)
    axes[0].invert_yaxis()
    growth = f"x{sizes[-1] / sizes[0]:.2f}" if len(sizes) > 1 else ""
    axes[1].legend(fontsize=8, loc="lower right")
    fig.suptitle(
        title
        or f"Memory per stage against corpus size (grey: {_short(sizes[-1])} against {_short(sizes[0])}; "
        f"the documents grew {growth})",
        fontsize=12,
    )
    fig.tight_layout()
    fig.savefig(png, dpi=120)


def _plot_recall(series: dict, png: Path, title: str) -> None:
    import matplotlib.pyplot as plt
    import numpy as np

    names = {"bm25": ("BM25", "C3"), "path_scorer": ("path scorer", "C0")}
    fig, axes = plt.subplots(1, len(series), figsize=(6 * len(series), 4.5), squeeze=False)
    for ax, (measure, systems) in zip(axes[0], sorted(series.items(), reverse=True)):
        for system, points in systems.items():
            ks = [k for k, _ in points]
            values = np.array([v for _, v in points])
            label, color = names.get(system, (system, "C7"))
            ax.plot(ks, values.mean(1), marker="o", color=color, label=label)
            if values.shape[1] > 1:
                ax.fill_between(ks, values.min(1), values.max(1), color=color, alpha=0.2, linewidth=0)
        ax.set_xscale("log")
        ax.set_xticks(ks, [str(k) for k in ks])
        ax.xaxis.set_minor_formatter(plt.NullFormatter())
        ax.set_ylim(0, 1)
        ax.set_xlabel("k (documents kept)")
        ax.set_title("both supporting paragraphs in the top k" if measure == "supp_recall" else "answer in the top k")
        ax.grid(True, alpha=0.3)
        ax.legend(loc="lower right")
    seeds = len(next(iter(series.get("supp_recall", {}).get("path_scorer", [(0, [0])])))[1])
    fig.suptitle(
        title
        or f"Retrieval recall at k on real HotpotQA: BM25 against the path scorer ({seeds} seeds, band: min..max)",
        fontsize=12,
    )
    fig.tight_layout()
    fig.savefig(png, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("figure", choices=["scale", "recall"])
    parser.add_argument("source", type=Path)
    parser.add_argument("png", type=Path)
    parser.add_argument("--title", default="")
    args = parser.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    if args.figure == "scale":
        records = [json.loads(line) for line in args.source.read_text().splitlines() if line.strip()]
        _plot_scale(scale_series(records), args.png, args.title)
    else:
        _plot_recall(recall_series(json.loads(args.source.read_text())), args.png, args.title)
    print(args.png)


if __name__ == "__main__":
    main()
