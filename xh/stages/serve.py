"""`xh serve`: the champion as a Ray Serve application (`xh.serve`), checked, deployed and taken down.

    model = check(cfg, store)                  # before Ray starts: the URI, the version, its pipeline, its index
    with deployed(cfg, model) as served:       # on the connected Ray cluster, until the block ends
        summary = until_stopped(cfg, served, stop)

The served version is checked before Ray starts: its recorded pipeline against this config (a setting it
changes is refused in one line, as in batch scoring) and, for HotpotQA, the BM25 index. The app serves
until `stop` is set or for `serve.duration_s`, then is taken down; on Kubernetes the RayService
(infra/k8s/rayservice-serve.yaml) keeps it up instead.
"""

from __future__ import annotations

import contextlib
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from xh.config import XHConfig
from xh.storage import locations
from xh.storage.store import Store


def check(cfg: XHConfig, store: Store) -> dict:
    """The version `serve.model` names now ({name, version, run_id}), checked as its replicas will load it: a
    malformed URI before MLflow is touched, a version without a pipeline record, a drift of its recorded
    pipeline, a missing or unreadable index (`xh.serve.served_version`, which also makes its locations
    absolute: replicas of a cluster started in another folder read the same files)."""
    from xh.retrieval.index import read_manifest
    from xh.serve import alias_of, served_model, served_version
    from xh.tracking import configure

    alias_of(cfg)
    configure(cfg.mlflow, store, registry="serve.model")
    model = served_model(cfg)
    with tempfile.TemporaryDirectory(prefix="xh-serve-check-") as folder:
        used = served_version(cfg, store, model, folder).cfg  # a drift: one line here, not a failed replica later
    if used.graphs.task != "fever":
        read_manifest(store.at(locations.index(used)))
    return model


def absolute_places(cfg: XHConfig) -> XHConfig:
    """The config with its local storage root, index, tables and classifier as absolute paths: the replicas
    build the version's pipeline in their own working folder, which on a cluster started elsewhere is not
    this one."""

    def absolute(uri: str | None) -> str | None:
        return uri if not uri or "://" in uri else str(Path(uri).resolve())

    retrieve = {k: absolute(getattr(cfg.retrieve, k)) for k in ("index", "tables")}
    return cfg.model_copy(
        update={
            "storage": cfg.storage.model_copy(update={"root": absolute(cfg.storage.root)}),
            "retrieve": cfg.retrieve.model_copy(update=retrieve),
            "serve": cfg.serve.model_copy(update={"question_classifier": absolute(cfg.serve.question_classifier)}),
            "score": cfg.score.model_copy(update={"question_classifier": absolute(cfg.score.question_classifier)}),
        }
    )


@contextlib.contextmanager
def deployed(cfg: XHConfig, model: dict, verbose: bool = False) -> Iterator[dict]:
    """The application deployed on the connected cluster and answering; yields {url, model (the version
    served at start)}. `verbose`: a line per request and replica event on the console (else in Ray's logs)."""
    from ray import serve

    from xh.serve import APP_NAME, app_for, base_url, log, wait_healthy

    cfg = absolute_places(cfg)
    logging_config = {"log_level": "DEBUG" if verbose else "WARNING", "enable_access_log": verbose}
    serve.start(http_options={"host": cfg.serve.host, "port": cfg.serve.port}, logging_config=logging_config)
    try:
        serve.run(app_for(cfg), name=APP_NAME, route_prefix="/", logging_config=logging_config)
        url = base_url(cfg)
        health = wait_healthy(url)
        log.info("serving %s v%s at %s (POST /answer)", health["model"], health["version"], url)
        yield {"url": url, "model": model}
    finally:
        serve.shutdown()


def until_stopped(cfg: XHConfig, served: dict, stop: threading.Event, since: float | None = None) -> dict:
    """Serve until `stop` is set, `serve.duration_s` passes or the user interrupts; the summary: the URL, the
    version served at start and at the end, how often the app switched versions and the seconds since `since`
    (a `time.monotonic()`; default: now)."""
    from xh.serve import call

    start = time.monotonic() if since is None else since
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
