"""The system's main path in one object: questions -> retrieval -> evidence graphs -> model predictions.

    retrieval, graph = settings_of(cfg)
    pipeline = Pipeline.load(index="runs/demo/index/bm25", tables="runs/demo/tables", retrieval=retrieval,
                             graph=graph, classifier="runs/demo/models/question_type", model="runs/demo/models/xh")
    graphs, quarantined = pipeline.graphs(questions)   # QUESTIONS rows -> GRAPHS rows, QUARANTINE rows
    predictions = pipeline.predict(graphs)             # one per graph (`xh.inference.predict_graphs`)
    predictions, quarantined = pipeline(questions)     # both
    row = prediction_row(question_text, predictions[0]) | provenance   # a PREDICTIONS row

Everything is loaded once, and each half only when its inputs are given, so that a process needing
one half holds only that half: batch scoring's graph actors pass `index` (the BM25 shards, entity
linker and link graph; the docs and links of each batch's candidates are read per batch), its model
actors `model`. `model` is a folder written by `XHModel.save_pretrained` (loaded on the CPU) or a
registered version `models:/NAME/VERSION` (through its MLflow pyfunc, on the GPU when there is one).

Questions without a `type` get one from `classifier` (`xh.model.qtype`, bridge or comparison) when
one is given. A question without a graph is quarantined with the reason (`source` "graphs"), and so is
a second question of the same qid in one call (`duplicate id`: it would share the first's evidence).
A registered version records what its graph half needs (`pipeline_record`, written by
`xh.registry.log_and_register`); `apply_pipeline` gives a scoring config those settings, refusing a
prediction-affecting one that the config changes (`PipelineDrift`) unless drift is allowed.
Nothing here imports Ray: the batch-scoring driver (`workflows.score`) maps batches of rows
through the two halves on actor pools; `bench/score.py` and the demo call the object directly.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from xh.config import ConfigError, GraphsConfig, RetrieveConfig, XHConfig
from xh.graph.hotpot import HotpotGraphBuilder, QuestionClassifier
from xh.retrieval.candidates import Retriever
from xh.schemas import RAW_LIMIT
from xh.storage import S3Settings

GRAPH_FAILURES = "graphs"  # the `source` of quarantine rows for questions without a graph


def settings_of(cfg: XHConfig) -> tuple[RetrieveConfig, GraphsConfig]:
    """The config's `retrieve` and `graphs` sections as new questions use them: they have no answer,
    so no graph needs a node that holds one."""
    return cfg.retrieve, cfg.graphs.model_copy(update={"require_answer": False})


# --- the pipeline a registered version records ----------------------------------------------------
# What turns a question into the graph a version was trained on. Every other setting of the `retrieve`,
# `graphs` and `score` sections is a resource (workers, CPUs, GPUs, batch sizes, threads), a location
# (tables, outputs) or a training-time choice that new questions do not meet (graphs.setting,
# require_answer, the FEVER claim splits, statistics): scoring takes those from its own config.

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
    "ir_keep",
    "el_per_surface",
    "expansion_keep",
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


def folder_digest(uri: str, s3: S3Settings | None = None) -> str:
    """A folder's content: the SHA-256 of its files' relative names and content digests (S3: ETags)."""
    import hashlib

    from xh.staging import content_digest
    from xh.storage import list_files

    files = list_files(uri, s3)
    digest = hashlib.sha256()
    for f in files:
        digest.update(f"{f[len(uri.rstrip('/')) :]}\t{content_digest(f, s3)}\n".encode())
    return "sha256:" + digest.hexdigest()


def index_reference(cfg: XHConfig, s3: S3Settings | None = None) -> dict | None:
    """The index the graph half retrieves from, as {uri, snapshot}: a BM25 index's snapshot id is the digest
    of its manifest (analyzer, corpus statistics, shards: the same for a moved copy); FEVER retrieves from
    the docs table, whose snapshot is its content digest. None when there is none yet."""
    import hashlib
    from pathlib import Path

    from xh.retrieval.index import read_manifest
    from xh.storage import is_s3, join

    if cfg.graphs.task == "fever":
        docs = join(cfg.retrieve.tables or join(cfg.storage.root, "tables"), "docs")
        try:
            return {"uri": docs, "snapshot": folder_digest(docs, s3)}
        except FileNotFoundError:
            return None
    uri = cfg.retrieve.index or join(cfg.storage.root, "index", "bm25")
    uri = uri if is_s3(uri) else str(Path(uri).resolve())  # a reference that holds from any working folder
    try:
        manifest = read_manifest(uri, s3)
    except FileNotFoundError:
        return None
    manifest.pop("docs", None)  # where the docs table was: not what the index holds
    return {
        "uri": uri,
        "snapshot": "sha256:" + hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest(),
    }


def pipeline_record(cfg: XHConfig, graph_summary: dict, s3: S3Settings | None = None) -> tuple[dict, dict]:
    """(the record, {name: folder to copy}) of the pipeline a model trained with `cfg` on graphs whose
    `_summary.json` is `graph_summary` answers with: its knobs (the graphs' own where the summary has
    them), its trained models and the index reference."""
    built = graph_summary.get("settings", {}) | {
        k: graph_summary[k] for k in ("task", "setting", "edge_mode") if k in graph_summary
    }
    graphs = {k: built.get(k, getattr(cfg.graphs, k)) for k in GRAPH_KNOBS}
    trained = cfg.model_copy(update={"graphs": cfg.graphs.model_copy(update=graphs)})
    record = {
        "format": PIPELINE_FORMAT,
        "retrieve": {k: getattr(cfg.retrieve, k) for k in RETRIEVE_KNOBS},
        "graphs": graphs,
        "models": {},
        # distractor-setting graphs came from the questions' own paragraphs: no index built them
        "index": None if built.get("setting") == "distractor" else index_reference(trained, s3),
    }
    copies = {}
    for section, key in MODELS:
        uri = getattr(getattr(cfg, section), key)
        if not uri:
            record["models"][f"{section}.{key}"] = None
            continue
        entry = {"uri": uri, "digest": folder_digest(uri, s3)}
        if (section, key) in COPIED:
            entry["copy"] = f"{section}.{key}"
            copies[entry["copy"]] = uri
        record["models"][f"{section}.{key}"] = entry
    return record, copies


def _explicit(section, key: str) -> bool:
    return key in section.model_fields_set


def apply_pipeline(
    cfg: XHConfig, record: dict, copies: str, s3: S3Settings | None = None, allow_drift: bool = False
) -> tuple[XHConfig, dict]:
    """The scoring config with the version's pipeline: its knobs and models, and its index unless the config
    names a copy with the same snapshot id. `copies`: where the version's copied models are (a folder every
    worker reads). A setting the config sets explicitly to another value is refused (`PipelineDrift`, naming
    it) unless `allow_drift`; then the config's value is used and returned in the drift
    {setting: {"version": ..., "used": ...}}."""
    from xh.storage import join

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
    for section, key in MODELS:
        part, entry = getattr(cfg, section), record["models"].get(f"{section}.{key}")
        ours = getattr(part, key)
        if entry is None:
            if section == "score":  # new questions need a type: training had the gold ones (docs/scoring.md)
                continue
            updates[section][key] = decide(f"{section}.{key}", part, key, None, ours, ours is not None)
            continue
        theirs = join(copies, entry["copy"]) if "copy" in entry else entry["uri"]
        # the same model elsewhere (a copy of the same files) is no drift; an explicit None is
        differs = _explicit(part, key) if ours is None else folder_digest(ours, s3) != entry["digest"]
        updates[section][key] = decide(f"{section}.{key}", part, key, theirs, ours, differs)
    index = record.get("index")
    if index is not None and cfg.graphs.task != "fever":
        ours = cfg.retrieve.index
        if ours is None or ours == index["uri"]:
            updates["retrieve"]["index"] = index["uri"]
        else:
            found = index_reference(cfg, s3)
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


class Pipeline:
    """Retriever and graph builder (the graph half), XH model and tokenizer (the model half)."""

    def __init__(
        self,
        retriever: Retriever | None = None,
        tables: str | None = None,
        graph: GraphsConfig | None = None,
        classifier: QuestionClassifier | None = None,
        model=None,
        tokenizer=None,
        batch_graphs: int = 8,
        s3: S3Settings | None = None,
        sort_window: int = 8,
    ) -> None:
        self.retriever, self.tables, self.graph_settings, self.classifier = retriever, tables, graph, classifier
        self.model, self.tokenizer, self.batch_graphs = model, tokenizer, batch_graphs
        self.sort_window = sort_window
        self.s3 = s3

    @classmethod
    def load(
        cls,
        *,
        index: str | None = None,
        tables: str | None = None,
        retrieval: RetrieveConfig | None = None,
        graph: GraphsConfig | None = None,
        classifier: str | None = None,
        model: str | None = None,
        batch_graphs: int = 8,
        s3: S3Settings | None = None,
        sort_window: int = 8,
    ) -> Pipeline:
        """The graph half when `index` is given (with `tables`, `retrieval`, `graph`, optional
        `classifier` folder; FEVER, `graph.task == "fever"`: `tables` alone); the model half when
        `model` is given. `sort_window`: batches of graphs sorted by length together
        (`xh.inference.predict_graphs`)."""
        retriever = question_types = weights = tokenizer = None
        if graph is not None and graph.task == "fever" and tables is not None:
            # FEVER claims: the sentence retriever over the docs (`xh.graph.fever`) is the whole graph half
            from xh.graph.fever import FeverGraphBuilder, FeverGraphSettings

            settings = FeverGraphSettings(reranker=graph.sentence_reranker, rerank_pool=graph.sentence_rerank_pool)
            retriever = FeverGraphBuilder.load(tables, settings, s3)
        elif index is not None:
            retriever = Retriever.load(index, tables, retrieval, s3)
            if classifier:
                from xh.model.qtype import QuestionTypeClassifier

                question_types = QuestionTypeClassifier.load(classifier).predict
        if model is not None:
            weights, tokenizer = _load_model(model)
        return cls(retriever, tables, graph, question_types, weights, tokenizer, batch_graphs, s3, sort_window)

    def graphs(self, questions: Sequence[dict]) -> tuple[list[dict], list[dict]]:
        """QUESTIONS rows (`qid`, `question`, `type` or None) -> (GRAPHS rows, QUARANTINE rows), in order."""
        questions, repeated = _first_of_each_id(questions)
        if self.graph_settings is not None and self.graph_settings.task == "fever":
            claims = [{"qid": q["qid"], "claim": q["question"], "label": None, "evidence": None} for q in questions]
            graphs, quarantined = self.retriever.build(claims)  # retrieval-only; a claim with no sentence: quarantined
            return graphs, quarantined + repeated
        candidates: dict[str, list[dict]] = {}
        for row in self.retriever.candidates([q["qid"] for q in questions], [q["question"] for q in questions]):
            candidates.setdefault(row["qid"], []).append(row)
        # only the documents these questions need: the docs table is far larger than a batch's share
        doc_ids = {row["doc_id"] for rows in candidates.values() for row in rows}
        builder = HotpotGraphBuilder.load(self.tables, doc_ids, self.graph_settings, self.s3, self.classifier)
        graphs, quarantined = [], repeated
        for question, outcome in zip(questions, builder.build_many(questions, candidates)):
            if outcome.graph is not None:
                graphs.append(outcome.graph)
            else:
                raw = json.dumps({"qid": question["qid"], "question": question["question"]})[:RAW_LIMIT]
                quarantined.append({"source": GRAPH_FAILURES, "position": -1, "reason": outcome.reason, "raw": raw})
        return graphs, quarantined

    def predict(self, graphs: Sequence[dict]) -> list[dict]:
        """GRAPHS rows -> one prediction each, in order: HotpotQA answer, supporting facts and node
        score, or a FEVER label, its probabilities and evidence (`xh.model.decode`)."""
        from xh.inference import predict_graphs

        return predict_graphs(
            self.model, self.tokenizer, graphs, batch_graphs=self.batch_graphs, sort_window=self.sort_window
        )

    def __call__(self, questions: Sequence[dict]) -> tuple[list[dict], list[dict]]:
        """QUESTIONS rows -> (predictions, QUARANTINE rows of the questions without a graph)."""
        graphs, quarantined = self.graphs(questions)
        return self.predict(graphs), quarantined


def _first_of_each_id(questions: Sequence[dict]) -> tuple[list[dict], list[dict]]:
    """(the first question of each qid, QUARANTINE rows of the others): retrieval's candidates are keyed
    by qid, so two questions of one id in a batch would each get both questions' evidence."""
    first, repeated, seen = [], [], set()
    for question in questions:
        if question["qid"] in seen:
            raw = json.dumps({"qid": question["qid"], "question": question["question"]})[:RAW_LIMIT]
            repeated.append({"source": GRAPH_FAILURES, "position": -1, "reason": "duplicate id", "raw": raw})
        else:
            seen.add(question["qid"])
            first.append(question)
    return first, repeated


def _load_model(model: str) -> tuple:
    """(XH model, tokenizer) from a folder, or from a registered version (`models:/NAME/VERSION` or `@ALIAS`)."""
    if model.startswith("models:/"):
        from xh.registry import load_version, resolve_model

        found = resolve_model(model)
        return load_version(found["name"], found["version"])
    from xh.inference import load_model

    return load_model(model)


def prediction_row(question: str, prediction: dict) -> dict:
    """A prediction as a PREDICTIONS row, less the provenance columns (model, run, corpus, time).
    FEVER: the label is the answer, its probability the score, the evidence the supporting facts."""
    fever = "label" in prediction
    facts = prediction["evidence"] if fever else prediction["supporting_facts"]
    return {
        "qid": prediction["qid"],
        "question": question,
        "answer": prediction["label"] if fever else prediction["answer"],
        "answer_doc_id": None if fever else prediction.get("answer_doc_id"),
        "answer_title": None if fever else prediction.get("answer_title"),
        "answer_type": None if fever else prediction.get("answer_type"),
        "supporting_facts": [{"title": t, "sent": int(s)} for t, s in facts],
        "score": float(prediction["label_probs"][prediction["label"]] if fever else prediction["node_score"]),
    }
