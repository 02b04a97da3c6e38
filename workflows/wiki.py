"""Wikipedia dump -> docs / links / redirects / anchors / quarantine tables, on Ray Data (the stage:
`xh.stages.wiki`; its steps: `xh.wiki.process`).

    xh wiki process --config configs/demo.yaml \\
        --set wiki.format=mediawiki --set 'wiki.inputs=[../shared/data/wiki]'
    xh wiki process --format hotpot --input runs/demo/world/wiki --output runs/demo/tables

Prints one JSON summary line: records, docs, redirects, links, quarantined (and more);
`records == docs + redirects + quarantined` holds, or the run fails.
"""

from __future__ import annotations

from workflows.common import init_ray
from xh.config import XHConfig
from xh.stages import wiki
from xh.storage.store import Store


def run(cfg: XHConfig) -> dict:
    store = Store.from_config(cfg)
    wiki.check(cfg, store)  # bad input stops the stage here, before Ray starts
    init_ray(cfg)
    return wiki.run(cfg, store)
