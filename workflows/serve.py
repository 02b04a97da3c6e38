"""`xh serve`: the champion as a Ray Serve application on Serve's HTTP proxy (`xh.stages.serve`, `xh.serve`).

    xh serve --set serve.model=models:/xh-hotpot@champion --set serve.port=8000
    curl -s localhost:8000/answer -d '{"id": "q1", "question": "Which magazine was started first?"}'
    xh serve reload                      # look the alias up now (it is looked up every serve.alias_check_s)

The served version is checked before Ray starts; the app serves until interrupted (or SIGTERM) or for
`serve.duration_s`, then is taken down.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Iterator

from workflows.common import init_ray, verbose
from xh.config import XHConfig
from xh.stages import serve
from xh.storage.store import Store
from xh.tracking import absolute_tracking


@contextlib.contextmanager
def serving(cfg: XHConfig) -> Iterator[dict]:
    """The application deployed and answering; yields {url, model (the version served at start)}."""
    store, cfg = Store.from_config(cfg), absolute_tracking(cfg)  # absolute: the replicas read the tracking store
    model = serve.check(cfg, store)  # every refusal, before Ray starts
    init_ray(cfg)
    with serve.deployed(cfg, model, verbose()) as served:
        yield served


def run(cfg: XHConfig) -> dict:
    stop = threading.Event()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
    started = time.monotonic()  # the summary's seconds count the start-up too
    with serving(cfg) as served:
        return serve.until_stopped(cfg, served, stop, since=started)
