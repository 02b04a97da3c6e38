"""What the demo (`workflows/demo.py`, `make demo`) adds to the stages it runs: the configs it hands them, the
check against the generator's truth, the held-out questions (evaluated, promoted on, scored, served), its
MLflow run and the summary table.

The HotpotQA leg:

    synth           generate the mini-Wikipedia world (shards in parallel on Ray)
    wiki            its HotpotQA-format dump -> docs / links / redirects / anchors / quarantine (Ray Data)
    check           the tables against the generator's ground truth (every page and every hyperlink)
    rerank          only with `demo.train_reranker` (`xh demo --train-reranker`): a small cross-encoder
                    re-ranker (MiniLM) on the world's training questions (Ray Train), which retrieval then uses
    paths           with `demo.train_path_scorer` (configs/demo.yaml): the path scorer, likewise
    retrieve        BM25 index, candidates for the world's questions (BM25, entity links, expansion), recall
    graphs          one evidence graph per question (Ray Data)
    train           Transformer-XH on Ray Train (MiniLM backbone on CPU), registered as @challenger
    question_types  the question-type stage (`xh qtype`) for questions that come without a type
    evaluate        the official HotpotQA metrics on the held-out questions (a question without a graph is a miss)
    promote         @challenger against @champion on the held-out graphs; the winner becomes @champion
    score           the held-out questions, as new questions without answers, through batch scoring with @champion
    served          one held-out question through `xh serve`'s Ray Serve app serving @champion (briefly,
                    in-process, on a loopback port): its answer, supporting facts and version

The FEVER leg (configs/demo-fever.yaml, `make demo TASK=fever`): synth -> wiki (FEVER wiki-pages) -> claims
split by id into train / dev / test -> (with `demo.train_sentence_reranker`: a sentence re-ranker trained on
the training claims) -> graphs (train: gold first; dev and test: retrieval alone) -> train (model.task=fever,
checkpoints ranked by the dev FEVER score) registered as `xh-fever` -> promote on the dev graphs by FEVER
score -> batch-score the test claims as new ones -> the official FEVER scorer on that output.

One MLflow run records the config (flattened), each stage's counts and seconds, and the summary; the
training, scoring and graph stages have runs of their own.
"""

from __future__ import annotations

import bz2
import json
import time
from datetime import date

import pyarrow.dataset as pads

from xh.config import XHConfig
from xh.model.backbones import resolve_backbone
from xh.storage import locations
from xh.storage.store import Location, Store
from xh.tracking import flatten_numbers, redact, stage_run, tracking_uri_without_credentials
from xh.train.split import in_dev_split


def _update(cfg: XHConfig, section: str, **values) -> XHConfig:
    """`cfg` with some settings of one section replaced."""
    return cfg.model_copy(update={section: getattr(cfg, section).model_copy(update=values)})


class Stages:
    """`stage(name, step)`: one log line, the step's result kept in `done[name]`, its seconds logged to the
    demo's MLflow run; on leaving, the figures and the summary logged too (`summary`: what the demo returns)."""

    def __init__(self, cfg: XHConfig):
        self.cfg, self.done = cfg, {}

    def __enter__(self) -> Stages:
        self._run = stage_run(self.cfg, "demo").__enter__()
        return self

    def __call__(self, name: str, step) -> dict:
        import logging

        import mlflow

        logging.getLogger("xh.demo").info(f"--- {name}")
        start = time.perf_counter()
        self.done[name] = step()
        mlflow.log_metric(f"{name}.seconds", time.perf_counter() - start)
        return self.done[name]

    def __exit__(self, *failure) -> None:
        import mlflow

        if failure[0] is None:
            mlflow.log_metrics(flatten_numbers(self.done))
            mlflow.log_dict(self.done, "summary.json")
        self._run.__exit__(*failure)

    @property
    def summary(self) -> dict:
        uri = shown_uri(self.cfg.mlflow.tracking_uri)
        return {"mlflow_run_id": self._run.info.run_id, "mlflow_tracking_uri": uri, **self.done}


# --- the same figures from the same seed --------------------------------------------------------------


def same_seed_same_figures() -> None:
    """Before Ray starts (its local workers inherit the driver's environment): str hashes, so set orders,
    fixed in every worker. The driver's own is `make demo`'s PYTHONHASHSEED. Seeds: each stage's own."""
    import os

    os.environ.setdefault("PYTHONHASHSEED", "0")


def ordered_data() -> None:
    """Ray Data hands blocks on in their order, not as tasks finish: the training shard, and with it the
    seeded local shuffle, sees the same rows in the same order on every run."""
    import ray.data

    ray.data.DataContext.get_current().execution_options.preserve_order = True


def quiet_serve_driver(verbose: bool) -> None:
    """Importing Ray Serve sets its driver-side logger to INFO ("Started Serve in namespace ..."): back to
    errors only unless -v, once imported (a level set before the import would be overwritten)."""
    import logging

    import ray.serve  # noqa: F401

    logging.getLogger("ray.serve").setLevel(logging.INFO if verbose else logging.ERROR)


# --- the configs the demo hands its stages -----------------------------------------------------------


def offline_backbone(cfg: XHConfig) -> XHConfig:
    """The demo runs offline: the MiniLM hub name becomes the local copy the `offline` extra installs."""
    return _update(cfg, "model", backbone=resolve_backbone(cfg.model.backbone))


def world_questions(cfg: XHConfig, store: Store) -> Location:
    return store.at(locations.world(cfg), "hotpot", "questions.json")


def wiki_config(cfg: XHConfig) -> XHConfig:
    """The demo processes the world it just generated unless inputs were given."""
    if cfg.wiki.inputs:
        return cfg
    return _update(cfg, "wiki", inputs=[str(Store.from_config(cfg).at(locations.world(cfg), "wiki"))])


def training_questions(cfg: XHConfig, store: Store) -> str:
    """The world's questions outside training's dev split (the held-out ones stay unseen), as a file."""
    questions = json.loads(world_questions(cfg, store).read_bytes())
    kept = [q for q in questions if not in_dev_split(q["_id"], cfg.train.dev_fraction)]
    path = store.under_root("rerank", "train_questions.json")
    path.write_bytes(json.dumps(kept).encode())
    return str(path)


def reranker_config(cfg: XHConfig, store: Store) -> XHConfig:
    """The re-ranker, trained on the world's training questions unless a question file was given."""
    return cfg if cfg.rerank.questions else _update(cfg, "rerank", questions=training_questions(cfg, store))


def path_scorer_config(cfg: XHConfig, store: Store) -> XHConfig:
    """The path scorer (and the BM25 index first), trained on the world's training questions."""
    return _update(cfg, "retrieve", questions=training_questions(cfg, store), path_scorer=None)


def with_rankers(cfg: XHConfig, trained: dict[str, dict]) -> XHConfig:
    """Retrieval with the re-ranker and path scorer the demo trained (`trained`: its stages so far)."""
    update = {}
    if cfg.demo.train_reranker and "rerank" in trained:
        update["reranker"] = trained["rerank"]["output"]
    if cfg.demo.train_path_scorer and "paths" in trained:
        update["path_scorer"] = trained["paths"]["output"]
    return _update(cfg, "retrieve", **update)


def retrieve_config(cfg: XHConfig) -> XHConfig:
    """The demo retrieves for the world's own questions unless a question file was given."""
    if cfg.retrieve.questions:
        return cfg
    return _update(cfg, "retrieve", questions=str(world_questions(cfg, Store.from_config(cfg))))


def qtype_config(cfg: XHConfig) -> XHConfig:
    """The question-type classifier holds out the questions training holds out, with the model's backbone."""
    return _update(cfg, "qtype", dev_fraction=cfg.train.dev_fraction, seed=cfg.train.seed)


def _champion(cfg: XHConfig, alias: str = "champion") -> str:
    return f"models:/{cfg.train.register_as}@{alias}"


def score_config(cfg: XHConfig, store: Store, classifier: str) -> XHConfig:
    """The held-out questions, stripped of answers and types, written as a day's file of new questions."""
    questions, _ = held_out(cfg, store)
    incoming = store.under_root("incoming")
    lines = "".join(json.dumps({"qid": q["_id"], "question": q["question"]}) + "\n" for q in questions)
    incoming.join(f"{date.today().isoformat()}.jsonl").write_bytes(lines.encode())
    return _update(cfg, "score", input=str(incoming), model=_champion(cfg), question_classifier=classifier)


def serve_config(cfg: XHConfig, classifier: str) -> XHConfig:
    """`xh serve`'s app serving @champion, briefly, on a free loopback port."""
    from xh.serve import free_port

    update = {"model": _champion(cfg), "question_classifier": classifier, "host": "127.0.0.1", "port": free_port()}
    return _update(cfg, "serve", **update)


# --- the held-out questions ---------------------------------------------------------------------------


def check_against_truth(cfg: XHConfig, store: Store, tables: str) -> dict:
    """Every generated page is a doc and every true hyperlink is a resolved row of `links`."""
    world = store.at(locations.world(cfg))
    truth = json.loads(world.join("truth", "summary.json").read_bytes())
    true_links = set()
    for relative in truth["paths"]["links"]:
        for line in bz2.decompress(world.join(relative).read_bytes()).splitlines():
            row = json.loads(line)
            true_links.add((row["source"], row["target"], row["anchor"], row["sentence"]))
    fs, root = store.at(tables).fs_path()
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


def held_out(cfg: XHConfig, store: Store) -> tuple[list[dict], list[dict]]:
    """The world's questions that training held out (its dev split), and their graphs."""
    questions = json.loads(world_questions(cfg, store).read_bytes())
    questions = [q for q in questions if in_dev_split(q["_id"], cfg.train.dev_fraction)]
    fs, path = store.at(locations.graphs(cfg, cfg.graphs.task, cfg.graphs.output)).fs_path()
    table = pads.dataset(path, filesystem=fs, format="parquet").to_table()
    dev = {q["_id"] for q in questions}
    return questions, [g for g in table.to_pylist() if g["qid"] in dev]


def evaluate_held_out(cfg: XHConfig, store: Store, model_dir: str) -> dict:
    """Official metrics over every held-out question; those without a graph have no prediction (a miss)."""
    from xh.eval.hotpot import evaluate_hotpot
    from xh.eval.official import hotpot_prediction_file
    from xh.pipeline import Pipeline
    from xh.wiki.titles import normalize_title

    questions, graphs = held_out(cfg, store)
    prediction = hotpot_prediction_file(Pipeline.load(model=model_dir).predict(graphs))
    store.at(locations.evaluation(cfg), "pred_held_out.json").write_bytes(json.dumps(prediction).encode())
    # graphs name documents by their normalised titles; the gold must too
    gold = [q | {"supporting_facts": [[normalize_title(t), i] for t, i in q["supporting_facts"]]} for q in questions]
    return {"questions": len(questions), "graphs": len(graphs), **evaluate_hotpot(gold, prediction, slices=True)}


def promote_challenger(cfg: XHConfig, store: Store) -> dict:
    """@challenger against @champion as `xh promote` judges them: on the gate split its training recorded."""
    from xh.stages import promote

    return promote.run(_update(cfg, "promote", model=cfg.train.register_as), store)


def with_answer_em(cfg: XHConfig, store: Store, scored: dict) -> dict:
    """Batch scoring's summary and the exact match of its answers against the held-out gold."""
    from xh.eval.hotpot import normalize_answer

    questions, _ = held_out(cfg, store)
    fs, path = store.at(scored["output"]).fs_path()
    rows = pads.dataset(path, filesystem=fs, format="parquet").to_table(columns=["qid", "answer"]).to_pylist()
    gold = {q["_id"]: q["answer"] for q in questions}
    exact = sum(normalize_answer(p["answer"] or "") == normalize_answer(gold[p["qid"]]) for p in rows)
    return scored | {"answer_em": round(exact / max(1, len(questions)), 4)}


def ask(url: str, question: dict) -> dict:
    """A held-out question through the served app: the answer, its supporting facts and the version that gave it."""
    from xh.serve import call

    status, answer = call(f"{url}/answer", {"id": question["_id"], "question": question["question"]})
    if status != 200:
        raise RuntimeError(f"the served champion did not answer ({status}): {answer}")
    keys = ("id", "question", "answer", "supporting_facts", "model", "version", "error")
    return {k: answer.get(k) for k in keys if k in answer} | {"gold": question["answer"]}


# --- the FEVER leg ------------------------------------------------------------------------------------


def split_claims(cfg: XHConfig, store: Store) -> dict:
    """The world's claims file and, by claim id, its train split (re-ranker training), test gold, and the test
    claims without labels (the day's new claims for batch scoring)."""
    from xh.inputs.claims import write_claim_split

    claims, g = store.at(locations.world(cfg), "fever", "claims.jsonl"), cfg.graphs
    out = store.at(locations.evaluation(cfg))
    paths = {"train": out.join("train-claims.jsonl"), "test": out.join("test-claims.jsonl")}
    counts = {
        split: write_claim_split(claims, split, path, g.dev_fraction, g.test_fraction) for split, path in paths.items()
    }
    incoming = store.under_root("incoming-claims")
    write_claim_split(claims, "test", incoming.join("claims.jsonl"), g.dev_fraction, g.test_fraction, labels=False)
    return {
        "all": str(claims),
        "incoming": str(incoming),
        **{split: {"path": str(paths[split]), "claims": counts[split]} for split in paths},
    }


def fever_wiki_config(cfg: XHConfig, store: Store) -> XHConfig:
    return _update(cfg, "wiki", format="fever", inputs=[str(store.at(locations.world(cfg), "fever", "wiki-pages"))])


def sentence_reranker_config(cfg: XHConfig, store: Store, claims: dict) -> XHConfig:
    """The claim-sentence re-ranker, trained on the training claims."""
    return _update(
        cfg, "rerank", claims=claims["train"]["path"], output=str(store.under_root("models", "sentence-reranker"))
    )


def with_sentence_reranker(cfg: XHConfig, trained: dict[str, dict]) -> XHConfig:
    """Graphs (and so training and scoring, which record them) with the sentence re-ranker the demo trained."""
    if cfg.demo.train_sentence_reranker and "rerank" in trained:
        return _update(cfg, "graphs", sentence_reranker=trained["rerank"]["output"])
    return cfg


def fever_graphs_config(cfg: XHConfig, split: str, claims: dict) -> XHConfig:
    """One claim split's graphs (train: gold first; dev and test: retrieval alone)."""
    return _update(cfg, "graphs", claims_split=split, questions=claims["all"])


def promote_fever(cfg: XHConfig, store: Store, dev_graphs: str) -> dict:
    """@challenger against @champion as `xh promote` judges them, by the official FEVER score on the test
    claims' retrieval-only graphs (beside `dev_graphs`): the dev graphs picked the checkpoint, these nothing."""
    from xh.stages import promote

    test_graphs = dev_graphs.rstrip("/").removesuffix("-dev") + "-test"
    return promote.run(_update(cfg, "promote", model=cfg.train.register_as, eval_set=test_graphs), store)


def fever_score_config(cfg: XHConfig, claims: dict, promoted: dict) -> XHConfig:
    """The test claims, without labels, for batch scoring with @champion; a first model below the floor
    leaves no champion, and the demo still scores, with @challenger."""
    alias = "champion" if promoted["promoted"] or promoted.get("champion") else "challenger"
    return _update(cfg, "score", input=claims["incoming"], model=_champion(cfg, alias))


def fever_eval(claims: dict, scored: dict) -> dict:
    """The official FEVER scorer on batch scoring's predictions against the test gold (a claim without a
    prediction is a miss)."""
    from xh.eval.fever import evaluate_fever_files

    return evaluate_fever_files(claims["test"]["path"], scored["output"], slices=True)


# --- the summary table --------------------------------------------------------------------------------


def shown_uri(tracking_uri: str) -> str:
    """The tracking URI as the summary prints it: without user info or secret query values."""
    return redact(tracking_uri_without_credentials(tracking_uri)[0])


def mlflow_ui(tracking_uri: str) -> str:
    """How to look at the runs: a tracking server's own page, or `mlflow ui` over the configured store."""
    uri = shown_uri(tracking_uri)
    if uri.startswith(("http://", "https://")):
        return f"open {uri}"
    return f"mlflow ui --backend-store-uri {uri}  (then open http://127.0.0.1:5000)"


def _table(rows: list[tuple[str, str]]) -> str:
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows)


def summary_table(summary: dict) -> str:
    """What a person reads at the end: the figures, where everything is, how to look at it."""
    if "fever_eval" in summary:
        return fever_summary_table(summary)
    s = summary
    ev, scored = s["evaluate"], s["score"]
    rows = [
        ("world", f"{s['synth']['docs']} docs, {s['check']['true_links']} links checked against the truth"),
        (
            "retrieval",
            f"Supp@2 {s['retrieve']['eval']['all']['supp_recall@2']:.3f} "
            f"({'path scorer' if 'paths' in s else 'BM25'}), "
            f"graph Supp recall {s['retrieve']['eval']['all']['graph.supp_recall']:.3f}",
        ),
        ("graphs", f"{s['graphs']['graphs']} graphs, {s['graphs']['quarantined']} quarantined"),
        (
            "training",
            f"{s['train']['step']} steps on {s['train']['train_graphs']} graphs; "
            f"registered {s['train']['registered']['name']} v{s['train']['registered']['version']}",
        ),
        (
            "held-out (official)",
            f"EM {ev['em']:.3f}  F1 {ev['f1']:.3f}  Sup F1 {ev['sp_f1']:.3f}  "
            f"Joint F1 {ev['joint_f1']:.3f}  ({ev['questions']} questions)",
        ),
        ("question types", f"classifier accuracy {s['question_types']['held_out_accuracy']:.3f} on held-out questions"),
        ("promotion", f"{'promoted' if s['promote']['promoted'] else 'kept champion'}: {s['promote']['reason']}"),
        (
            "batch scoring",
            f"{scored['predictions']} predictions, {sum(scored['quarantined'].values())} quarantined, "
            f"answer EM {scored['answer_em']:.3f}, {scored['questions_per_s']} questions/s",
        ),
        ("predictions", scored["output"]),
    ]
    if "served" in s:  # one held-out question through the served champion (Ray Serve, HTTP)
        served = s["served"]
        rows.append(
            (
                "served",
                f"{served.get('model')} v{served.get('version')} over HTTP: {served['question']!r} -> "
                f"{served.get('answer')!r} (gold {served['gold']!r})"
                + (f", {served['error']}" if "error" in served else ""),
            )
        )
    rows.append(("MLflow", mlflow_ui(s["mlflow_tracking_uri"])))
    return _table(rows)


def fever_summary_table(summary: dict) -> str:
    s = summary
    ev, scored, g = s["fever_eval"], s["score"], s["graphs_test"]
    recall = g["flags"].get("fever_gold_group_in_graph", 0) / max(1, g["flags"].get("fever_verifiable", 0))
    slices = ev.get("slices", {})
    rows = [
        ("world", f"{s['synth']['docs']} pages, {s['wiki']['docs']} docs"),
        (
            "claims",
            f"train {s['graphs_train']['graphs']}, dev {s['graphs_dev']['graphs']}, test {s['claims']['test']['claims']}",
        ),
        (
            "sentence retrieval",
            f"test evidence recall@5 {recall:.3f} ({'BM25 + re-ranker' if 'rerank' in s else 'BM25'})",
        ),
        (
            "training",
            f"{s['train']['step']} steps on {s['train']['train_graphs']} graphs; dev FEVER score "
            f"{s['train']['metrics'].get('dev_fever_score', 0):.3f}; registered "
            f"{s['train']['registered']['name']} v{s['train']['registered']['version']}",
        ),
        ("promotion", f"{'promoted' if s['promote']['promoted'] else 'kept champion'}: {s['promote']['reason']}"),
        (
            "test claims (official)",
            f"FEVER score {ev['fever_score']:.3f}  label accuracy {ev['label_accuracy']:.3f}  "
            f"evidence P {ev['evidence_precision']:.3f} R {ev['evidence_recall']:.3f} F1 {ev['evidence_f1']:.3f}",
        ),
        (
            "slices (FEVER score)",
            "  ".join(f"{k} {v['fever_score']:.3f} ({v['claims']})" for k, v in sorted(slices.items())),
        ),
        ("batch scoring", f"{scored['predictions']} predictions, {sum(scored['quarantined'].values())} quarantined"),
        ("predictions", scored["output"]),
        ("MLflow", mlflow_ui(s["mlflow_tracking_uri"])),
    ]
    return _table(rows)
