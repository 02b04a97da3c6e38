"""The demo's closing table (`xh.stages.demo.summary_table`) tells a person how to open the runs of the
tracking store the demo used, never with the credentials its URI may carry."""

from __future__ import annotations

import pytest

from xh.stages.demo import shown_uri, summary_table


def _summary(tracking_uri: str) -> dict:
    """A HotpotQA demo summary with every figure the table prints."""
    return {
        "mlflow_run_id": "r1",
        "mlflow_tracking_uri": tracking_uri,
        "synth": {"docs": 800},
        "check": {"true_links": 1200},
        "retrieve": {"eval": {"all": {"supp_recall@2": 0.5, "graph.supp_recall": 0.75}}},
        "graphs": {"graphs": 60, "quarantined": 0},
        "train": {"step": 12, "train_graphs": 45, "registered": {"name": "xh-hotpot", "version": "1"}},
        "evaluate": {"em": 0.1, "f1": 0.2, "sp_f1": 0.3, "joint_f1": 0.05, "questions": 15},
        "question_types": {"held_out_accuracy": 0.9},
        "promote": {"promoted": True, "reason": "no champion yet"},
        "score": {
            "predictions": 15,
            "quarantined": {},
            "answer_em": 0.1,
            "questions_per_s": 3.0,
            "output": "runs/demo/predictions",
        },
        "served": {
            "id": "q7",
            "question": "Which magazine was started first?",
            "answer": "Arthur's Magazine",
            "supporting_facts": [{"title": "arthur's magazine", "sent": 0}],
            "model": "xh-hotpot",
            "version": "2",
            "gold": "Arthur's Magazine",
        },
    }


def _mlflow_line(summary: dict) -> str:
    (line,) = [row for row in summary_table(summary).splitlines() if row.startswith("MLflow")]
    return line


@pytest.mark.parametrize(
    "uri, shown",
    [
        ("sqlite:////srv/xh/mlflow.db", "mlflow ui --backend-store-uri sqlite:////srv/xh/mlflow.db  (then open"),
        ("http://alice:pa55word@tracker.example:5000", "open http://tracker.example:5000"),
        ("https://tracker.example/?token=t0ken", "open https://tracker.example/?token=***"),
    ],
)
def test_the_table_shows_how_to_open_the_configured_store_without_credentials(uri, shown):
    line = _mlflow_line(_summary(uri))
    assert line.split(None, 1)[1].startswith(shown), line
    assert "runs/mlflow" not in line
    assert "alice" not in line and "pa55word" not in line and "t0ken" not in line


def test_the_summary_keeps_the_uri_without_user_info():
    assert shown_uri("postgresql://xh:pa55word@db.example:5432/mlflow") == "postgresql://db.example:5432/mlflow"


def test_the_table_shows_the_question_the_served_champion_answered():
    (line,) = [row for row in summary_table(_summary("sqlite:///m.db")).splitlines() if row.startswith("served")]
    assert "xh-hotpot v2 over HTTP: 'Which magazine was started first?' -> \"Arthur's Magazine\"" in line


def test_the_demo_run_records_each_stage_its_seconds_and_the_summary(tmp_path, monkeypatch):
    import mlflow

    from xh.config import load_config
    from xh.stages.demo import Stages

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    cfg = load_config(None, [f"mlflow.tracking_uri={uri}", f"mlflow.artifact_location={tmp_path}/artifacts"])
    with Stages(cfg) as stage:
        stage("synth", lambda: {"docs": 3})
        stage("check", lambda: {"true_links": 2, "docs_missing": 0})
    summary = stage.summary
    assert summary["mlflow_tracking_uri"] == uri and summary["synth"] == {"docs": 3}
    run = mlflow.get_run(summary["mlflow_run_id"])
    assert run.info.status == "FINISHED" and run.data.params["demo.train_path_scorer"] == "False"
    assert run.data.metrics["synth.docs"] == 3 and run.data.metrics["check.true_links"] == 2
    assert run.data.metrics["synth.seconds"] >= 0 and "check.seconds" in run.data.metrics
    logged = mlflow.artifacts.load_dict(f"{run.info.artifact_uri}/summary.json")
    assert logged == {"synth": {"docs": 3}, "check": {"true_links": 2, "docs_missing": 0}}

    with pytest.raises(RuntimeError, match="tables disagree"), Stages(cfg) as failed:
        failed("check", lambda: (_ for _ in ()).throw(RuntimeError("the tables disagree")))
    assert mlflow.get_run(failed.summary["mlflow_run_id"]).info.status == "FAILED"


def test_xh_demo_flags_say_what_the_demo_trains_first_and_the_table_follows_the_summary(capsys, monkeypatch):
    import json
    from pathlib import Path

    import workflows.demo
    from tests.cli import xh

    seen = []

    def run(cfg):
        seen.append(cfg.demo)
        return _summary("sqlite:///m.db")

    monkeypatch.setattr(workflows.demo, "run", run)
    config = str(Path(__file__).resolve().parents[3] / "configs" / "demo.yaml")
    xh("demo", "--config", config, "--no-train-path-scorer", "--train-reranker")
    assert [(d.train_reranker, d.train_path_scorer, d.train_sentence_reranker) for d in seen] == [(True, False, False)]
    out, err = capsys.readouterr()
    assert json.loads(out)["mlflow_run_id"] == "r1"
    assert err.strip().splitlines()[0].startswith("world") and err.strip().splitlines()[-1].startswith("MLflow")
    xh("demo", "--config", config)
    assert (seen[-1].train_reranker, seen[-1].train_path_scorer) == (False, True)  # configs/demo.yaml's


def test_the_fever_leg_builds_with_the_sentence_reranker_it_trained_and_scores_with_the_champion_it_has():
    from pathlib import Path

    from xh.config import load_config
    from xh.stages import demo

    config = Path(__file__).resolve().parents[3] / "configs" / "demo-fever.yaml"
    claims = {"all": "w/fever/claims.jsonl", "incoming": "runs/incoming-claims", "train": {"path": "t.jsonl"}}
    trained = {"rerank": {"output": "runs/models/sentence-reranker"}, "claims": claims}
    cfg = load_config(config)
    assert demo.with_sentence_reranker(cfg, trained).graphs.sentence_reranker is None  # not asked: not used
    cfg = demo.with_sentence_reranker(load_config(config, ["demo.train_sentence_reranker=true"]), trained)
    graphs = demo.fever_graphs_config(cfg, "dev", claims).graphs
    assert (graphs.sentence_reranker, graphs.claims_split, graphs.questions) == (
        "runs/models/sentence-reranker",
        "dev",
        "w/fever/claims.jsonl",
    )
    first_below_the_floor = {"promoted": False, "champion": None}
    assert demo.fever_score_config(cfg, claims, first_below_the_floor).score.model == "models:/xh-fever@challenger"
    assert demo.fever_score_config(cfg, claims, {"promoted": True}).score.model == "models:/xh-fever@champion"
    assert demo.fever_score_config(cfg, claims, {"promoted": True}).score.input == "runs/incoming-claims"
