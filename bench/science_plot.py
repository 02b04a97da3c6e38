"""The dev curves of `bench/science.py` runs as one PNG: a panel per world, a line per system (mean over
seeds, the band their min..max), and each world's chance line (`CHANCE`).

    .venv/bin/python bench/science_plot.py OUT/results.jsonl docs/img/science-curves.png

Without matplotlib (the `bench` extra) it prints the curves as a Markdown table instead.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

METRIC = {
    "hotpot": ("bridge_em", "HotpotQA world: bridge answer EM"),
    "fever": ("multi_label_accuracy", "FEVER world: multi-evidence label accuracy"),
}


# What guessing reaches on each world's metric, from how the worlds are built (bench/science.py):
# a bridge answer is a span of the one linked page among 10 paragraphs (2 gold, 8 look-alikes), so a
# random paragraph is right 1 time in 10 before its span is even chosen; a multi-evidence claim is
# SUPPORTS or REFUTES, half each, and the decoy makes the verdict a coin toss without the hop.
CHANCE = {
    "hotpot": (0.1, "chance (at most): 1 paragraph of 10"),
    "fever": (0.5, "chance: SUPPORTS or REFUTES, half each"),
}
COLORS = {"xh_k0": "C3", "xh_k1": "C4", "xh_k3": "C0", "gesa_k3": "C2", "dochopper_h2": "C7", "dochopper_h4": "C1"}


def curves(results: list[dict]) -> dict:
    """{world: {system: (steps, values [seeds, points])}} of each world's headline metric."""
    out: dict = {}
    for r in results:
        key, _ = METRIC[r["world"]]
        steps = [p["step"] for p in r["curve"]]
        out.setdefault(r["world"], {}).setdefault(r["system"], []).append((steps, [p[key] for p in r["curve"]]))
    return {
        world: {system: (runs[0][0], np.array([v for _, v in runs])) for system, runs in systems.items()}
        for world, systems in out.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results")
    parser.add_argument("png")
    parser.add_argument("--title", default="")
    args = parser.parse_args()
    results = [json.loads(line) for line in Path(args.results).read_text().splitlines() if line.strip()]
    data = curves(results)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        for world, systems in data.items():
            print(f"\n{METRIC[world][1]}\n\n| system | " + " | ".join(map(str, next(iter(systems.values()))[0])) + " |")
            for system, (_, values) in systems.items():
                print(f"| {system} | " + " | ".join(f"{v:.2f}" for v in values.mean(0)) + " |")
        return
    fig, axes = plt.subplots(1, len(data), figsize=(8.2 * len(data), 4.4), squeeze=False)
    for ax, (world, systems) in zip(axes[0], data.items()):
        for system, (steps, values) in sorted(systems.items()):
            color = COLORS.get(system)
            ax.plot(steps, values.mean(0), color=color, marker=".", label=f"{system} ({len(values)} seeds)")
            ax.fill_between(steps, values.min(0), values.max(0), color=color, alpha=0.15)
        level, label = CHANCE[world]
        ax.axhline(level, color="black", linestyle=":", linewidth=1.3, label=label)
        ax.set_title(METRIC[world][1])
        ax.set_xlabel("optimizer step")
        ax.set_ylim(-0.04, 1)  # a curve at 0 (DocHopper's bridge EM) stays visible above the axis
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    if args.title:
        fig.suptitle(args.title, fontsize=9)
    fig.tight_layout()
    Path(args.png).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.png, dpi=110)
    print(args.png)


if __name__ == "__main__":
    main()
