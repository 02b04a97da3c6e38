"""What a training run reads: its graphs, its dev set, the split between them and how the run records them.

dev = dev_source(cfg, graphs)                      # a Location, or None: a split cut from `graphs`
train_ds, dev_ds = datasets(graphs, dev, cfg.train.dev_fraction, question_kinds(cfg), cfg.train.gate_fraction)
record = split_record(str(graphs), dev and str(dev), ...)                       # xh.train.split
settings = graph_settings(graphs)                  # the graphs table's own settings, logged with the run
inputs = lineage(record, num_train, num_dev, store)  # the run's MLflow dataset inputs
"""

from __future__ import annotations

from collections.abc import Sequence

from xh.config import XHConfig
from xh.storage.store import Location, Store
from xh.train.split import split_of


def question_kinds(cfg: XHConfig) -> tuple[str, ...] | None:
    """The question types one model trains and is evaluated on (None: all of them)."""
    kind = cfg.train.question_types
    return (kind,) if kind in ("bridge", "comparison") else None


def dev_source(cfg: XHConfig, graphs: Location) -> Location | None:
    """The graphs folder of the dev set, or None for a split cut from the training graphs: `train.dev_graphs`
    when given; for FEVER, the dev claims' own retrieval-only build (`<graphs>-dev`,
    `graphs.claims_split=dev`) when it exists, instead of a split cut from gold-first training graphs."""
    import logging

    if cfg.train.dev_graphs:
        return graphs.store.at(cfg.train.dev_graphs)
    if cfg.model.task != "fever":
        return None
    dev = graphs.store.at(graphs.uri.rstrip("/") + "-dev")
    if not dev.exists():
        logging.getLogger("xh.train").info(
            "warning: no fever-dev graphs; the dev split is cut from gold-first training graphs"
        )
        return None
    return dev


def datasets(
    graphs: Location, dev: Location | None, dev_fraction: float, kinds: Sequence[str] | None, gate_fraction: float = 0.0
):
    """(train, dev) Ray datasets, materialized: their sizes fix the step plan, and nothing is left for
    read tasks to compete with the training workers for CPUs. The gate share (`xh.train.split`) is in neither."""
    import pyarrow as pa

    shares = (0.0 if dev is not None else dev_fraction, gate_fraction)

    def split(batch, part: str):
        mask = [split_of(q, *shares) == part for q in batch.column("qid").to_pylist()]
        return batch.filter(pa.array(mask, type=pa.bool_()))

    def of_kind(batch):
        mask = [t in kinds for t in batch.column("question_type").to_pylist()]
        return batch.filter(pa.array(mask, type=pa.bool_()))

    common = dict(batch_format="pyarrow", zero_copy_batch=True)

    def read(folder: Location):
        rows = folder.read_dataset()
        return rows.map_batches(of_kind, **common) if kinds is not None else rows

    rows = read(graphs)
    train = rows.map_batches(split, fn_kwargs={"part": "train"}, **common).materialize()
    if dev is not None:
        return train, read(dev).materialize()
    return train, rows.map_batches(split, fn_kwargs={"part": "dev"}, **common).materialize()


def graph_settings(graphs: Location) -> dict:
    """The settings the graphs table was built with (its `_summary.json`), logged with the training run."""
    from xh.graph.store import read_summary

    summary = read_summary(graphs)
    settings = {k: summary[k] for k in ("task", "setting", "edge_mode") if k in summary}
    return settings | summary.get("settings", {}) | {"table": graphs.uri}


def lineage(split: dict, num_train: int, num_dev: int, store: Store) -> list[tuple[dict, str]]:
    """The run's inputs for `mlflow.log_input`: its train and dev graphs (source, digest, rows), each digest
    covering the folder's files and the split that cut it."""
    from xh.tracking import dataset_ref

    how = {k: split.get(k) for k in ("dev_fraction", "gate_fraction", "question_types")}
    train = dataset_ref(store.at(split["graphs"]), "graphs-train", {"num_rows": num_train, "split": "train", **how})
    dev_folder = store.at(split["dev_graphs"] or split["graphs"])
    dev = dataset_ref(dev_folder, "graphs-dev", {"num_rows": num_dev, "split": "dev", **how})
    return [(train, "training"), (dev, "validation")]
