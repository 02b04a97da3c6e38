"""Benchmark: how a trained model's hop attention spreads over the edges (the paper's Fig. 2), as JSON,
and the figure of docs/img/ drawn from that JSON.

    .venv/bin/python bench/hop_attention.py measure --model FOLDER --graphs DIR > hop_attention.json
    .venv/bin/python bench/hop_attention.py plot hop_attention.json --out docs/img/hop_attention.png

`measure` runs the saved model (`XHModel.save_pretrained`, e.g. a training checkpoint's `model/`)
over labelled `graphs` rows (a folder of parquet files, at most `--limit` rows) through
`xh.inference.predict_graphs` and prints one JSON line: the model, the rows and the figure's data
(`xh.train.figures.attention_record`: per hop layer, All -> All, All -> Ans and Supp -> Ans edges,
their counts, means and the share of edges per bin of attention weight x nodes in the graph).
A training run with `train.attention_figures` logs the same JSON as its `hop_attention.json` artifact;
`plot` reads either (or a file of JSON lines: the last).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
from pathlib import Path


def measure(model_dir: str, graphs: str, limit: int, batch_graphs: int) -> dict:
    import pyarrow.dataset as pads
    import torch

    from xh.inference import load_model, predict_graphs
    from xh.train.figures import HopAttentionRecorder, attention_record

    torch.manual_seed(0)
    model, tokenizer = load_model(model_dir)
    rows = pads.dataset(graphs, format="parquet").head(limit).to_pylist()
    batches: list = []
    with HopAttentionRecorder(model) as recorder:
        predict_graphs(model, tokenizer, rows, batch_graphs=batch_graphs, collect_attention=batches)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    return {
        "name": "hop_attention",
        "model": model_dir,
        "graphs": graphs,
        "rows": len(rows),
        "hop_layers": model.cfg.hop_layers,
        "machine": f"{os.cpu_count()} CPUs, {platform.machine()}, torch {torch.__version__}",
        "commit": commit,
        "hop_attention": attention_record(recorder.weights(batches)),
    }


def plot(path: str, out: str, title: str | None) -> None:
    from xh.train.figures import plot_hop_attention

    lines = [line for line in Path(path).read_text().splitlines() if line.strip()]
    try:
        data = json.loads(lines[-1])
    except json.JSONDecodeError:  # one JSON document over several lines (the run's artifact)
        data = json.loads("\n".join(lines))
    record = data.get("hop_attention", data)
    fig = plot_hop_attention(record, title or "Hop attention per edge, by hop layer")
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    m = commands.add_parser("measure", help="the hop-attention JSON of a saved model over graphs rows")
    m.add_argument("--model", required=True, help="a saved XH model folder")
    m.add_argument("--graphs", required=True, help="a folder of `graphs` parquet files (labelled rows)")
    m.add_argument("--limit", type=int, default=200)
    m.add_argument("--batch-graphs", type=int, default=8)
    p = commands.add_parser("plot", help="the PNG of a hop-attention JSON")
    p.add_argument("json", help="`measure`'s output or a run's hop_attention.json")
    p.add_argument("--out", default="docs/img/hop_attention.png")
    p.add_argument("--title")
    args = parser.parse_args()
    if args.command == "measure":
        print(json.dumps(measure(args.model, args.graphs, args.limit, args.batch_graphs)), flush=True)
    else:
        plot(args.json, args.out, args.title)


if __name__ == "__main__":
    main()
