"""The whole pipeline end to end on the embedded default: `make demo` (`xh demo`).

    xh demo --config configs/demo.yaml          # HotpotQA: local Ray, SQLite MLflow, local files
    xh demo --config configs/demo-fever.yaml    # the FEVER leg

The stages in order, each reading what the previous one wrote; what the demo adds to them (the configs it
hands them, the check against the generator's truth, the held-out questions, the summary table) is
`xh.stages.demo`, where the legs are described. The last thing printed is the summary table.
"""

from __future__ import annotations

from workflows import graphs, qtype, rerank, retrieve, score, serve, synth, train, wiki
from workflows.common import init_ray, verbose
from xh.config import XHConfig
from xh.stages import demo
from xh.storage.store import Store


def run(cfg: XHConfig) -> dict:
    cfg = demo.offline_backbone(cfg)
    store = Store.from_config(cfg)
    demo.same_seed_same_figures()
    init_ray(cfg, worker_output=False)  # the stage lines and the summary; the workers' with -v
    demo.ordered_data()
    with demo.Stages(cfg) as stage:
        (run_fever if cfg.model.task == "fever" else run_hotpot)(cfg, store, stage)
    return stage.summary


def run_hotpot(cfg: XHConfig, store: Store, stage: demo.Stages) -> None:
    done = stage.done
    stage("synth", lambda: synth.run(cfg))
    stage("wiki", lambda: wiki.run(demo.wiki_config(cfg)))
    stage("check", lambda: demo.check_against_truth(cfg, store, done["wiki"]["output"]))
    if cfg.demo.train_reranker:  # off in configs/demo.yaml: the demo's small re-ranker still loses to BM25
        stage("rerank", lambda: rerank.run(demo.reranker_config(cfg, store)))
    if cfg.demo.train_path_scorer:
        stage("paths", lambda: retrieve.paths(demo.path_scorer_config(demo.with_rankers(cfg, done), store)))
    cfg = demo.with_rankers(cfg, done)  # every later stage (batch scoring too) retrieves with them
    stage("retrieve", lambda: retrieve.all_steps(demo.retrieve_config(cfg)))
    stage("graphs", lambda: graphs.run(cfg))
    stage("train", lambda: train.run(cfg))
    stage("question_types", lambda: qtype.run(demo.qtype_config(cfg)))
    classifier = done["question_types"]["path"]
    stage("evaluate", lambda: demo.evaluate_held_out(cfg, store, done["train"]["model_dir"]))
    stage("promote", lambda: demo.promote_challenger(cfg, store))
    stage("score", lambda: demo.with_answer_em(cfg, store, score.run(demo.score_config(cfg, store, classifier))))
    stage("served", lambda: served(cfg, store, classifier))


def served(cfg: XHConfig, store: Store, classifier: str) -> dict:
    """A held-out question through `xh serve`'s app serving @champion, started briefly in-process."""
    questions, _ = demo.held_out(cfg, store)
    demo.quiet_serve_driver(verbose())
    with serve.serving(demo.serve_config(cfg, classifier)) as app:
        return demo.ask(app["url"], questions[0])


def run_fever(cfg: XHConfig, store: Store, stage: demo.Stages) -> None:
    done = stage.done
    stage("synth", lambda: synth.run(cfg))
    stage("wiki", lambda: wiki.run(demo.fever_wiki_config(cfg, store)))
    stage("claims", lambda: demo.split_claims(cfg, store))
    if cfg.demo.train_sentence_reranker:
        stage("rerank", lambda: rerank.run(demo.sentence_reranker_config(cfg, store, done["claims"])))
    cfg = demo.with_sentence_reranker(cfg, done)
    for split in ("train", "dev", "test"):
        stage(f"graphs_{split}", lambda split=split: graphs.run(demo.fever_graphs_config(cfg, split, done["claims"])))
    stage("train", lambda: train.run(cfg))
    stage("promote", lambda: demo.promote_fever(cfg, store, done["graphs_dev"]["output"]))
    stage("score", lambda: score.run(demo.fever_score_config(cfg, done["claims"], done["promote"])))
    stage("fever_eval", lambda: demo.fever_eval(done["claims"], done["score"]))
