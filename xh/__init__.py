"""Transformer-XH on Ray: the library (stages as subpackages, no Ray driver code, no side effects at import).

Start with `xh.config` (typed config), `xh.storage.uris` (URIs -> filesystems) and `xh.synth`
(the generated mini-Wikipedia); the drivers that run stages on Ray live in `workflows/`.
"""

__version__ = "0.1.0"
