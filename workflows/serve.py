"""`xh serve`: the champion as a Ray Serve application on Serve's HTTP proxy (`xh.serve`).

    xh serve --set serve.model=models:/xh-hotpot@champion --set serve.port=8000
    curl -s localhost:8000/answer -d '{"id": "q1", "question": "Which magazine was started first?"}'
    xh serve reload                      # look the alias up now (it is looked up every serve.alias_check_s)

The served version is checked before Ray starts: its recorded pipeline against this config (a setting it
changes is refused in one line, as in batch scoring) and, for HotpotQA, the BM25 index. The app serves
until interrupted or for `serve.duration_s`, then is taken down; on Kubernetes the RayService
(infra/k8s/rayservice-serve.yaml) keeps it up instead.
"""

from __future__ import annotations

import contextlib
import signal
import tempfile
import threading
import time
from collections.abc import Iterator

from workflows.common import init_ray, log, main, s3_settings, verbose
from xh.config import XHConfig
from xh.tracking import absolute_tracking, configure


@contextlib.contextmanager
def serving(cfg: XHConfig) -> Iterator[dict]:
    """The application deployed and answering; yields {url, model (the version served at start)}."""
    from ray import serve

    from xh.retrieval.index import read_manifest
    from xh.serve import APP_NAME, alias_of, app_for, base_url, index_of, served_model, version_config, wait_healthy
    from xh.storage import Store

    alias_of(cfg)  # a malformed URI before MLflow is touched
    cfg = absolute_tracking(cfg)
    configure(cfg.mlflow, s3_settings(cfg))
    model = served_model(cfg)
    with tempfile.TemporaryDirectory(prefix="xh-serve-check-") as folder:
        used = version_config(cfg, model, folder)  # a drift: one line here, not a failed replica later
    if used.graphs.task != "fever":
        read_manifest(Store.from_config(cfg).at(index_of(used)))
    init_ray(cfg)
    # a line per request and replica event on the console only with -v (they stay in Ray's log files)
    logging_config = {"log_level": "DEBUG" if verbose() else "WARNING", "enable_access_log": verbose()}
    serve.start(http_options={"host": cfg.serve.host, "port": cfg.serve.port}, logging_config=logging_config)
    try:
        serve.run(app_for(cfg), name=APP_NAME, route_prefix="/", logging_config=logging_config)
        url = base_url(cfg)
        health = wait_healthy(url)
        log("serve", f"serving {health['model']} v{health['version']} at {url} (POST /answer)")
        yield {"url": url, "model": model}
    finally:
        serve.shutdown()


def run(cfg: XHConfig) -> dict:
    from xh.serve import call

    stop = threading.Event()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
    start = time.monotonic()
    with serving(cfg) as served:
        try:
            stop.wait(cfg.serve.duration_s)
        except KeyboardInterrupt:
            pass
        _, health = call(f"{served['url']}/healthz")
    return {
        "url": served["url"],
        "model": served["model"],
        "served_version": health["version"],
        "reloads": health["reloads"],
        "seconds": round(time.monotonic() - start, 1),
    }


if __name__ == "__main__":
    main("serve", run)
