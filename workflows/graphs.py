"""Evidence graphs on Ray Data (the stage: `xh.stages.graphs`).

    xh graphs build                                                    # retrieval setting, from <root>/retrieval
    xh graphs build --set graphs.setting=distractor \\
        --set graphs.questions=../shared/data/hotpotqa/hotpot_train_sample500.json
    xh graphs build --config my.yaml --set graphs.edge_mode=bidirectional

    xh.graph.store.read_graphs("runs/demo/graphs/hotpot")             # the result, as a Ray dataset (trainer)

`run` logs the config and the summary to an MLflow run; `build` does the same work without tracking,
for drivers that track it themselves (the demo).
"""

from __future__ import annotations

from workflows.common import init_ray
from xh.config import XHConfig
from xh.stages import graphs
from xh.storage.store import Store


def build(cfg: XHConfig, store: Store | None = None) -> dict:
    """Build the graphs of `cfg.graphs.task`; returns the summary (also written to `<output>/_summary.json`)."""
    store = store or Store.from_config(cfg)
    plan = graphs.plan(cfg, store)  # bad input stops the stage here, before Ray starts
    init_ray(cfg)
    return graphs.build(cfg, store, plan)


def run(cfg: XHConfig) -> dict:
    """`build`, tracked: the stage's config as params, the summary's numbers as metrics, the summary as a file."""
    from xh.tracking import stage_run

    store = Store.from_config(cfg)
    with stage_run(cfg, "graphs", store=store) as tracked:
        summary = build(cfg, store)
        graphs.log_summary(summary)
    return {"mlflow_run_id": tracked.info.run_id, **summary}
