"""What a registered model version records of the question -> graph path that trained it, and how
scoring takes it back.

    record, copies = pipeline_record(cfg, graph_summary)   # at registration (`xh.registry.register.log_and_register`)
    cfg, drift = apply_pipeline(cfg, record, store.at(folder), allow_drift=False)   # at scoring (`xh.stages.score`)

The record holds the prediction-affecting retrieval and graph settings, the small trained models it
copies (the path scorer), the larger ones by URI and digest, and the index by URI and snapshot id. A
scoring config keeps its resources and locations; a prediction-affecting setting it sets to another
value is refused (`PipelineDrift`) unless drift is allowed, and then returned as the drift.
Its own module so that `xh.registry` (which writes the record) and `xh.pipeline` (which loads
registered models) do not import each other.
"""

from __future__ import annotations

import json

from xh.config import NODE_CHOICE, ConfigError, XHConfig
from xh.storage import locations
from xh.storage.store import Location, Store

PIPELINE_FORMAT = "xh-pipeline/1"
PIPELINE_FILE = "pipeline.json"
RETRIEVE_KNOBS = (
    "ir_candidates",
    "ir_keep",
    "el_per_surface",
    "el_max_ngram",
    "el_min_commonness",
    "expansion_keep",
    "expansion_max_neighbours",
    "el_rerank_candidates",
    "expansion_rerank_pool",
    "path_top",
    "path_neighbours",
    "path_expansion",
)
GRAPH_KNOBS = (
    "task",
    "edge_mode",
    "comparison_full",
    "seed",
    "sentence_rerank_pool",
)
# trained models of the graph half, as (section, key): the path scorer (a few KB of JSON) is copied into the
# version; the re-rankers and the question-type classifier (a backbone each) are referenced by URI and digest
COPIED = {("retrieve", "path_scorer")}
MODELS = (
    ("retrieve", "path_scorer"),
    ("retrieve", "reranker"),
    ("retrieve", "path_reranker"),
    ("graphs", "sentence_reranker"),
    ("score", "question_classifier"),
)


class PipelineDrift(ConfigError):
    """A prediction-affecting setting of the scoring config differs from the version's (one line)."""


def folder_digest(folder: Location) -> str:
    """A folder's content: the SHA-256 of its files' relative names and content digests (S3: ETags)."""
    import hashlib

    from xh.storage.tables import content_digest

    digest = hashlib.sha256()
    for f in folder.files():
        digest.update(f"{f[len(folder.uri.rstrip('/')) :]}\t{content_digest(folder.store.at(f))}\n".encode())
    return "sha256:" + digest.hexdigest()


def index_reference(cfg: XHConfig, store: Store) -> dict | None:
    """The index the graph half retrieves from, as {uri, snapshot}: a BM25 index's snapshot id is the digest
    of its manifest (analyzer, corpus statistics, shards: the same for a moved copy); FEVER retrieves from
    the docs table, whose snapshot is its content digest. None when there is none yet."""
    import hashlib
    from pathlib import Path

    from xh.retrieval.index import read_manifest
    from xh.storage.uris import is_s3

    if cfg.graphs.task == "fever":
        docs = store.at(locations.tables(cfg, cfg.retrieve.tables), "docs")
        try:
            return {"uri": docs.uri, "snapshot": folder_digest(docs)}
        except FileNotFoundError:
            return None
    uri = locations.index(cfg)
    uri = uri if is_s3(uri) else str(Path(uri).resolve())  # a reference that holds from any working folder
    try:
        manifest = read_manifest(store.at(uri))
    except FileNotFoundError:
        return None
    manifest.pop("docs", None)  # where the docs table was: not what the index holds
    return {
        "uri": uri,
        "snapshot": "sha256:" + hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest(),
    }


def pipeline_record(cfg: XHConfig, graph_summary: dict, store: Store | None = None) -> tuple[dict, dict]:
    """(the record, {name: folder to copy}) of the pipeline a model trained with `cfg` on graphs whose
    `_summary.json` is `graph_summary` answers with: its knobs (the graphs' own where the summary has
    them: its graph settings and the node choice, `xh.stages.graphs.built_with`), its trained models and
    the index reference. `store`: default, the config's."""
    store = store or Store.from_config(cfg)
    built = graph_summary.get("settings", {}) | {
        k: graph_summary[k] for k in ("task", "setting", "edge_mode") if k in graph_summary
    }
    graphs = {k: built.get(k, getattr(cfg.graphs, k)) for k in GRAPH_KNOBS}
    nodes = built.get("retrieve", {})  # the node choice of retrieval-setting graphs
    trained = cfg.model_copy(update={"graphs": cfg.graphs.model_copy(update=graphs)})
    record = {
        "format": PIPELINE_FORMAT,
        "retrieve": {k: nodes.get(k, getattr(cfg.retrieve, k)) for k in RETRIEVE_KNOBS},
        "graphs": graphs,
        "models": {},
        # distractor-setting graphs came from the questions' own paragraphs: no index built them
        "index": None if built.get("setting") == "distractor" else index_reference(trained, store),
    }
    copies = {}
    for section, key in MODELS:
        uri = getattr(getattr(cfg, section), key)
        if not uri:
            record["models"][f"{section}.{key}"] = None
            continue
        entry = {"uri": uri, "digest": folder_digest(store.at(uri))}
        if (section, key) in COPIED:
            entry["copy"] = f"{section}.{key}"
            copies[entry["copy"]] = uri
        record["models"][f"{section}.{key}"] = entry
    return record, copies


def _explicit(section, key: str) -> bool:
    return key in section.model_fields_set


def apply_pipeline(cfg: XHConfig, record: dict, copies: Location, allow_drift: bool = False) -> tuple[XHConfig, dict]:
    """The scoring config with the version's pipeline: its knobs and models, and its index unless the config
    names a copy with the same snapshot id. `copies`: where the version's copied models are (a folder every
    worker reads; its store reaches the config's models and index too). A setting the config sets explicitly to another value is refused (`PipelineDrift`, naming
    it) unless `allow_drift`; then the config's value is used and returned in the drift
    {setting: {"version": ..., "used": ...}}."""
    store = copies.store
    drift: dict[str, dict] = {}

    def decide(name: str, section, key: str, theirs, ours, differs: bool, what: str = ""):
        if not _explicit(section, key) or not differs:
            return theirs
        if not allow_drift:
            raise PipelineDrift(
                f"{name}={ours!r} differs from the model version's {theirs!r}{what}: the version is scored with the "
                "pipeline it was trained with (leave the setting out, or set score.allow_drift=true)"
            )
        drift[name] = {"version": theirs, "used": ours}
        return ours

    updates: dict[str, dict] = {"retrieve": {}, "graphs": {}, "score": {}}
    for section, knobs in (("retrieve", RETRIEVE_KNOBS), ("graphs", GRAPH_KNOBS)):
        part = getattr(cfg, section)
        for key in knobs:
            theirs, ours = record[section][key], getattr(part, key)
            updates[section][key] = decide(f"{section}.{key}", part, key, theirs, ours, theirs != ours)
    for key in NODE_CHOICE:
        # A version recorded before the retrieve section alone held the node choice has it in its graphs
        # too: the same value is the same pipeline; another one (graphs keeping other documents than
        # retrieval proposed with) has no single setting now, and scores with the retrieve value as drift.
        theirs, used = record["graphs"].get(key, record["retrieve"][key]), updates["retrieve"][key]
        if theirs != record["retrieve"][key]:
            if not allow_drift:
                raise PipelineDrift(
                    f"graphs.{key}={theirs!r} of the model version differs from its retrieve.{key}="
                    f"{record['retrieve'][key]!r}, and retrieve.{key} alone chooses graph nodes now: set "
                    "score.allow_drift=true to score it with retrieve's"
                )
            drift[f"graphs.{key}"] = {"version": theirs, "used": used}
    for section, key in MODELS:
        part, entry = getattr(cfg, section), record["models"].get(f"{section}.{key}")
        ours = getattr(part, key)
        if entry is None:
            if section == "score":  # new questions need a type: training had the gold ones (docs/scoring.md)
                continue
            updates[section][key] = decide(f"{section}.{key}", part, key, None, ours, ours is not None)
            continue
        theirs = copies.join(entry["copy"]).uri if "copy" in entry else entry["uri"]
        # the same model elsewhere (a copy of the same files) is no drift; an explicit None is
        differs = _explicit(part, key) if ours is None else folder_digest(store.at(ours)) != entry["digest"]
        updates[section][key] = decide(f"{section}.{key}", part, key, theirs, ours, differs)
    index = record.get("index")
    if index is not None and cfg.graphs.task != "fever":
        ours = cfg.retrieve.index
        if ours is None or ours == index["uri"]:
            updates["retrieve"]["index"] = index["uri"]
        else:
            found = index_reference(cfg, store)
            snapshot = found and found["snapshot"]
            # a moved copy of the same snapshot is where the index lives now
            updates["retrieve"]["index"] = (
                ours
                if snapshot == index["snapshot"]
                else decide(
                    "retrieve.index",
                    cfg.retrieve,
                    "index",
                    index["uri"],
                    ours,
                    snapshot != index["snapshot"],
                    f" (snapshot {snapshot or 'none'}, not {index['snapshot']})",
                )
            )
    cfg = cfg.model_copy(
        update={name: getattr(cfg, name).model_copy(update=values) for name, values in updates.items() if values}
    )
    return cfg, drift
