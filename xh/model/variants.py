"""The one place that tells the architectures apart: each model says its `architecture` (xh, dochopper,
routed) and `ARCHITECTURES` maps that name to what the rest of the project needs of it.

    model = new_model(cfg.model)                      # XHModel (any hop_variant, GESA included) or DocHopper
    model = load_saved("out/model")                   # whichever the folder holds (a per-type folder included)
    arch = architecture(model)
    batch = arch.collate(model, rows, tokenizer, cfg.model.max_node_tokens)   # `graphs` rows -> model input
    predictions = arch.predict(model, tokenizer, rows, batch_graphs=8)        # xh.inference.predict_graphs
    arch.flavour(model)                               # {"architecture": "xh", "hop_variant": "paper"}: registry
    arch.use_corpus_cache(model, folder)              # batch scoring's shared precomputed paragraphs

Every architecture takes the same `graphs` rows, returns a loss from `model(batch)`, saves with
`save_pretrained` and predicts with the same prediction keys, so that training, the registry,
promotion and batch scoring need not know which one they hold. `encodes_graphs`: its training
batches are encoded graphs, which `xh.train.batching` collates or packs; DocHopper batches its rows
itself (paragraphs without the question).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import torch

from xh.config import ModelConfig
from xh.model.dochopper.config import CONFIG_FILE as DOCHOPPER_CONFIG_FILE
from xh.model.dochopper.config import config_from_model
from xh.model.dochopper.corpus import CorpusCache
from xh.model.dochopper.model import DocHopper
from xh.model.predict import predict_xh
from xh.model.routed import ROUTED_TYPES, RoutedModel, routed_types
from xh.model.saved import load_tokenizer
from xh.model.xh import XHModel

if TYPE_CHECKING:
    from xh.storage.store import Location


class Architecture(Protocol):
    name: str
    encodes_graphs: bool

    def new(self, cfg: ModelConfig): ...

    def saved_in(self, directory: Path) -> bool: ...

    def load(self, directory: Path, device: str | torch.device): ...

    def collate(self, model, rows: Sequence[dict], tokenizer, max_node_tokens: int): ...

    def predict(self, model, tokenizer, rows: Iterable[dict], **options) -> list[dict]: ...

    def flavour(self, model) -> dict[str, str]: ...

    def use_corpus_cache(self, model, folder: str | Location) -> None: ...


class XH:
    """Transformer-XH (`xh.model.xh`), every hop variant: the default of a saved folder."""

    name, encodes_graphs = "xh", True

    def new(self, cfg: ModelConfig) -> XHModel:
        return XHModel.from_backbone(cfg)

    def saved_in(self, directory: Path) -> bool:
        return True  # XHModel.from_pretrained says what is missing

    def load(self, directory: Path, device: str | torch.device) -> XHModel:
        return XHModel.from_pretrained(directory, device)

    def collate(self, model, rows: Sequence[dict], tokenizer, max_node_tokens: int):
        from xh.graph.encode import encode_graph
        from xh.model.batch import collate

        return collate([encode_graph(row, tokenizer, max_node_tokens) for row in rows])

    def predict(self, model, tokenizer, rows: Iterable[dict], **options) -> list[dict]:
        return predict_xh(model, tokenizer, rows, **options)

    def flavour(self, model) -> dict[str, str]:
        return {"architecture": "xh", "hop_variant": model.cfg.hop_variant}

    def use_corpus_cache(self, model, folder: str | Location) -> None:
        """Nothing to precompute: XH reads each paragraph with its question."""


class DocHopperArchitecture:
    """DocHopper (`xh.model.dochopper`): its own batches and predictions, paragraphs from a corpus cache."""

    name, encodes_graphs = "dochopper", False

    def new(self, cfg: ModelConfig) -> DocHopper:
        return DocHopper.from_backbone(config_from_model(cfg))

    def saved_in(self, directory: Path) -> bool:
        return (directory / DOCHOPPER_CONFIG_FILE).is_file()

    def load(self, directory: Path, device: str | torch.device) -> DocHopper:
        return DocHopper.from_pretrained(directory, device)

    def collate(self, model, rows: Sequence[dict], tokenizer, max_node_tokens: int):
        return model.collate(model.prepare(rows))

    def predict(self, model, tokenizer, rows: Iterable[dict], *, batch_graphs: int = 8, **_) -> list[dict]:
        return model.predict_rows(list(rows), batch_size=batch_graphs)

    def flavour(self, model) -> dict[str, str]:
        return {"architecture": "dochopper"}

    def use_corpus_cache(self, model, folder: str | Location) -> None:
        model.corpus_cache = CorpusCache(folder)


class Routed:
    """A RoutedModel (`xh.model.routed`): one XH model per question type, each row to its type's model."""

    name, encodes_graphs = "routed", True

    def new(self, cfg: ModelConfig):
        raise ValueError("a routed model is made from trained per-type folders (xh.model.routed.save_routed)")

    def saved_in(self, directory: Path) -> bool:
        return routed_types(directory) is not None

    def load(self, directory: Path, device: str | torch.device) -> RoutedModel:
        models = {}
        for kind in routed_types(directory):
            model = load_saved(directory / kind, device)
            models[kind] = (model, load_tokenizer(directory / kind))
        return RoutedModel(models)

    def collate(self, model, rows: Sequence[dict], tokenizer, max_node_tokens: int):
        raise ValueError("a routed model is not trained as one: train each question type's model")

    def predict(self, model, tokenizer, rows: Iterable[dict], **options) -> list[dict]:
        rows = list(rows)
        kinds = [model.route(row) for row in rows]
        by_kind: dict[str, list[dict]] = {}
        for kind, (sub, sub_tokenizer) in model.models.items():
            picked = [row for row, k in zip(rows, kinds) if k == kind]
            by_kind[kind] = architecture(sub).predict(sub, sub_tokenizer, picked, **options) if picked else []
        position = {kind: iter(predictions) for kind, predictions in by_kind.items()}
        return [next(position[kind]) for kind in kinds]

    def flavour(self, model) -> dict[str, str]:
        return architecture(model.models[ROUTED_TYPES[0]][0]).flavour(model.models[ROUTED_TYPES[0]][0])

    def use_corpus_cache(self, model, folder: str | Location) -> None:
        """XH models only: nothing to precompute."""


ARCHITECTURES: dict[str, Architecture] = {a.name: a for a in (XH(), DocHopperArchitecture(), Routed())}
# A saved folder's architecture: the first that recognises it (XH, the default, last).
_BY_FOLDER = (ARCHITECTURES["routed"], ARCHITECTURES["dochopper"], ARCHITECTURES["xh"])


def architecture(model) -> Architecture:
    """The architecture of a model: by the name its class carries (`XHModel.architecture` ...)."""
    return ARCHITECTURES[model.architecture]


def new_model(cfg: ModelConfig):
    """The pretrained backbone with the architecture's new parameters (random)."""
    return ARCHITECTURES[cfg.architecture].new(cfg)


def load_saved(directory: str | Path, device: str | torch.device = "cpu"):
    """What `save_pretrained` (or `save_routed`) wrote, in eval mode: the folder says which architecture."""
    directory = Path(directory)
    arch = next(a for a in _BY_FOLDER if a.saved_in(directory))
    return arch.load(directory, device).eval()


def architecture_of(model) -> str:
    """The registry's flavour name: "xh" or "dochopper" (a routed model is XH per question type)."""
    return architecture(model).flavour(model)["architecture"]


def training_batch(model, rows: Sequence[dict], tokenizer, max_node_tokens: int):
    """`graphs` rows -> the model's batch (a GraphBatch for XH, a DocHopperBatch for DocHopper)."""
    return architecture(model).collate(model, rows, tokenizer, max_node_tokens)
