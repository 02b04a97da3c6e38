"""A BERT-family encoder with something on top, from its pretrained start to its saved folder.

The same steps serve `XHModel`, the re-ranker (`xh.retrieval.rerank.CrossEncoder`) and the
question-type classifier (`xh.model.qtype`):

    backbone = pretrained_backbone("bert-base-uncased")      # or a local folder; float32
    tokenizer = load_tokenizer("bert-base-uncased")           # a fast tokenizer (offset mappings)

    save_encoder_model("out/reranker", "reranker.json", {"format": "xh-cross-encoder", "version": 1, ...},
                       model.state_dict(), backbone=model.backbone, tokenizer=model.tokenizer)   # or s3://...
    saved = load_encoder_model("out/reranker", "reranker.json", "xh-cross-encoder", 1, what="re-ranker")
    model = CrossEncoder(saved.new_backbone(), saved.tokenizer, ...)
    model.load_state_dict(saved.weights)

A saved folder (local or s3://); loading it reads JSON and safetensors only, never a pickle:

    <config file>        {"format", "version", ...}: the model's own settings (xh_config.json, reranker.json, qtype.json)
    model.safetensors    every tensor of the model; the backbone's under `backbone.`
    config.json          the backbone's transformers config   } absent when the backbone is not saved
    tokenizer files      tokenizer.json, vocab.txt, ...       } (a question-type head on its own)
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from xh.storage.store import Location, located

WEIGHTS_FILE = "model.safetensors"
BACKBONE_CONFIG_FILE = "config.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"


class NotASavedModel(FileNotFoundError, ValueError):
    """A folder without the model asked for. Both a FileNotFoundError (the drivers print it in one line)
    and a ValueError (what loading a foreign folder has always raised)."""


# --- the pretrained start --------------------------------------------------------------------------


def pretrained_backbone(name_or_path: str | Path, **kwargs) -> torch.nn.Module:
    """`AutoModel.from_pretrained` in float32 (whatever the checkpoint's dtype); a one-line error otherwise.

    The name goes through `xh.model.backbones.resolve_backbone` first: None or the MiniLM hub name become the offline
    copy, an s3:// folder this node's cached copy.
    """
    from transformers import AutoModel

    from xh.model.backbones import resolve_backbone

    try:
        return AutoModel.from_pretrained(resolve_backbone(str(name_or_path)), dtype=torch.float32, **kwargs)
    except OSError as e:
        raise ValueError(f"backbone {str(name_or_path)!r} could not be loaded: {str(e).splitlines()[0]}") from None


def load_tokenizer(name_or_path: str | Path):
    """The backbone's fast tokenizer (decoding needs its offset mapping); a one-line error otherwise."""
    from transformers import AutoTokenizer

    from xh.model.backbones import resolve_backbone

    try:
        tokenizer = AutoTokenizer.from_pretrained(resolve_backbone(str(name_or_path)))
    except (OSError, ValueError) as e:
        raise ValueError(f"no tokenizer could be loaded from {name_or_path}: {str(e).splitlines()[0]}") from None
    if not tokenizer.is_fast:
        raise ValueError(f"the tokenizer of {name_or_path} is not a fast tokenizer (offset mappings are needed)")
    return tokenizer


# --- the saved folder ------------------------------------------------------------------------------


@dataclass
class SavedModel:
    """What `load_encoder_model` read: the model assembles itself from it."""

    config: dict  # the config file's JSON
    weights: dict[str, torch.Tensor]  # every tensor, by state_dict name
    backbone_config: object | None  # transformers config; None when the backbone was not saved
    tokenizer: object | None

    def new_backbone(self, **kwargs) -> torch.nn.Module:
        """The saved backbone's architecture, with random weights until `weights` are loaded into it."""
        from transformers import AutoModel

        return AutoModel.from_config(self.backbone_config, **kwargs)

    def tensors(self, prefix: str) -> dict[str, torch.Tensor]:
        """The weights under `prefix` (e.g. "backbone."), named without it."""
        return {name[len(prefix) :]: t for name, t in self.weights.items() if name.startswith(prefix)}


def save_encoder_model(
    folder: str | Path | Location,
    config_file: str,
    config: dict,
    weights: dict[str, torch.Tensor],
    *,
    backbone: torch.nn.Module | None = None,
    tokenizer=None,
) -> None:
    """Write a saved folder (local or s3://): `config` as JSON, `weights`, the backbone's config, the tokenizer."""
    where = located(folder)
    if where.is_s3:
        with tempfile.TemporaryDirectory() as tmp:
            save_encoder_model(tmp, config_file, config, weights, backbone=backbone, tokenizer=tokenizer)
            where.upload(tmp)
        return
    directory = Path(where.uri)
    directory.mkdir(parents=True, exist_ok=True)
    # Copies on the CPU: safetensors refuses tensors sharing storage, and the weights may sit on a GPU.
    tensors = {name: t.detach().to("cpu", copy=True).contiguous() for name, t in weights.items()}
    save_file(tensors, str(directory / WEIGHTS_FILE), metadata={"format": config["format"]})
    if backbone is not None:
        backbone.config.save_pretrained(directory)
    if tokenizer is not None:
        tokenizer.save_pretrained(directory)
    (directory / config_file).write_text(json.dumps(config, indent=2) + "\n")


def load_encoder_model(
    folder: str | Path | Location, config_file: str, format: str, version: int, *, what: str
) -> SavedModel:
    """Read a saved folder (local or s3://), refusing one without `config_file` or of another format or version."""
    where = located(folder)
    if not where.is_s3:
        return _load_local(Path(where.uri), where.uri, config_file, format, version, what)
    with tempfile.TemporaryDirectory() as tmp:
        where.download(tmp)
        return _load_local(Path(tmp), where.uri, config_file, format, version, what)


def _load_local(directory: Path, name: str, config_file: str, format: str, version: int, what: str) -> SavedModel:
    if not (directory / config_file).is_file():
        raise NotASavedModel(f"{name} is not a saved {what} (no {config_file})")
    config = json.loads((directory / config_file).read_text())
    if config.get("format") != format or config.get("version") != version:
        found = f"format {config.get('format')!r} version {config.get('version')!r}"
        raise ValueError(f"{name}/{config_file}: unsupported {found}")
    if not (directory / WEIGHTS_FILE).is_file():
        raise NotASavedModel(f"{name} is not a saved {what} (no {WEIGHTS_FILE})")
    weights = load_file(str(directory / WEIGHTS_FILE))
    backbone_config, tokenizer = None, None
    if (directory / BACKBONE_CONFIG_FILE).is_file():
        from transformers import AutoConfig

        backbone_config = AutoConfig.from_pretrained(directory)
    if (directory / TOKENIZER_CONFIG_FILE).is_file():
        tokenizer = load_tokenizer(directory)
    return SavedModel(config, weights, backbone_config, tokenizer)
