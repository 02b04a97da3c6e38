"""The whole pipeline end to end on the embedded default: `make demo`.

    python -m workflows.demo --config configs/demo.yaml

Local Ray started in-process, SQLite MLflow under `runs/mlflow/`, files under `runs/demo/`,
generated data. Stages run in order, each reading what the previous one wrote:

    synth         generate the mini-Wikipedia world (shards in parallel on Ray)
    process_wiki  its HotpotQA-format dump -> docs / links / redirects / anchors / quarantine (Ray Data)
    check         the tables against the generator's ground truth (every page and every hyperlink)
    retrieve      BM25 index, candidates for the world's questions (BM25, entity links, expansion), recall

One MLflow run records the config (flattened), each stage's counts and seconds, and the summary.
"""

from __future__ import annotations

import bz2
import json
import time

import pyarrow.dataset as pads

from workflows import process_wiki, retrieve, synth
from workflows.common import init_ray, main, s3_settings
from xh.config import XHConfig
from xh.storage import join, open_input, resolve
from xh.tracking import stage_run


def check_against_truth(cfg: XHConfig, world: dict, tables: dict) -> dict:
    """Every generated page is a doc and every true hyperlink is a resolved row of `links`."""
    s3 = s3_settings(cfg)
    summary_uri = join(synth.world_uri(cfg), "truth", "summary.json")
    with open_input(summary_uri, s3) as f:
        truth = json.loads(f.read())
    true_links = set()
    for relative in truth["paths"]["links"]:
        with open_input(join(synth.world_uri(cfg), relative), s3) as f:
            for line in bz2.decompress(f.read()).splitlines():
                row = json.loads(line)
                true_links.add((row["source"], row["target"], row["anchor"], row["sentence"]))
    fs, root = resolve(tables["output"], s3)
    docs = pads.dataset(f"{root}/docs", filesystem=fs).to_table(columns=["doc_id", "title"])
    title_of = dict(zip(docs["doc_id"].to_pylist(), docs["title"].to_pylist()))
    links = pads.dataset(f"{root}/links", filesystem=fs).to_table()
    found = {
        (title_of[s], title_of.get(t), a, n)
        for s, t, a, n in zip(*(links[c].to_pylist() for c in ("src_doc_id", "target_doc_id", "anchor", "sentence")))
    }
    problems = {
        "docs_missing": truth["num_docs"] - len(title_of),
        "links_missing": len(true_links - found),
        "links_unexpected": len(found - true_links),
    }
    if any(problems.values()):
        raise RuntimeError(f"the tables disagree with the generator's ground truth: {problems}")
    return {"true_links": len(true_links), **problems}


def run(cfg: XHConfig) -> dict:
    init_ray(cfg)
    stages: dict[str, dict] = {}
    with stage_run(cfg, "demo") as run_info:
        import mlflow

        for name, step in (
            ("synth", lambda: synth.run(cfg)),
            ("process_wiki", lambda: process_wiki.run(_wiki_config(cfg))),
        ):
            start = time.perf_counter()
            stages[name] = step()
            mlflow.log_metric(f"{name}.seconds", time.perf_counter() - start)
        stages["check"] = check_against_truth(cfg, stages["synth"], stages["process_wiki"])
        start = time.perf_counter()
        stages["retrieve"] = retrieve.run(_retrieve_config(cfg))
        mlflow.log_metric("retrieve.seconds", time.perf_counter() - start)
        mlflow.log_metrics(flatten_numbers(stages))
        mlflow.log_dict(stages, "summary.json")
    return {"mlflow_run_id": run_info.info.run_id, **stages}


def flatten_numbers(tree: dict, prefix: str = "") -> dict[str, float]:
    """The numbers of a nested summary as dotted MLflow metric names (`retrieve.eval.all.supp_recall@2`)."""
    out: dict[str, float] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}".replace("@", "_at_")
        if isinstance(value, dict):
            out.update(flatten_numbers(value, name + "."))
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out[name] = value
    return out


def _retrieve_config(cfg: XHConfig) -> XHConfig:
    """The demo retrieves for the world's own questions unless a question file was given."""
    if cfg.retrieve.questions:
        return cfg
    questions = join(synth.world_uri(cfg), "hotpot", "questions.json")
    return cfg.model_copy(update={"retrieve": cfg.retrieve.model_copy(update={"questions": questions})})


def _wiki_config(cfg: XHConfig) -> XHConfig:
    """The demo processes the world it just generated unless inputs were given."""
    if cfg.wiki.inputs:
        return cfg
    return cfg.model_copy(update={"wiki": cfg.wiki.model_copy(update={"inputs": [join(synth.world_uri(cfg), "wiki")]})})


if __name__ == "__main__":
    main("demo", run)
