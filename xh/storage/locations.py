"""Where each stage reads and writes by default: `<storage.root>/...`, unless the config names a place.

One function per location, each a URI string; a stage turns it into a `Location` with its `Store`:

    store = Store.from_config(cfg)
    index = store.at(locations.index(cfg))
"""

from __future__ import annotations

from xh.config import XHConfig
from xh.storage.uris import join


def _root(cfg: XHConfig, *parts: str) -> str:
    return join(cfg.storage.root, *parts)


def world(cfg: XHConfig) -> str:
    return _root(cfg, "world")


def tables(cfg: XHConfig, configured: str | None = None) -> str:
    """The wiki tables; `configured`: the stage's own setting (`wiki.output`, `retrieve.tables`, ...)."""
    return configured or _root(cfg, "tables")


def index(cfg: XHConfig) -> str:
    return cfg.retrieve.index or _root(cfg, "index", "bm25")


def retrieval(cfg: XHConfig) -> str:
    return cfg.retrieve.output or _root(cfg, "retrieval")


def graphs(cfg: XHConfig, folder: str, configured: str | None = None) -> str:
    return configured or _root(cfg, "graphs", folder)


def predictions(cfg: XHConfig) -> str:
    return cfg.score.output or _root(cfg, "predictions")


def train_storage(cfg: XHConfig) -> str:
    return cfg.train.storage_path or _root(cfg, "train")


def path_scorer(cfg: XHConfig) -> str:
    return cfg.retrieve.path_scorer_output or _root(cfg, "models", "path-scorer")


def models(cfg: XHConfig, name: str) -> str:
    """A model the pipeline trains besides the registered one (reranker, question-type classifier)."""
    return _root(cfg, "models", name)


def evaluation(cfg: XHConfig) -> str:
    return _root(cfg, "eval")
