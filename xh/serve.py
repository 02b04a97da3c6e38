"""The champion as a Ray Serve application: questions in over HTTP, answers and supporting facts out.

    app = build_app(cfg)                       # three deployments, composed with DeploymentHandles
    serve.run(app, name=APP_NAME, route_prefix="/")   # workflows.serve; a RayService imports app_builder

    POST /answer     {"id": "q1", "question": "..."} (FEVER: {"id": .., "claim": ..}), or a list of them
                     -> {"id", "question", "answer", "supporting_facts", "score", ..., "model", "version",
                         "question_type", "question_type_source"} (a list for a list; FEVER adds "label" and
                        "evidence" [[page id, line]]); a body that is not `Question`s: 422
    GET  /healthz    the version being served, its task and question types, the alias followed, the last
                     lookup and reload error
    POST /-/reload   look the alias up now and load the version it names (`xh serve reload`)
    GET  /docs       the OpenAPI page (`/openapi.json`): the ingress is a FastAPI app (`@serve.ingress`)

Three deployments, as batch scoring's two actor pools plus a door:

    ingress    parses and checks the questions (`xh.inputs.questions.question_rows`, the limits of batch scoring: a bad
               record gets its reason as the answer's `error`), pins each request to the version served when it
               came in, and follows `serve.model`'s alias: it looks the alias up every `serve.alias_check_s` (and
               on reload), and when it moved, has both halves load the new version before it switches (requests
               in flight finish on the old one)
    graphs     the graph half of the version's pipeline (`xh.pipeline.version_pipeline`, as batch scoring and
               the pyfunc build it: the version's retrieval and graph settings, path scorer, index; the config
               gives locations and resources, and a setting it changes is refused), `Pipeline.graphs`
    model      the version's XH model, `Pipeline.predict` over graphs batched across requests (`@serve.batch`,
               `serve.max_batch_size` and `serve.batch_wait_timeout_s`)

Versions are Serve's multiplexed models (`@serve.multiplexed`, id `NAME/VERSION`): each replica keeps the two
it was last asked for, so a request pinned to the previous version during a switch still finds it, and every
call names its version: a graph is never answered by a model of another version. The graph and model
deployments autoscale between `serve.*_replicas` and `serve.*_max_replicas` (`deployment_options`).
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
from typing import Any, Literal

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from ray import serve

from xh.config import ConfigError, XHConfig, load_config
from xh.inputs.questions import InputLimits, question_rows, record_id
from xh.pipeline import Pipeline, VersionPipeline, prediction_row, question_type_of, version_pipeline
from xh.registry.versions import parse_model_uri, resolve_model
from xh.storage.store import Store

APP_NAME = "xh"
KEEP_VERSIONS = 2  # the version served and the one before it (requests in flight during a switch)
log = logging.getLogger("xh.serve")


class Question(BaseModel):
    """One question (HotpotQA version) or claim (FEVER version) of `POST /answer`. A record that is no question
    (no id, an empty or too long question, a claim to a HotpotQA version) is answered with its `error`; a body
    that is not such records at all is refused with 422."""

    model_config = ConfigDict(extra="forbid")

    id: str | int | None = Field(None, description="the question's id (FEVER: the claim's), echoed in the answer")
    qid: str | int | None = Field(None, description="the id, as batch scoring's files name it")
    question: str | None = Field(None, description="a HotpotQA version's question")
    claim: str | None = Field(None, description="a FEVER version's claim")
    type: Literal["bridge", "comparison"] | None = Field(None, description="the question type, where known")


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


def served_version(cfg: XHConfig, store: Store, model: dict, folder: str) -> VersionPipeline:
    """The version's pipeline (`xh.pipeline.version_pipeline`, the constructor batch scoring and the pyfunc
    use; no drift allowed: a prediction-affecting setting the config changes is a one-line `PipelineDrift`);
    its copied models land in `folder`, which must outlive the graph half. `serve.question_classifier` is
    the classifier where the version records none (as `score.question_classifier`)."""
    if cfg.serve.question_classifier:
        score = cfg.score.model_copy(update={"question_classifier": cfg.serve.question_classifier})
        cfg = cfg.model_copy(update={"score": score})
    return version_pipeline(cfg, store, model, store.at(folder), allow_drift=False)


def graph_half(cfg: XHConfig, store: Store, model: dict, folder: str) -> Pipeline:
    """The graph half of `model`'s pipeline (`Pipeline.for_version`)."""
    return Pipeline.for_version(served_version(cfg, store, model, folder))


def answer(question: str, prediction: dict, model: dict, graph: dict | None = None) -> dict:
    """One answer as `POST /answer` returns it: the PREDICTIONS row (`prediction_row`) keyed by `id`, with
    the version that gave it and the question type its graph was built with (`question_type_source`
    "default": no classifier, taken as a bridge question); FEVER also gives the label and its evidence as
    [page id, line]."""
    row = prediction_row(question, prediction)
    out = {"id": row.pop("qid"), **row, "model": model["name"], "version": model["version"]}
    if graph is not None and graph.get("question_type_source") is not None:
        out |= question_type_of(graph)
    if "label" in prediction:
        out["label"] = prediction["label"]
        out["evidence"] = [[page, int(line)] for page, line in prediction["evidence"]]
    return out


def _model_id(model: dict) -> str:
    """A version as Serve's multiplexed model id."""
    return f"{model['name']}/{model['version']}"


def _version(model_id: str) -> dict:
    name, version = model_id.rsplit("/", 1)
    return {"name": name, "version": version, "run_id": ""}


class GraphHalf:
    """Retrieval and graph building with a version's recorded pipeline; versions multiplexed by Serve
    (`@serve.multiplexed`: the `KEEP_VERSIONS` last asked for stay loaded)."""

    def __init__(self, cfg: XHConfig):
        from xh.tracking import configure

        self.store = Store.from_config(cfg)
        configure(cfg.mlflow, self.store)
        self.cfg = cfg
        self.busy = asyncio.Lock()  # one batch of questions at a time: retrieval holds the CPU it was given

    @serve.multiplexed(max_num_models_per_replica=KEEP_VERSIONS)
    async def version(self, model_id: str) -> tuple[VersionPipeline, Pipeline]:
        # the version's copied models (the path scorer) stay on disk while the replica lives
        folder = tempfile.mkdtemp(prefix=f"xh-serve-{model_id.replace('/', '-v')}-")
        found = await asyncio.to_thread(served_version, self.cfg, self.store, _version(model_id), folder)
        return found, await asyncio.to_thread(Pipeline.for_version, found)

    async def describe(self) -> dict:
        """The version's task and what gives an untyped question its type (loading the version)."""
        found, _ = await self.version(serve.get_multiplexed_model_id())
        return {"task": found.cfg.graphs.task, "question_types": found.question_types}

    async def graphs(self, questions: list[dict]) -> tuple[list[dict], list[dict]]:
        _, pipeline = await self.version(serve.get_multiplexed_model_id())
        async with self.busy:
            return await asyncio.to_thread(pipeline.graphs, questions)


class ModelHalf:
    """A version's XH model; graphs from concurrent requests are predicted in batches (`@serve.batch`), each
    batch of one version (Serve splits batches by multiplexed model id)."""

    def __init__(self, cfg: XHConfig):
        from xh.tracking import configure

        if cfg.serve.model_threads:
            import torch

            torch.set_num_threads(cfg.serve.model_threads)
        configure(cfg.mlflow, Store.from_config(cfg))
        self.cfg = cfg
        self.predict_batch.set_max_batch_size(cfg.serve.max_batch_size)
        self.predict_batch.set_batch_wait_timeout_s(cfg.serve.batch_wait_timeout_s)

    @serve.multiplexed(max_num_models_per_replica=KEEP_VERSIONS)
    async def version(self, model_id: str) -> Pipeline:
        return await asyncio.to_thread(
            Pipeline.load, model=f"models:/{model_id}", batch_graphs=self.cfg.serve.batch_graphs
        )

    async def describe(self) -> dict:
        await self.version(serve.get_multiplexed_model_id())
        return {}

    async def predict(self, graph: dict) -> dict:
        return await self.predict_batch((serve.get_multiplexed_model_id(), graph))

    @serve.batch(max_batch_size=16, batch_wait_timeout_s=0.01)  # set from the config in __init__
    async def predict_batch(self, items: list[tuple[str, dict]]) -> list[dict]:
        out: list[dict | None] = [None] * len(items)
        by_version: dict[str, list[int]] = {}
        for i, (model_id, _) in enumerate(items):
            by_version.setdefault(model_id, []).append(i)
        for model_id, positions in by_version.items():
            pipeline = await self.version(model_id)
            predictions = await asyncio.to_thread(pipeline.predict, [items[i][1] for i in positions])
            for i, prediction in zip(positions, predictions):
                out[i] = prediction
        return out


def _now() -> str:
    return dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat()


def _cause(error: BaseException) -> str:
    """An error as one line, Ray's wrapper (`RayTaskError(...)` of a replica) unwrapped to its cause."""
    cause = getattr(error, "cause", None) or error
    text = str(cause).strip().splitlines()
    return f"{type(cause).__name__}: {text[0] if text else ''}".rstrip(": ")


app = FastAPI(
    title="Transformer-XH",
    description="Multi-hop questions (or FEVER claims) in, answers with supporting facts out, from the version "
    "`serve.model` names.",
)


@serve.ingress(app)
class Ingress:
    """The HTTP door (`/answer`, `/healthz`, `/-/reload`, OpenAPI at `/docs`); follows `serve.model`'s alias."""

    async def __init__(self, graphs, model, cfg: XHConfig):
        from xh.tracking import configure

        configure(cfg.mlflow, Store.from_config(cfg))
        self.graph_half, self.model_half, self.cfg = graphs, model, cfg
        self.alias = alias_of(cfg)
        self.limits = InputLimits(question_chars=cfg.serve.max_question_chars)
        self.current = await asyncio.to_thread(served_model, cfg)
        self.about = await self._load(self.current)
        self.checked_at, self.reload_error, self.reloads = _now(), None, 0
        self.lock = asyncio.Lock()
        if self.alias:
            self.follower = asyncio.get_running_loop().create_task(self._follow())

    async def _follow(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.serve.alias_check_s)
            await self.reload()

    async def _load(self, model: dict) -> dict:
        """Both halves load `model`; what its graph half says of it (task, question types)."""
        about, _ = await asyncio.gather(
            self.graph_half.options(multiplexed_model_id=_model_id(model)).describe.remote(),
            self.model_half.options(multiplexed_model_id=_model_id(model)).describe.remote(),
        )
        return about

    async def reload(self) -> dict:
        """Look the alias up; when it names another version, load it in both halves, then serve it."""
        async with self.lock:
            previous, found = self.current, None
            try:
                found = await asyncio.to_thread(served_model, self.cfg) if self.alias else previous
                self.checked_at = _now()
                if found["version"] != previous["version"]:
                    self.about = await self._load(found)
                    self.current, self.reloads = found, self.reloads + 1
                    log.info("now serving %s v%s (was v%s)", found["name"], found["version"], previous["version"])
                self.reload_error = None
            except Exception as e:  # the version served goes on; the error is shown by /healthz and the reload
                what = f"{found['name']} v{found['version']} did not load: " if found else ""
                self.reload_error = what + _cause(e)
                log.warning("reload failed, still serving v%s: %s", previous["version"], self.reload_error)
            return {**self.health(), "previous": previous["version"], "reloaded": self.current is not previous}

    def health(self) -> dict:
        return {
            "status": "ok",
            "model": self.current["name"],
            "version": self.current["version"],
            "task": self.about["task"],
            "question_types": self.about["question_types"],
            "alias": self.alias,
            "checked_at": self.checked_at,
            "reloads": self.reloads,
            "reload_error": self.reload_error,
        }

    async def answer(self, records: list[dict]) -> list[dict]:
        """Question records -> one answer (or `error`) each, in order, all from one version."""
        model, about = self.current, self.about
        rows, refused = question_rows(records, "request", limits=self.limits, located=True, task=about["task"])
        out: list[dict | None] = [None] * len(records)
        for row in refused:  # by the record's position in the request (1-based): ids may look like anything
            out[row["position"] - 1] = {
                "id": record_id(records[row["position"] - 1]),
                "answer": None,
                "error": row["reason"],
            }
        at, text = {r["qid"]: r["position"] - 1 for r in rows}, {r["qid"]: r["question"] for r in rows}
        questions = [{"qid": r["qid"], "question": r["question"], "type": r["type"]} for r in rows]
        graphs_half = self.graph_half.options(multiplexed_model_id=_model_id(model))
        graphs, no_graph = await graphs_half.graphs.remote(questions) if questions else ([], [])
        from xh.graph.store import qids_of_quarantine

        for row in no_graph:  # its id from the quarantine row's (possibly cut) record
            for qid in qids_of_quarantine([row]):
                out[at[qid]] = {
                    "id": qid,
                    "answer": None,
                    "error": row["reason"],
                    "question": text[qid],
                }
        model_half = self.model_half.options(multiplexed_model_id=_model_id(model))
        predictions = await asyncio.gather(*(model_half.predict.remote(g) for g in graphs))
        by_qid = {g["qid"]: g for g in graphs}
        for prediction in predictions:
            i = at[prediction["qid"]]
            out[i] = answer(text[prediction["qid"]], prediction, model, by_qid[prediction["qid"]])
        return out

    @app.post("/answer")
    async def post_answer(self, body: Question | list[Question]) -> Any:
        """A question (or claim) -> its answer; a list -> the answers, in order (one `error` where a record is
        refused or gets no graph)."""
        one = isinstance(body, Question)
        records = [q.model_dump(exclude_none=True) for q in ([body] if one else body)]
        if len(records) > self.cfg.serve.max_questions:
            return JSONResponse({"error": f"{len(records)} questions, more than serve.max_questions"}, 413)
        answers = await self.answer(records)
        if one and "error" in answers[0] and answers[0].get("question") is None:
            return JSONResponse(answers[0], 400)  # a record that is no question; one without a graph is an answer
        return answers[0] if one else answers

    @app.get("/healthz")
    def get_health(self) -> dict:
        """The version served, the alias followed, the last lookup and reload error."""
        return self.health()

    @app.post("/-/reload")
    async def post_reload(self) -> Any:
        """Look the alias up now and load the version it names (`xh serve reload`); 409 when that failed."""
        done = await self.reload()
        return JSONResponse(done, 200 if done["reload_error"] is None else 409)


def scaling(replicas: int, max_replicas: int | None, target: float) -> dict:
    """A deployment's replica options: fixed, or autoscaled from `replicas` up to `max_replicas`."""
    if max_replicas is None or max_replicas <= replicas:
        return {"num_replicas": replicas}
    config = {"min_replicas": replicas, "max_replicas": max_replicas, "target_ongoing_requests": target}
    return {"autoscaling_config": config}


def deployment_options(cfg: XHConfig, use_gpu: bool = False) -> dict[str, dict]:
    """Each deployment's options (`serve.deployment`), by name: replicas or autoscaling, resources, queue."""
    sv = cfg.serve
    return {
        "graphs": {
            **scaling(sv.graph_replicas, sv.graph_max_replicas, sv.target_ongoing_requests),
            "ray_actor_options": {"num_cpus": sv.graph_cpus},
            "max_ongoing_requests": 64,  # they wait for the replica's lock, not in the proxy
        },
        "model": {
            **scaling(sv.model_replicas, sv.model_max_replicas, sv.target_ongoing_requests),
            "ray_actor_options": {"num_cpus": sv.model_cpus, "num_gpus": 1 if use_gpu else 0},
            "max_ongoing_requests": 4 * sv.max_batch_size,  # enough waiting graphs to fill a batch
        },
        "ingress": {"ray_actor_options": {"num_cpus": 0}, "max_ongoing_requests": 256},
    }


def build_app(cfg: XHConfig, use_gpu: bool = False):
    """The application: the ingress bound to handles of the graph and model deployments."""
    options = deployment_options(cfg, use_gpu)
    graphs = serve.deployment(GraphHalf, name="graphs", **options["graphs"]).bind(cfg)
    model = serve.deployment(ModelHalf, name="model", **options["model"]).bind(cfg)
    return serve.deployment(Ingress, name="ingress", **options["ingress"]).bind(graphs, model, cfg)


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
