"""The system's main path in one object: questions -> retrieval -> evidence graphs -> model predictions.

    retrieval, graph = settings_of(cfg)
    pipeline = Pipeline.load(index="runs/demo/index/bm25", tables="runs/demo/tables", retrieval=retrieval,
                             graph=graph, classifier="runs/demo/models/question_type", model="runs/demo/models/xh")
    graphs, quarantined = pipeline.graphs(questions)   # QUESTIONS rows -> GRAPHS rows, QUARANTINE rows
    outcomes = pipeline.graphs_of(questions, candidates)  # the same from candidates already retrieved
    predictions = pipeline.predict(graphs)             # one per graph (`xh.inference.predict_graphs`)
    predictions, quarantined = pipeline(questions)     # both
    row = prediction_row(question_text, predictions[0]) | provenance   # a PREDICTIONS row

Everything is loaded once, and each half only when its inputs are given, so that a process needing
one half holds only that half: batch scoring's graph actors pass `index` (the BM25 shards, entity
linker and link graph, and the docs and links by id: `xh.graph.docstore`, a memory-mapped copy built
once per node and shared by its actors, from which a batch reads only its candidates' rows), its model
actors `model`. `model` is a folder written by `XHModel.save_pretrained` (loaded on the CPU) or a
registered version `models:/NAME/VERSION` (through its MLflow pyfunc, on the GPU when there is one).

Questions without a `type` get one from `classifier` (`xh.model.qtype`, bridge or comparison) when
one is given. A question without a graph is quarantined with the reason (`source` "graphs"), and so is
a second question of the same qid in one call (`duplicate id`: it would share the first's evidence).
A registered version records what its graph half needs (`xh.pipeline_record`).
Nothing here imports Ray: batch scoring (`xh.stages.score`) maps batches of rows
through the two halves on actor pools, the graphs stage (`xh.stages.graphs`) the retrieve stage's
candidates through `graphs_of`; `bench/score.py` and the demo call the object directly.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from xh.config import ConfigError, GraphsConfig, RetrieveConfig, XHConfig
from xh.graph.docstore import DocStore
from xh.graph.hotpot import HotpotGraphBuilder, Outcome, QuestionClassifier
from xh.retrieval.candidates import Retriever
from xh.schemas import RAW_LIMIT
from xh.storage.store import Location, Store, located

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


class Pipeline:
    """Retriever and graph builder (the graph half), XH model and tokenizer (the model half)."""

    def __init__(
        self,
        retriever: Retriever | None = None,
        tables: Location | None = None,
        graph: GraphsConfig | None = None,
        classifier: QuestionClassifier | None = None,
        model=None,
        tokenizer=None,
        batch_graphs: int = 8,
        sort_window: int = 8,
        docs: DocStore | None = None,
        retrieval: RetrieveConfig | None = None,
    ) -> None:
        self.retriever, self.tables, self.graph_settings, self.classifier = retriever, tables, graph, classifier
        self.model, self.tokenizer, self.batch_graphs = model, tokenizer, batch_graphs
        self.sort_window = sort_window
        self.docs = docs  # the docs and links by id; None: filtered from the tables per call
        # the retrieve section, whose node choice graphs keep; None: the retriever's
        self.retrieval = retrieval

    @classmethod
    def load(
        cls,
        *,
        index: str | Location | None = None,
        tables: str | Location | None = None,
        retrieval: RetrieveConfig | None = None,
        graph: GraphsConfig | None = None,
        classifier: str | None = None,
        model: str | None = None,
        batch_graphs: int = 8,
        sort_window: int = 8,
        doc_cache: str | None = None,
    ) -> Pipeline:
        """The graph half when `index` is given (with `tables`, `retrieval`, `graph`, optional
        `classifier` folder; FEVER, `graph.task == "fever"`: `tables` alone); `index` and `tables` are
        Locations, or paths and URIs read with the environment's S3 settings; the model half when
        `model` is given. `sort_window`: batches of graphs sorted by length together
        (`xh.inference.predict_graphs`). `doc_cache`: where this node keeps its copy of the docs and
        links by id (`xh.graph.docstore`; default `$XH_DOC_CACHE` or the temp folder)."""
        retriever = question_types = weights = tokenizer = docs = None
        tables = located(tables) if tables is not None else None
        if graph is not None and graph.task == "fever" and tables is not None:
            # FEVER claims: the sentence retriever over the docs (`xh.graph.fever`) is the whole graph half
            from xh.graph.fever import FeverGraphBuilder, FeverGraphSettings

            settings = FeverGraphSettings(reranker=graph.sentence_reranker, rerank_pool=graph.sentence_rerank_pool)
            retriever = FeverGraphBuilder.load(tables, settings)
        elif index is not None:
            retriever = Retriever.load(located(index), tables, retrieval)
            docs = DocStore.open(tables, doc_cache)
            if classifier:
                from xh.model.qtype import QuestionTypeClassifier

                question_types = QuestionTypeClassifier.load(classifier).predict
        if model is not None:
            from xh.inference import load_model
            from xh.registry.versions import model_folder

            weights, tokenizer = load_model(model_folder(model))
        return cls(
            retriever, tables, graph, question_types, weights, tokenizer, batch_graphs, sort_window, docs, retrieval
        )

    @classmethod
    def for_version(cls, version: VersionPipeline, *, graphs: bool = True, model: bool = False, **options) -> Pipeline:
        """A registered version's graph half (`graphs`) and model half (`model`: the version's own weights), as
        `version_pipeline` built it; `options`: `Pipeline.load`'s resources (batch_graphs, sort_window, doc_cache)."""
        halves = (version.graph_args() if graphs else {}) | ({"model": version.model_uri} if model else {})
        return cls.load(**halves, **options)

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
        graphs, quarantined = [], repeated
        for question, outcome in zip(questions, self.graphs_of(questions, candidates)):
            if outcome.graph is not None:
                graphs.append(outcome.graph)
            else:
                raw = json.dumps({"qid": question["qid"], "question": question["question"]})[:RAW_LIMIT]
                quarantined.append({"source": GRAPH_FAILURES, "position": -1, "reason": outcome.reason, "raw": raw})
        return graphs, quarantined

    def graphs_of(self, questions: Sequence[dict], candidates: dict[str, list[dict]]) -> list[Outcome]:
        """HotpotQA QUESTIONS rows (one per qid) and their CANDIDATES rows (qid -> rows) -> one `Outcome`
        each, in order: its graph, or the reason it has none."""
        retrieval = self.retrieval or self.retriever.settings
        if self.docs is not None:  # only the documents that become nodes, looked up by id
            return HotpotGraphBuilder.build_from_store(
                self.docs, list(questions), candidates, self.graph_settings, retrieval, self.classifier
            )
        # only the documents these questions name, filtered from the tables
        doc_ids = {row["doc_id"] for rows in candidates.values() for row in rows}
        builder = HotpotGraphBuilder.load(self.tables, doc_ids, self.graph_settings, retrieval, self.classifier)
        return builder.build_many(list(questions), candidates)

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


def question_type_of(graph: dict) -> dict:
    """The question type a graph was built with and where it came from: "data", "classifier", or "default"
    (no classifier: scored as a bridge question). FEVER graphs have none (both None)."""
    return {"question_type": graph.get("question_type"), "question_type_source": graph.get("question_type_source")}


# --- a registered version's pipeline ----------------------------------------------------------------


class NoPipelineRecord(ConfigError):
    """A version registered without a pipeline record answers prebuilt graphs only (one line)."""


@dataclass(frozen=True)
class VersionPipeline:
    """A registered version's pipeline, as batch scoring, `xh serve` and the pyfunc build it (`for_version`):
    the config with the version's recorded settings, models and index (`xh.pipeline_record.apply_pipeline`;
    its locations absolute, so that a cluster started in another folder reads the same files), the drift
    opted into, and the question-type classifier used (None: a question without a type is taken as a bridge
    question, and every answer's `question_type_source` says "default"). Built by `version_pipeline`;
    `Pipeline.for_version` loads its halves."""

    cfg: XHConfig
    model: dict
    drift: dict
    store: Store

    @property
    def classifier(self) -> str | None:
        return self.cfg.score.question_classifier

    @property
    def question_types(self) -> str:
        """What gives a question without a type its type, for summaries and health checks."""
        if self.classifier:
            return f"classifier {self.classifier}"
        return "none: the version records no question-type classifier and none is set; untyped questions are bridge"

    def graph_args(self) -> dict:
        """`Pipeline.load`'s arguments for the graph half."""
        retrieval, graph = settings_of(self.cfg)
        index = self.cfg.retrieve.index if graph.task != "fever" else None
        return {
            "index": self.store.at(index) if index else None,
            "tables": self.store.at(self.cfg.retrieve.tables),
            "retrieval": retrieval,
            "graph": graph,
            "classifier": self.classifier,
        }

    @property
    def model_uri(self) -> str:
        return f"models:/{self.model['name']}/{self.model['version']}"


def version_pipeline(
    cfg: XHConfig,
    store: Store,
    model: dict,
    copies: Location,
    *,
    allow_drift: bool = False,
    record_folder: str | None = None,
) -> VersionPipeline:
    """The one constructor of a registered version's pipeline. `model`: {name, version, run_id}. The record is
    read from `record_folder` (a version's data folder's `pipeline/`: the pyfunc) or downloaded from the
    registry; the models it carries are uploaded to `copies` (a folder every worker reads) unless they are
    read there. A setting the config changes is refused (`PipelineDrift`) unless `allow_drift`. A version
    without a record is refused (`NoPipelineRecord`): it names no pipeline to answer questions with."""
    import tempfile
    from pathlib import Path

    from xh.pipeline_record import PIPELINE_FILE, apply_pipeline

    label = f"{model['name']} v{model['version']}"
    with tempfile.TemporaryDirectory(prefix="xh-pipeline-") as dst:
        if record_folder is None:
            from xh.registry.register import pipeline_of

            found = pipeline_of(model["name"], model["version"], dst)
        else:
            file = Path(record_folder) / PIPELINE_FILE
            found = (json.loads(file.read_text()), record_folder) if file.is_file() else None
        if found is None:
            raise NoPipelineRecord(
                f"{label} was registered without a pipeline record: it answers prebuilt graphs only; "
                "register it again (`xh train`) to answer questions"
            )
        record, local = found
        if record_folder is None or copies.uri != record_folder:
            copies.upload(local)
    used, drift = apply_pipeline(cfg, record, copies, allow_drift=allow_drift)
    return VersionPipeline(_absolute(used, store, record), model, drift, store)


def _absolute(cfg: XHConfig, store: Store, record: dict) -> XHConfig:
    """The version's index and tables (and classifier) as absolute locations: the tables default to those the
    index was built from (FEVER: the docs table's folder the version names)."""
    from pathlib import Path

    from xh.retrieval.index import read_manifest
    from xh.storage import locations

    def absolute(uri: str | None) -> str | None:
        return uri if uri is None or "://" in uri else str(Path(uri).resolve())

    index = (cfg.retrieve.index or locations.index(cfg)) if cfg.graphs.task != "fever" else None
    tables = cfg.retrieve.tables
    if not tables and cfg.graphs.task == "fever" and record.get("index"):
        tables = record["index"]["uri"].rstrip("/").removesuffix("/docs")
    if not tables and index:
        tables = read_manifest(store.at(index)).get("docs")
    tables = tables or locations.tables(cfg)
    retrieve = {"index": absolute(index), "tables": absolute(tables)}
    score = {"question_classifier": absolute(cfg.score.question_classifier)}
    return cfg.model_copy(
        update={
            "retrieve": cfg.retrieve.model_copy(update=retrieve),
            "score": cfg.score.model_copy(update=score),
        }
    )
