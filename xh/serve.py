"""The champion as a Ray Serve application: questions in over HTTP, answers and supporting facts out.

    app = build_app(cfg)                       # three deployments, composed with DeploymentHandles
    serve.run(app, name=APP_NAME, route_prefix="/")   # workflows.serve; a RayService imports app_builder

    POST /answer     {"id": "q1", "question": "..."} (FEVER: {"id": .., "claim": ..}), or a list of them
                     -> {"id", "question", "answer", "supporting_facts", "score", ..., "model", "version"}
                        (a list for a list; FEVER adds "label" and "evidence" [[page id, line]])
    GET  /healthz    the version being served, the alias followed, the last lookup and reload error
    POST /-/reload   look the alias up now and load the version it names (`xh serve reload`)

Three deployments, as batch scoring's two actor pools plus a door:

    ingress    parses and checks the questions (`xh.questions.question_rows`: a bad record gets its reason
               as the answer's `error`), pins each request to the version served when it came in, and follows
               `serve.model`'s alias: it looks the alias up every `serve.alias_check_s` (and on reload), and
               when it moved, has both halves load the new version before it switches (requests in flight
               finish on the old one)
    graphs     the graph half of the version's recorded pipeline (`xh.pipeline_record`: its retrieval and
               graph settings, path scorer, index; the config gives locations and resources, and a setting it
               changes is refused as in batch scoring), `xh.pipeline.Pipeline.graphs`
    model      the version's XH model, `Pipeline.predict` over graphs batched across requests (`@serve.batch`,
               `serve.max_batch_size` and `serve.batch_wait_timeout_s`)

Each half keeps the two versions it was last asked for, so a request pinned to the previous version
during a switch still finds it. Every call names its version: a graph is never answered by a model of
another version.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
import tempfile
import time
import urllib.error
import urllib.request
from collections import OrderedDict
from typing import Any

from ray import serve

from xh import locations
from xh.config import ConfigError, XHConfig, load_config
from xh.pipeline import Pipeline, prediction_row, settings_of
from xh.pipeline_record import apply_pipeline
from xh.questions import InputLimits, question_rows, record_id
from xh.registry import parse_model_uri, pipeline_of, resolve_model
from xh.store import Store

APP_NAME = "xh"
KEEP_VERSIONS = 2  # the version served and the one before it (requests in flight during a switch)
log = logging.getLogger("xh.serve")


def alias_of(cfg: XHConfig) -> str | None:
    """The alias `serve.model` follows (None: a pinned version); a malformed URI is a one-line `ConfigError`."""
    try:
        return parse_model_uri(cfg.serve.model)[1]
    except ConfigError as e:  # the registry's messages name scoring's setting
        raise ConfigError(str(e).replace("score.model", "serve.model", 1)) from None


def served_model(cfg: XHConfig) -> dict:
    """`serve.model` resolved to one version ({name, version, run_id}); an unknown model or alias is a
    one-line `ConfigError` naming `serve.model`."""
    alias_of(cfg)
    try:
        return resolve_model(cfg.serve.model)
    except ConfigError as e:
        raise ConfigError(str(e).replace("score.model", "serve.model", 1)) from None


def version_config(cfg: XHConfig, store: Store, model: dict, folder: str) -> XHConfig:
    """The config with the version's recorded pipeline (`xh.pipeline_record.apply_pipeline`, no drift allowed:
    a prediction-affecting setting the config changes is a one-line `PipelineDrift`); its copied models land in
    `folder`, which must outlive the graph half. A version without a record: the config's own settings."""
    if cfg.serve.question_classifier:  # as `score.question_classifier`, which the record may name
        score = cfg.score.model_copy(update={"question_classifier": cfg.serve.question_classifier})
        cfg = cfg.model_copy(update={"score": score})
    found = pipeline_of(model["name"], model["version"], folder)
    if found is None:
        log.warning(
            "%s v%s has no pipeline record: served with this config's settings", model["name"], model["version"]
        )
        return cfg
    record, local = found
    return apply_pipeline(cfg, record, store.at(local), allow_drift=False)[0]


def graph_half(cfg: XHConfig, store: Store, model: dict, folder: str) -> Pipeline:
    """The graph half of `model`'s pipeline (`Pipeline.load` with the version's settings)."""
    used = version_config(cfg, store, model, folder)
    retrieval, graph = settings_of(used)
    return Pipeline.load(
        index=store.at(locations.index(used)),
        tables=store.at(locations.tables(used, used.retrieve.tables)),
        retrieval=retrieval,
        graph=graph,
        classifier=used.score.question_classifier,
    )


def answer(question: str, prediction: dict, model: dict) -> dict:
    """One answer as `POST /answer` returns it: the PREDICTIONS row (`prediction_row`) keyed by `id`, with
    the version that gave it; FEVER also gives the label and its evidence as [page id, line]."""
    row = prediction_row(question, prediction)
    out = {"id": row.pop("qid"), **row, "model": model["name"], "version": model["version"]}
    if "label" in prediction:
        out["label"] = prediction["label"]
        out["evidence"] = [[page, int(line)] for page, line in prediction["evidence"]]
    return out


class _Versions:
    """A replica's loaded halves by version, the `KEEP_VERSIONS` last asked for; each loaded once."""

    def __init__(self, load):
        self.load, self.loaded, self.lock = load, OrderedDict(), asyncio.Lock()

    async def get(self, model: dict):
        key = (model["name"], model["version"])
        if key in self.loaded:  # requests for a loaded version never wait for another one loading
            self.loaded.move_to_end(key)
            return self.loaded[key]
        async with self.lock:
            if key not in self.loaded:
                self.loaded[key] = await asyncio.to_thread(self.load, model)
                while len(self.loaded) > KEEP_VERSIONS:
                    self.loaded.popitem(last=False)
            self.loaded.move_to_end(key)
            return self.loaded[key]


class GraphHalf:
    """Retrieval and graph building with a version's recorded pipeline."""

    def __init__(self, cfg: XHConfig):
        from xh.tracking import configure

        self.store = Store.from_config(cfg)
        configure(cfg.mlflow, self.store)
        self.cfg, self.folders = cfg, {}
        self.versions = _Versions(self._load)
        self.busy = asyncio.Lock()  # one batch of questions at a time: retrieval holds the CPU it was given

    def _load(self, model: dict) -> Pipeline:
        # the version's copied models (the path scorer) stay on disk while the replica lives
        folder = self.folders.setdefault(model["version"], tempfile.mkdtemp(prefix=f"xh-serve-v{model['version']}-"))
        return graph_half(self.cfg, self.store, model, folder)

    async def load(self, model: dict) -> str:
        await self.versions.get(model)
        return model["version"]

    async def graphs(self, model: dict, questions: list[dict]) -> tuple[list[dict], list[dict]]:
        pipeline = await self.versions.get(model)
        async with self.busy:
            return await asyncio.to_thread(pipeline.graphs, questions)


class ModelHalf:
    """A version's XH model; graphs from concurrent requests are predicted in batches (`@serve.batch`)."""

    def __init__(self, cfg: XHConfig):
        from xh.tracking import configure

        if cfg.serve.model_threads:
            import torch

            torch.set_num_threads(cfg.serve.model_threads)
        configure(cfg.mlflow, Store.from_config(cfg))
        self.cfg = cfg
        self.versions = _Versions(self._load)
        self.predict_batch.set_max_batch_size(cfg.serve.max_batch_size)
        self.predict_batch.set_batch_wait_timeout_s(cfg.serve.batch_wait_timeout_s)

    def _load(self, model: dict) -> Pipeline:
        return Pipeline.load(
            model=f"models:/{model['name']}/{model['version']}", batch_graphs=self.cfg.serve.batch_graphs
        )

    async def load(self, model: dict) -> str:
        await self.versions.get(model)
        return model["version"]

    async def predict(self, model: dict, graph: dict) -> dict:
        return await self.predict_batch((model, graph))

    @serve.batch(max_batch_size=16, batch_wait_timeout_s=0.01)  # set from the config in __init__
    async def predict_batch(self, items: list[tuple[dict, dict]]) -> list[dict]:
        out: list[dict | None] = [None] * len(items)
        by_version: dict[str, list[int]] = {}
        for i, (model, _) in enumerate(items):
            by_version.setdefault(model["version"], []).append(i)
        for positions in by_version.values():
            pipeline = await self.versions.get(items[positions[0]][0])
            predictions = await asyncio.to_thread(pipeline.predict, [items[i][1] for i in positions])
            for i, prediction in zip(positions, predictions):
                out[i] = prediction
        return out


def _json(body: Any, status: int = 200):
    from starlette.responses import JSONResponse

    return JSONResponse(body, status_code=status)


def _now() -> str:
    return dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat()


class Ingress:
    """The HTTP door (`/answer`, `/healthz`, `/-/reload`); follows `serve.model`'s alias."""

    async def __init__(self, graphs, model, cfg: XHConfig):
        from xh.tracking import configure

        configure(cfg.mlflow, Store.from_config(cfg))
        self.graph_half, self.model_half, self.cfg = graphs, model, cfg
        self.alias = alias_of(cfg)
        self.limits = InputLimits(question_chars=cfg.serve.max_question_chars)
        self.current = await asyncio.to_thread(served_model, cfg)
        self.checked_at, self.reload_error, self.reloads = _now(), None, 0
        self.lock = asyncio.Lock()
        if self.alias:
            self.follower = asyncio.get_running_loop().create_task(self._follow())

    async def _follow(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.serve.alias_check_s)
            await self.reload()

    async def reload(self) -> dict:
        """Look the alias up; when it names another version, load it in both halves, then serve it."""
        async with self.lock:
            previous = self.current
            try:
                found = await asyncio.to_thread(served_model, self.cfg) if self.alias else previous
                self.checked_at = _now()
                if found["version"] != previous["version"]:
                    await asyncio.gather(self.graph_half.load.remote(found), self.model_half.load.remote(found))
                    self.current, self.reloads = found, self.reloads + 1
                    log.info("now serving %s v%s (was v%s)", found["name"], found["version"], previous["version"])
                self.reload_error = None
            except Exception as e:  # the version served goes on; the error is shown by /healthz and the reload
                self.reload_error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                log.warning("reload failed, still serving v%s: %s", previous["version"], self.reload_error)
            return {**self.health(), "previous": previous["version"], "reloaded": self.current is not previous}

    def health(self) -> dict:
        return {
            "status": "ok",
            "model": self.current["name"],
            "version": self.current["version"],
            "alias": self.alias,
            "checked_at": self.checked_at,
            "reloads": self.reloads,
            "reload_error": self.reload_error,
        }

    async def answer(self, records: list) -> list[dict]:
        """Question records -> one answer (or `error`) each, in order, all from one version."""
        model = self.current
        rows, refused = question_rows(records, "request", limits=self.limits)
        results: dict[str, dict] = {}
        for row in refused:  # the record's position in the request (1-based)
            record = records[row["position"] - 1]
            qid = record_id(record) if isinstance(record, dict) else None
            results[f"#{row['position']}"] = {"id": qid, "answer": None, "error": row["reason"]}
        questions = [{"qid": r["qid"], "question": r["question"], "type": r["type"]} for r in rows]
        graphs, no_graph = await self.graph_half.graphs.remote(model, questions) if questions else ([], [])
        for row in no_graph:
            qid = json.loads(row["raw"])["qid"]
            results[qid] = {"id": qid, "answer": None, "error": row["reason"]}
        predictions = await asyncio.gather(*(self.model_half.predict.remote(model, g) for g in graphs))
        text = {r["qid"]: r["question"] for r in rows}
        for prediction in predictions:
            results[prediction["qid"]] = answer(text[prediction["qid"]], prediction, model)
        out = []
        for position, record in enumerate(records, start=1):
            found = results.get(f"#{position}")
            if found is None:
                qid = str(record_id(record))
                found = results[qid] | {"question": text[qid]}
            out.append(found)
        return out

    async def __call__(self, request) -> Any:
        path, method = request.url.path.rstrip("/") or "/", request.method
        if path == "/healthz" and method == "GET":
            return _json(self.health())
        if path == "/-/reload" and method == "POST":
            done = await self.reload()
            return _json(done, 200 if done["reload_error"] is None else 409)
        if path != "/answer":
            return _json({"error": f"no route {path}: POST /answer, GET /healthz, POST /-/reload"}, 404)
        if method != "POST":
            return _json({"error": "POST a question as JSON to /answer"}, 405)
        try:
            body = json.loads(await request.body())
        except (ValueError, UnicodeDecodeError) as e:
            return _json({"error": f"the body is not JSON: {e}"}, 400)
        one = isinstance(body, dict)
        if not one and not isinstance(body, list):
            return _json({"error": "the body must be a question object or a list of them"}, 400)
        records = [body] if one else body
        if len(records) > self.cfg.serve.max_questions:
            return _json({"error": f"{len(records)} questions, more than serve.max_questions"}, 413)
        answers = await self.answer(records)
        if one and "error" in answers[0] and answers[0].get("question") is None:
            return _json(answers[0], 400)  # a record that is no question; one without a graph is an answer
        return _json(answers[0] if one else answers)


def build_app(cfg: XHConfig, use_gpu: bool = False):
    """The application: the ingress bound to handles of the graph and model deployments."""
    sv = cfg.serve
    graphs = serve.deployment(
        GraphHalf,
        name="graphs",
        num_replicas=sv.graph_replicas,
        ray_actor_options={"num_cpus": sv.graph_cpus},
        max_ongoing_requests=64,  # they wait for the replica's lock, not in the proxy
    ).bind(cfg)
    model = serve.deployment(
        ModelHalf,
        name="model",
        num_replicas=sv.model_replicas,
        ray_actor_options={"num_cpus": sv.model_cpus, "num_gpus": 1 if use_gpu else 0},
        max_ongoing_requests=4 * sv.max_batch_size,  # enough waiting graphs to fill a batch
    ).bind(cfg)
    return serve.deployment(Ingress, name="ingress", ray_actor_options={"num_cpus": 0}, max_ongoing_requests=256).bind(
        graphs, model, cfg
    )


def app_builder(args: dict):
    """`import_path: xh.serve:app_builder` (a RayService's serveConfigV2): `args` gives `config` (a YAML file)
    and `set` (overrides), as `xh serve --config --set`."""
    from xh.tracking import absolute_tracking

    return app_for(absolute_tracking(load_config(args.get("config"), list(args.get("set") or []))))


def app_for(cfg: XHConfig):
    """`build_app` with a GPU per model replica where `serve.use_gpu` says so (None: the cluster has GPUs)."""
    import ray

    use_gpu = cfg.serve.use_gpu if cfg.serve.use_gpu is not None else ray.cluster_resources().get("GPU", 0) > 0
    return build_app(cfg, use_gpu)


# --- the HTTP client side: `xh serve reload`, the demo, the benchmark ---------------------------------


class ServeUnreachable(ConfigError):
    """No Serve application answers at the URL (one line)."""


def call(url: str, payload: Any = None, timeout_s: float = 120.0) -> tuple[int, Any]:
    """(HTTP status, JSON body) of a GET (`payload` None) or a POST of `payload` as JSON."""
    data = None if payload is None else json.dumps(payload).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        body = e.read()
        try:
            return e.code, json.loads(body)
        except ValueError:
            return e.code, {"error": body.decode(errors="replace")[:200]}
    except (urllib.error.URLError, ConnectionError, TimeoutError) as e:
        raise ServeUnreachable(f"no xh Serve application at {url}: {getattr(e, 'reason', e)}") from None


def free_port() -> int:
    """A loopback port free now (for an app started on this machine: the demo, tests, the benchmark)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def base_url(cfg: XHConfig) -> str:
    host = "127.0.0.1" if cfg.serve.host in ("0.0.0.0", "::") else cfg.serve.host
    return f"http://{host}:{cfg.serve.port}"


def wait_healthy(url: str, timeout_s: float = 120.0) -> dict:
    """`GET /healthz` until the application answers it."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            status, body = call(f"{url}/healthz", timeout_s=10)
            if status == 200:
                return body
        except ServeUnreachable:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{url}/healthz did not answer within {timeout_s:.0f}s")
        time.sleep(0.5)
