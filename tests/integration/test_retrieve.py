"""Retrieval on the Ray cluster: sharded index, candidates from three sources, recall, bad input."""

import json

import pyarrow.dataset as pads
import pytest

from workflows import retrieve
from xh import synth
from xh.config import load_config
from xh.retrieval.bm25 import ShardFileError
from xh.retrieval.candidates import Retriever
from xh.retrieval.index import load_index
from xh.stages import retrieve as retrieve_stage
from xh.stages import wiki
from xh.storage.store import Store


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("retrieve")
    spec = synth.WorldSpec(num_docs=1500, seed=11)
    synth.write_world(
        spec, synth.output_under(str(root / "world")), docs_per_shard=500, num_questions=120, num_claims=5
    )
    questions = json.loads((root / "world" / "hotpot" / "questions.json").read_text())
    questions += [
        {"_id": "bad-empty", "question": "   ", "answer": "x", "type": "bridge"},
        {"_id": "stop-words", "question": "Which of the ones was it?", "answer": "x", "type": "bridge"},
        {"_id": "unknown", "question": "Zyxxqv plorbt?", "answer": "x", "type": "bridge"},
    ]
    (root / "questions.json").write_text(json.dumps(questions))
    wiki.write_tables(
        Store().at(str(root / "tables")), [Store().at(str(root / "world" / "wiki"))], "hotpot", partitions=4, local=True
    )
    return root


def test_candidates_from_three_sources_reach_the_supporting_docs(ray_cluster, world):
    cfg = load_config(
        None,
        [
            f"storage.root={world}",
            f"retrieve.questions={world / 'questions.json'}",
            "retrieve.shards=3",
            "retrieve.batch_size=32",
        ],
    )
    summary = retrieve.all_steps(cfg)
    assert summary["index"]["shards"] == 3 and summary["index"]["docs"] == 1500
    assert summary["questions"] == {"questions": 122, "quarantined": 1}  # the empty question
    assert set(summary["retrieve"]["candidates"]) == {"ir", "el", "exp"}

    report = summary["eval"]
    # bridge answers sit in a doc the question does not name: BM25 alone rarely has both, the graph does
    assert report["bridge"]["graph.supp_recall"] >= 0.85
    assert report["bridge"]["graph.supp_recall"] > report["bridge"]["supp_recall@10"] + 0.3
    assert report["comparison"]["graph.supp_recall"] >= 0.85

    candidates = pads.dataset(str(world / "retrieval" / "candidates")).to_table().to_pylist()
    by_q = {}
    for row in candidates:
        by_q.setdefault(row["qid"], []).append(row)
    assert "bad-empty" not in by_q
    assert not [r for r in by_q.get("stop-words", []) if r["source"] == "ir"]  # no crash, no BM25 candidates
    assert not by_q.get("unknown")
    ranks = sorted(r["rank"] for r in by_q[candidates[0]["qid"]] if r["source"] == "ir")
    assert ranks == list(range(len(ranks))) and len(ranks) <= 100

    # sharding changes no score: a one-shard index gives the same BM25 candidates
    one = load_config(None, [f"storage.root={world}", f"retrieve.index={world / 'index-one'}", "retrieve.shards=1"])
    retrieve.index(one)
    texts = [q["question"] for q in json.loads((world / "questions.json").read_text())[:40]]
    three_shards = Retriever.load(str(world / "index" / "bm25"), str(world / "tables"), cfg.retrieve)
    one_shard = Retriever.load(str(world / "index-one"), str(world / "tables"), cfg.retrieve)
    ids = [str(i) for i in range(len(texts))]
    assert three_shards.candidates(ids, texts) == one_shard.candidates(ids, texts)


def test_a_path_scorer_trained_on_ray_puts_the_supporting_pair_first(ray_cluster, mlflow_server, world, tmp_path):
    """`xh retrieve paths` on the first 80 questions, tracked on the MLflow server; retrieval with it on the
    other 40 has both supporting docs in its first two ir rows more often than BM25 alone."""
    from mlflow import MlflowClient

    questions = json.loads((world / "questions.json").read_text())
    (tmp_path / "train.json").write_text(json.dumps(questions[:80]))
    (tmp_path / "held_out.json").write_text(json.dumps(questions[80:120]))
    base = [
        f"storage.root={tmp_path}",
        f"retrieve.tables={world / 'tables'}",
        f"retrieve.index={world / 'index-paths'}",
    ]
    tracking = [f"mlflow.tracking_uri={mlflow_server}", "mlflow.experiment=paths", "mlflow.artifact_location=null"]
    training = [*base, *tracking, f"retrieve.questions={tmp_path / 'train.json'}"]
    trained = retrieve.paths(load_config(None, training))
    assert trained["index"]["docs"] == 1500  # built, as there was none
    assert trained["questions"] + trained["without_two_titles"] == 80 and trained["gold_titles_not_in_docs"] == 0
    assert trained["usable"] <= trained["questions"] and trained["pair_among_candidates"] >= 0.9
    assert trained["output"] == str(tmp_path / "models" / "path-scorer")
    run = MlflowClient(mlflow_server).get_run(trained["mlflow_run_id"])
    assert run.data.metrics["train_supp_recall_at_2"] == trained["train_supp_recall@2"]
    assert run.data.params["retrieve.path_neighbours"] == "10" and run.data.tags["stage"] == "retrieve"

    held_out = [*base, f"retrieve.questions={tmp_path / 'held_out.json'}"]
    bm25 = retrieve.all_steps(load_config(None, held_out))["eval"]["all"]
    scored = retrieve.all_steps(load_config(None, [*held_out, f"retrieve.path_scorer={trained['output']}"]))
    assert "path scorer" in scored["retrieve"]["ranker"]
    assert scored["eval"]["all"]["supp_recall@2"] >= bm25["supp_recall@2"] + 0.2
    rankers = pads.dataset(str(tmp_path / "retrieval" / "candidates")).to_table(columns=["source", "ranker"])
    assert {r["ranker"] for r in rankers.to_pylist() if r["source"] == "ir"} == {"paths"}


def test_a_missing_shard_file_is_a_clear_error(world, tmp_path):
    import shutil

    broken = tmp_path / "index"
    shutil.copytree(world / "index" / "bm25", broken)
    (broken / "shards" / "shard-00001" / "weights.npy").unlink()
    with pytest.raises(ShardFileError, match="weights.npy"):
        load_index(str(broken))
    with pytest.raises(FileNotFoundError, match="no BM25 index"):
        load_index(str(tmp_path / "nothing"))


def test_a_run_without_its_index_or_reranker_fails_before_writing_anything(tmp_path):
    """`xh retrieve run` checks its inputs first: the previous run's questions and quarantine survive a failed run."""
    good = [{"_id": "a", "question": "Where?", "answer": "x"}, {"_id": "empty", "question": " ", "answer": "x"}]
    (tmp_path / "first.json").write_text(json.dumps(good))
    cfg = load_config(None, [f"storage.root={tmp_path}", f"retrieve.questions={tmp_path / 'first.json'}"])
    assert retrieve_stage.write_questions(cfg, Store.from_config(cfg)) == {"questions": 1, "quarantined": 1}
    before = {p: p.read_bytes() for p in (tmp_path / "retrieval").rglob("*.parquet")}

    (tmp_path / "second.json").write_text(json.dumps([{"_id": "b", "question": "Who?"}]))
    second = load_config(None, [f"storage.root={tmp_path}", f"retrieve.questions={tmp_path / 'second.json'}"])
    with pytest.raises(FileNotFoundError, match="no BM25 index at .*xh retrieve index"):
        retrieve.run(second)
    (tmp_path / "index" / "bm25").mkdir(parents=True)
    (tmp_path / "index" / "bm25" / "manifest.json").write_text("{}")
    for setting, error in (
        ("reranker", "no re-ranker at .*no-reranker.*xh rerank"),
        ("path_scorer", "no path scorer at .*no-path_scorer.*xh retrieve paths"),
    ):
        missing = load_config(
            None,
            [
                f"storage.root={tmp_path}",
                f"retrieve.questions={tmp_path / 'second.json'}",
                f"retrieve.{setting}={tmp_path / f'no-{setting}'}",
            ],
        )
        with pytest.raises(FileNotFoundError, match=error):
            retrieve.run(missing)
    assert {p: p.read_bytes() for p in (tmp_path / "retrieval").rglob("*.parquet")} == before
