"""Typed configuration: one section per concern, read from YAML, overridden with dotted keys.

Every stage reads the same `XHConfig`; `STAGES` says which sections each stage uses, which is
what `xh config show STAGE` prints and what a stage logs to MLflow (flattened, dotted keys).

    cfg = load_config("configs/demo.yaml", ["synth.num_docs=500", "mlflow.experiment=dev"])
    cfg.synth.num_docs          # 500
    flatten(cfg, "synth")       # {"storage.root": "runs/demo", ..., "synth.num_docs": 500}

An unknown key or a value of the wrong type raises `ConfigError` whose message is one line
naming the key, e.g. `unknown config key 'synth.num_doc'`.
Credentials never live here: S3 keys come from the environment (see `xh.storage`).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Literal, Sequence

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError


class ConfigError(ValueError):
    """A configuration problem, explained in one line."""


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class StorageConfig(Section):
    root: str = Field("runs/demo", description="local path or s3://bucket/prefix under which every table is written")
    s3_endpoint_url: str | None = Field(None, description="S3-compatible endpoint; default from AWS_ENDPOINT_URL")
    s3_region: str | None = Field(None, description="default from AWS_REGION")


class RayConfig(Section):
    address: str | None = Field(None, description="None starts a local cluster in-process; 'auto' joins the one this job runs on")
    num_cpus: int | None = Field(None, ge=1, description="CPUs of the local cluster (None: all)")


class MlflowConfig(Section):
    tracking_uri: str = Field("sqlite:///runs/mlflow/mlflow.db", description="sqlite:///path or http://server:port")
    experiment: str = "xh"
    artifact_location: str | None = Field(
        "runs/mlflow/artifacts", description="for experiments this job creates (local path or s3://)"
    )


class SynthConfig(Section):
    num_docs: int = Field(2000, ge=20, le=1_000_000)
    seed: int = 13
    docs_per_shard: int = Field(10_000, ge=1)
    num_questions: int = Field(400, ge=0)
    comparison_fraction: float = Field(0.2, ge=0.0, le=1.0)
    num_claims: int = Field(300, ge=0)
    fever_pages: bool = True


class WikiConfig(Section):
    format: Literal["hotpot", "mediawiki", "fever"] = "hotpot"
    inputs: list[str] = Field(default_factory=list, description="files or folders (local or s3://) of one dump")
    output: str | None = Field(None, description="where the tables go; default <storage.root>/tables")
    workers: int = Field(2, ge=1, description="parallel file readers (Ray actors)")
    cpus_per_worker: float = Field(1.0, gt=0)
    rows_per_file: int = Field(250_000, ge=1000, description="upper bound on rows per Parquet file")
    partitions: int = Field(8, ge=1, description="hash partitions for resolving titles, links and anchors")


class RetrieveConfig(Section):
    questions: str | None = Field(None, description="HotpotQA question file (JSON array), local or s3://")
    tables: str | None = Field(None, description="wiki tables to retrieve from; default <storage.root>/tables")
    index: str | None = Field(None, description="BM25 index; default <storage.root>/index/bm25")
    output: str | None = Field(None, description="default <storage.root>/retrieval (questions, candidates, quarantine)")
    shards: int = Field(4, ge=1, description="BM25 index shards (by doc range)")
    index_titles: bool = Field(True, description="index 'title + paragraph' rather than the paragraph alone")
    workers: int = Field(2, ge=1, description="query actors, each holding the index, linker and link graph")
    # fractional by default: actors holding every CPU starve the Parquet read task that feeds them
    cpus_per_worker: float = Field(0.5, gt=0)
    batch_size: int = Field(256, ge=1, description="questions per actor call")
    ir_candidates: int = Field(100, ge=1, description="BM25 top-k (paper: 100)")
    ir_keep: int = Field(2, ge=0, description="BM25 candidates a graph keeps (paper: 2)")
    el_per_surface: int = Field(1, ge=1, description="entities kept per linked surface form (paper: 1)")
    el_max_ngram: int = Field(6, ge=1)
    el_min_commonness: float = Field(0.0, ge=0.0, le=1.0)
    expansion_keep: int = Field(15, ge=0, description="expanded documents kept (paper: 15)")
    expansion_max_neighbours: int = Field(2000, ge=1, description="neighbours of hub pages scored at most")


class XHConfig(Section):
    storage: StorageConfig = StorageConfig()
    ray: RayConfig = RayConfig()
    mlflow: MlflowConfig = MlflowConfig()
    synth: SynthConfig = SynthConfig()
    wiki: WikiConfig = WikiConfig()
    retrieve: RetrieveConfig = RetrieveConfig()


# Which sections each stage reads. Stages of later issues add their own sections here.
COMMON = ("storage", "ray", "mlflow")
STAGES: dict[str, tuple[str, ...]] = {
    "synth": COMMON + ("synth",),
    "wiki": COMMON + ("wiki",),
    "retrieve": COMMON + ("retrieve",),
    "demo": COMMON + ("synth", "wiki", "retrieve"),
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
    except yaml.YAMLError:
        value = raw
    return key.strip(), value


def _one_line(error: ValidationError) -> str:
    first = error.errors()[0]
    key = ".".join(str(p) for p in first["loc"])
    if first["type"] == "extra_forbidden":
        return f"unknown config key {key!r}"
    return f"config key {key!r}: {first['msg'].lower()} (got {first.get('input')!r})"


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
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {path} must hold a mapping of sections, not {type(loaded).__name__}")
        tree = loaded
    for item in overrides:
        _set_dotted(tree, *parse_override(item))
    try:
        return XHConfig.model_validate(tree)
    except ValidationError as e:
        raise ConfigError(_one_line(e)) from None


def stage_sections(stage: str) -> tuple[str, ...]:
    if stage not in STAGES:
        raise ConfigError(f"unknown stage {stage!r}; stages with a config: {', '.join(sorted(STAGES))}")
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


def from_argv(argv: Sequence[str] | None = None, *, prog: str | None = None) -> XHConfig:
    """`--config FILE --set a.b=c ...` for the `python -m workflows.<stage>` drivers."""
    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("--config", help="YAML file of config sections")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")
    args = parser.parse_args(argv)
    return load_config(args.config, args.overrides)
