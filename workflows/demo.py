"""The whole pipeline end to end on the embedded default: `make demo`.

    python -m workflows.demo --config configs/demo.yaml

Local Ray started in-process, SQLite MLflow under `runs/mlflow/`, files under `runs/demo/`,
generated data. Stages run in order, each reading what the previous one wrote:

    synth         generate the mini-Wikipedia world (shards in parallel on Ray)
    wiki          its HotpotQA-format dump -> docs / links / redirects / anchors / quarantine (Ray Data)
    check         the tables against the generator's ground truth (every page and every hyperlink)
    rerank        only with `--set retrieve.reranker=auto`: a small cross-encoder re-ranker (MiniLM) on the
                  world's training questions (Ray Train), which retrieval then uses
    retrieve      BM25 index, candidates for the world's questions (BM25, entity links, expansion), recall
    graphs        one evidence graph per question (Ray Data)
    train         Transformer-XH on Ray Train (MiniLM backbone on CPU), registered as @challenger
    question_types  a bridge/comparison classifier for questions that come without a type
    evaluate      the official HotpotQA metrics on the held-out questions (a question without a graph is a miss)
    promote       @challenger against @champion on the held-out graphs; the winner becomes @champion
    score         the held-out questions, as new questions without answers, through batch scoring with @champion
    served        one held-out question through `xh serve`'s Ray Serve app serving @champion (briefly, in-process,
                  on a loopback port): its answer, supporting facts and version

The FEVER leg (`python -m workflows.demo --config configs/demo-fever.yaml`, `make demo TASK=fever`;
`run_fever`): synth -> wiki (FEVER wiki-pages) -> claims split by id into train / dev / test ->
(with `graphs.sentence_reranker=auto`: a sentence re-ranker trained on the training claims) -> graphs
(train: gold first; dev and test: retrieval alone) -> train
(model.task=fever, checkpoints ranked by the dev FEVER score) registered as `xh-fever` -> promote on the
dev graphs by FEVER score -> batch-score the test claims as new ones -> the official FEVER scorer on
that output (`xh eval fever --gold <root>/eval/test-claims.jsonl --pred <predictions partition>`).

One MLflow run records the config (flattened), each stage's counts and seconds, and the summary; the
training, scoring and graph stages have runs of their own. The last thing printed is a summary table.
"""

from __future__ import annotations

import bz2
import json
import time
from pathlib import Path

import pyarrow.dataset as pads

from workflows import graphs, rerank, retrieve, score, synth, train, wiki
from workflows.common import init_ray, log, main, s3_settings
from xh.backbones import resolve_backbone
from xh.config import XHConfig
from xh.storage import join, open_input, open_output, resolve
from xh.tracking import flatten_numbers, redact, stage_run, tracking_uri_without_credentials


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


# retrieve.reranker=auto / graphs.sentence_reranker=auto: the demo trains that re-ranker and uses it
AUTO = "auto"


def _stage_runner(stages: dict[str, dict]):
    """`stage(name, step)`: one log line, the step's result kept in `stages[name]`, its seconds logged to
    the demo's MLflow run."""
    import mlflow

    def stage(name: str, step) -> dict:
        log("demo", f"--- {name}")
        start = time.perf_counter()
        stages[name] = step()
        mlflow.log_metric(f"{name}.seconds", time.perf_counter() - start)
        return stages[name]

    return stage


def run(cfg: XHConfig) -> dict:
    cfg = _offline_backbone(cfg)
    if cfg.model.task == "fever":  # configs/demo-fever.yaml: the FEVER leg
        return run_fever(cfg)
    init_ray(cfg)
    stages: dict[str, dict] = {}
    with stage_run(cfg, "demo") as run_info:
        import mlflow

        stage = _stage_runner(stages)
        stage("synth", lambda: synth.run(cfg))
        stage("wiki", lambda: wiki.run(_wiki_config(cfg)))
        stage("check", lambda: check_against_truth(cfg, stages["synth"], stages["wiki"]))
        if cfg.retrieve.reranker == AUTO:  # off by default: the demo's small re-ranker still loses to BM25
            stage("rerank", lambda: train_reranker(cfg))
        reranker = stages.get("rerank", {}).get("output")
        if cfg.retrieve.path_scorer == AUTO:  # configs/demo.yaml: on
            stage("paths", lambda: train_path_scorer(_with_rankers(cfg, reranker, None)))
        # every later stage (batch scoring too) retrieves with the rankers just trained
        cfg = _with_rankers(cfg, reranker, stages.get("paths", {}).get("output"))
        stage("retrieve", lambda: retrieve.all_steps(_retrieve_config(cfg)))
        stage("graphs", lambda: graphs.run(cfg))
        stage("train", lambda: train.run(cfg))
        stage("question_types", lambda: train_question_classifier(cfg))
        stage("evaluate", lambda: evaluate_held_out(cfg, stages["train"]["model_dir"]))
        stage("promote", lambda: promote_challenger(cfg))
        stage("score", lambda: score_new_questions(cfg))
        stage("served", lambda: ask_served_champion(cfg))
        mlflow.log_metrics(flatten_numbers(stages))
        mlflow.log_dict(stages, "summary.json")
    return {"mlflow_run_id": run_info.info.run_id, "mlflow_tracking_uri": shown_uri(cfg.mlflow.tracking_uri), **stages}


def _held_out(cfg: XHConfig) -> tuple[list[dict], list[dict]]:
    """The world's questions that training held out (its dev split), and their graphs."""
    from xh.train.loop import in_dev_split

    with open_input(join(synth.world_uri(cfg), "hotpot", "questions.json"), s3_settings(cfg)) as f:
        questions = [q for q in json.loads(f.read()) if in_dev_split(q["_id"], cfg.train.dev_fraction)]
    fs, path = resolve(graphs.paths(cfg)["output"], s3_settings(cfg))
    table = pads.dataset(path, filesystem=fs, format="parquet").to_table()
    dev = {q["_id"] for q in questions}
    return questions, [g for g in table.to_pylist() if g["qid"] in dev]


def evaluate_held_out(cfg: XHConfig, model_dir: str) -> dict:
    """Official metrics over every held-out question; those without a graph have no prediction (a miss)."""
    from xh.eval.hotpot import evaluate_hotpot
    from xh.inference import hotpot_prediction_file
    from xh.pipeline import Pipeline
    from xh.wiki.titles import normalize_title

    questions, graphs = _held_out(cfg)
    prediction = hotpot_prediction_file(Pipeline.load(model=model_dir).predict(graphs))
    with open_output(join(cfg.storage.root, "eval", "pred_held_out.json"), s3_settings(cfg)) as out:
        out.write(json.dumps(prediction).encode())
    # graphs name documents by their normalised titles; the gold must too
    gold = [q | {"supporting_facts": [[normalize_title(t), i] for t, i in q["supporting_facts"]]} for q in questions]
    return {"questions": len(questions), "graphs": len(graphs), **evaluate_hotpot(gold, prediction, slices=True)}


def _classifier_dir(cfg: XHConfig) -> str:
    return str(Path(cfg.storage.root, "models", "question_type").resolve())


def train_question_classifier(cfg: XHConfig) -> dict:
    """Bridge or comparison, from the question text alone: new questions come without a type.
    Trained on the world's training questions, measured on the held-out ones."""
    from xh.model.qtype import QuestionTypeClassifier, evaluate
    from xh.train.loop import in_dev_split

    with open_input(join(synth.world_uri(cfg), "hotpot", "questions.json"), s3_settings(cfg)) as f:
        questions = json.loads(f.read())
    split = {held: [q for q in questions if in_dev_split(q["_id"], cfg.train.dev_fraction) == held] for held in (0, 1)}
    classifier = QuestionTypeClassifier.train(
        [q["question"] for q in split[0]], [q["type"] for q in split[0]], cfg.model.backbone, seed=cfg.train.seed
    )
    classifier.save(_classifier_dir(cfg))
    report = evaluate(classifier, [q["question"] for q in split[1]], [q["type"] for q in split[1]])
    return {"held_out_accuracy": report["accuracy"], "train_questions": len(split[0]), "path": _classifier_dir(cfg)}


def promote_challenger(cfg: XHConfig) -> dict:
    from xh.registry import promote

    questions, held_out = _held_out(cfg)
    p = cfg.promote
    graphed = {g["qid"] for g in held_out}
    missed = [q["_id"] for q in questions if q["_id"] not in graphed]  # no graph: a miss for both models
    return promote(
        cfg.train.register_as, held_out, metric=p.metric, min_delta=p.min_delta, floor=p.floor, missed=missed
    )


def score_new_questions(cfg: XHConfig) -> dict:
    """The held-out questions, stripped of answers and types, as a day's file of new questions."""
    from datetime import date

    questions, _ = _held_out(cfg)
    incoming = join(cfg.storage.root, "incoming")
    with open_output(join(incoming, f"{date.today().isoformat()}.jsonl"), s3_settings(cfg)) as out:
        out.write("".join(json.dumps({"qid": q["_id"], "question": q["question"]}) + "\n" for q in questions).encode())
    update = {
        "input": incoming,
        "model": f"models:/{cfg.train.register_as}@champion",
        "question_classifier": _classifier_dir(cfg),
    }
    summary = score.run(cfg.model_copy(update={"score": cfg.score.model_copy(update=update)}))
    fs, path = resolve(summary["output"], s3_settings(cfg))
    scored = pads.dataset(path, filesystem=fs, format="parquet").to_table(columns=["qid", "answer"]).to_pylist()
    from xh.eval.hotpot import normalize_answer

    gold = {q["_id"]: q["answer"] for q in questions}
    exact = sum(normalize_answer(p["answer"] or "") == normalize_answer(gold[p["qid"]]) for p in scored)
    return summary | {"answer_em": round(exact / max(1, len(questions)), 4)}


def ask_served_champion(cfg: XHConfig) -> dict:
    """A held-out question through `xh serve`'s app serving `@champion`, started briefly in-process on a
    loopback port: the answer, its supporting facts and the version that gave it."""
    from workflows.serve import serving
    from xh.serve import call, free_port

    questions, _ = _held_out(cfg)
    question = questions[0]
    update = {
        "model": f"models:/{cfg.train.register_as}@champion",
        "question_classifier": _classifier_dir(cfg),
        "host": "127.0.0.1",
        "port": free_port(),
    }
    with serving(cfg.model_copy(update={"serve": cfg.serve.model_copy(update=update)})) as served:
        status, answer = call(f"{served['url']}/answer", {"id": question["_id"], "question": question["question"]})
    if status != 200:
        raise RuntimeError(f"the served champion did not answer ({status}): {answer}")
    keys = ("id", "question", "answer", "supporting_facts", "model", "version", "error")
    return {k: answer.get(k) for k in keys if k in answer} | {"gold": question["answer"]}


def _offline_backbone(cfg: XHConfig) -> XHConfig:
    """The demo runs offline: the MiniLM hub name becomes the local copy the `offline` extra installs."""
    backbone = resolve_backbone(cfg.model.backbone)
    return cfg.model_copy(update={"model": cfg.model.model_copy(update={"backbone": backbone})})


def shown_uri(tracking_uri: str) -> str:
    """The tracking URI as the summary prints it: without user info or secret query values."""
    return redact(tracking_uri_without_credentials(tracking_uri)[0])


def mlflow_ui(tracking_uri: str) -> str:
    """How to look at the runs: a tracking server's own page, or `mlflow ui` over the store."""
    uri = shown_uri(tracking_uri)
    if uri.startswith(("http://", "https://")):
        return f"open {uri}"
    return f"mlflow ui --backend-store-uri {uri}  (then open http://127.0.0.1:5000)"


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
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows)


def _training_questions(cfg: XHConfig) -> str:
    """The world's questions outside training's dev split (the held-out ones stay unseen), as a file."""
    from xh.train.loop import in_dev_split

    s3 = s3_settings(cfg)
    with open_input(join(synth.world_uri(cfg), "hotpot", "questions.json"), s3) as f:
        questions = [q for q in json.loads(f.read()) if not in_dev_split(q["_id"], cfg.train.dev_fraction)]
    path = join(cfg.storage.root, "rerank", "train_questions.json")
    with open_output(path, s3) as out:
        out.write(json.dumps(questions).encode())
    return path


def train_reranker(cfg: XHConfig) -> dict:
    """The re-ranker, trained on the world's training questions unless a question file was given."""
    if cfg.rerank.questions:
        return rerank.run(cfg)
    path = _training_questions(cfg)
    return rerank.run(cfg.model_copy(update={"rerank": cfg.rerank.model_copy(update={"questions": path})}))


def train_path_scorer(cfg: XHConfig) -> dict:
    """The path scorer (and the BM25 index first), trained on the world's training questions."""
    update = {"questions": _training_questions(cfg), "path_scorer": None}
    return retrieve.paths(cfg.model_copy(update={"retrieve": cfg.retrieve.model_copy(update=update)}))


def _with_rankers(cfg: XHConfig, reranker: str | None, path_scorer: str | None) -> XHConfig:
    """`auto` re-ranker and path scorer replaced by the ones the demo trained (None: not trained)."""
    given, given_scorer = cfg.retrieve.reranker, cfg.retrieve.path_scorer
    update = {
        "reranker": given if given not in (None, AUTO) else reranker,
        "path_scorer": given_scorer if given_scorer not in (None, AUTO) else path_scorer,
    }
    return cfg.model_copy(update={"retrieve": cfg.retrieve.model_copy(update=update)})


def _retrieve_config(cfg: XHConfig) -> XHConfig:
    """The demo retrieves for the world's own questions unless a question file was given."""
    update = {}
    if not cfg.retrieve.questions:
        update["questions"] = join(synth.world_uri(cfg), "hotpot", "questions.json")
    return cfg.model_copy(update={"retrieve": cfg.retrieve.model_copy(update=update)})


# --- the FEVER leg ----------------------------------------------------------------------------------


def run_fever(cfg: XHConfig) -> dict:
    """The FEVER leg end to end (see the module docstring)."""
    init_ray(cfg)
    stages: dict[str, dict] = {}
    with stage_run(cfg, "demo") as run_info:
        import mlflow

        stage = _stage_runner(stages)
        stage("synth", lambda: synth.run(cfg))
        fever_wiki = cfg.wiki.model_copy(
            update={"format": "fever", "inputs": [join(synth.world_uri(cfg), "fever", "wiki-pages")]}
        )
        stage("wiki", lambda: wiki.run(cfg.model_copy(update={"wiki": fever_wiki})))
        stage("claims", lambda: split_claims(cfg))
        reranker = cfg.graphs.sentence_reranker
        if reranker == AUTO:
            r = cfg.rerank.model_copy(
                update={
                    "claims": stages["claims"]["train"]["path"],
                    "output": join(cfg.storage.root, "models", "sentence-reranker"),
                }
            )
            stage("rerank", lambda: rerank.run(cfg.model_copy(update={"rerank": r})))
            reranker = stages["rerank"]["output"]
        cfg = cfg.model_copy(update={"graphs": cfg.graphs.model_copy(update={"sentence_reranker": reranker})})
        for split in ("train", "dev", "test"):
            g = cfg.graphs.model_copy(update={"claims_split": split, "questions": stages["claims"]["all"]})
            stage(f"graphs_{split}", lambda g=g: graphs.run(cfg.model_copy(update={"graphs": g})))
        stage("train", lambda: train.run(cfg))
        stage("promote", lambda: promote_fever(cfg, stages["graphs_dev"]["output"]))
        # a first model below the floor leaves no champion: the demo still scores, with the challenger
        alias = "champion" if stages["promote"]["promoted"] or stages["promote"].get("champion") else "challenger"
        stage("score", lambda: score_fever_claims(cfg, stages["claims"], alias))
        stages["fever_eval"] = stages["score"].pop("official")
        mlflow.log_metrics(flatten_numbers(stages))
        mlflow.log_dict(stages, "summary.json")
    return {"mlflow_run_id": run_info.info.run_id, "mlflow_tracking_uri": shown_uri(cfg.mlflow.tracking_uri), **stages}


def split_claims(cfg: XHConfig) -> dict:
    """The world's claims file and, by claim id, its train split (re-ranker training), test gold, and the test
    claims without labels (the day's new claims for batch scoring)."""
    from xh.fever import write_claim_split

    claims, s3, g = join(synth.world_uri(cfg), "fever", "claims.jsonl"), s3_settings(cfg), cfg.graphs
    out = join(cfg.storage.root, "eval")
    paths = {"train": join(out, "train-claims.jsonl"), "test": join(out, "test-claims.jsonl")}
    counts = {
        split: write_claim_split(claims, split, path, g.dev_fraction, g.test_fraction, s3=s3)
        for split, path in paths.items()
    }
    incoming = join(cfg.storage.root, "incoming-claims")
    write_claim_split(
        claims, "test", join(incoming, "claims.jsonl"), g.dev_fraction, g.test_fraction, labels=False, s3=s3
    )
    return {
        "all": claims,
        "incoming": incoming,
        **{split: {"path": paths[split], "claims": counts[split]} for split in paths},
    }


def promote_fever(cfg: XHConfig, dev_graphs: str) -> dict:
    """`@challenger` against `@champion` by the official FEVER score on the retrieval-only dev graphs."""
    from xh.graph.store import read_eval_set
    from xh.registry import promote

    p = cfg.promote
    rows = read_eval_set(dev_graphs, s3_settings(cfg))
    return promote(cfg.train.register_as, rows, metric=p.metric, min_delta=p.min_delta, floor=p.floor, task="fever")


def score_fever_claims(cfg: XHConfig, claims: dict, alias: str = "champion") -> dict:
    """The test claims, without labels, through batch scoring with `@champion` (`alias`); then the official FEVER
    scorer on the predictions table against their gold (a claim without a prediction is a miss)."""
    from xh.eval.fever import evaluate_fever_files

    update = {"input": claims["incoming"], "model": f"models:/{cfg.train.register_as}@{alias}"}
    summary = score.run(cfg.model_copy(update={"score": cfg.score.model_copy(update=update)}))
    official = evaluate_fever_files(claims["test"]["path"], summary["output"], slices=True)
    return summary | {"official": official}


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
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows)


def _wiki_config(cfg: XHConfig) -> XHConfig:
    """The demo processes the world it just generated unless inputs were given."""
    if cfg.wiki.inputs:
        return cfg
    return cfg.model_copy(update={"wiki": cfg.wiki.model_copy(update={"inputs": [join(synth.world_uri(cfg), "wiki")]})})


if __name__ == "__main__":
    main("demo", run, epilogue=summary_table)
