"""Graph building on the Ray cluster: retrieval -> graphs of a generated world, tracked in MLflow."""

import json
import uuid
from collections import Counter

import pyarrow.dataset as pads
import pytest

from workflows import graphs, retrieve
from xh import synth
from xh.config import load_config
from xh.graph.hotpot import NO_ANSWER
from xh.graph.store import iter_graphs, read_graphs
from xh.stages import graphs as graph_stage
from xh.stages import wiki
from xh.storage.store import Store


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("graphs")
    synth.write_world(
        synth.WorldSpec(num_docs=800, seed=5),
        synth.output_under(str(root / "world")),
        docs_per_shard=400,
        num_questions=60,
        num_claims=5,
    )
    questions = json.loads((root / "world" / "hotpot" / "questions.json").read_text())
    questions += [
        {**questions[0], "_id": "no-answer", "answer": "Zyxxqv Plorbt"},  # retrieval finds the docs, not this answer
        {"_id": "untyped", "question": questions[1]["question"], "answer": "yes"},  # yes/no: never short of an answer
    ]
    (root / "questions.json").write_text(json.dumps(questions))
    wiki.write_tables(
        Store().at(str(root / "tables")), [Store().at(str(root / "world" / "wiki"))], "hotpot", partitions=2, local=True
    )
    return root


def _config(world, mlflow_server, *overrides):
    return load_config(
        None,
        [
            f"storage.root={world}",
            f"retrieve.questions={world / 'questions.json'}",
            "retrieve.shards=2",
            f"mlflow.tracking_uri={mlflow_server}",
            f"mlflow.experiment=graphs-{uuid.uuid4().hex[:6]}",
            "mlflow.artifact_location=null",
            "graphs.questions_per_file=16",
            *overrides,
        ],
    )


def test_graphs_of_retrieved_documents(ray_cluster, mlflow_server, world, minilm_path):
    import mlflow

    cfg = _config(world, mlflow_server, f"graphs.tokenizer={minilm_path}", "graphs.max_node_tokens=128")
    retrieve.all_steps(cfg)
    summary = graphs.run(cfg)

    questions = pads.dataset(str(world / "retrieval" / "questions")).to_table().to_pylist()
    assert summary["questions"] == len(questions) == 62
    assert summary["questions"] == summary["graphs"] + summary["quarantined"]
    assert summary["quarantine_reasons"].get(NO_ANSWER, 0) >= 1
    assert summary["answer_recall"] >= 0.8 and summary["flags"]["question_type_default"] == 1
    assert summary["tokens_per_node"]["max"] <= 128 and summary["nodes_per_graph"]["max"] <= 2 + 15 + 10

    # the quarantine table holds every question without a graph, with its reason
    quarantine = pads.dataset(summary["quarantine"]).to_table().to_pylist()
    assert Counter(q["reason"] for q in quarantine) == Counter(summary["quarantine_reasons"])
    assert "no-answer" in {json.loads(q["raw"])["qid"] for q in quarantine}

    # read back two ways: a Ray dataset for the trainer, an iterator without Ray
    built = {g["qid"]: g for g in iter_graphs(summary["output"])}
    assert read_graphs(summary["output"]).count() == len(built) == summary["graphs"]
    assert len(list((world / "graphs" / "hotpot").glob("part-*.parquet"))) == 4  # 62 questions / 16 per file

    candidates = pads.dataset(str(world / "retrieval" / "candidates")).to_table().to_pylist()
    links = pads.dataset(str(world / "tables" / "links")).to_table(columns=["src_doc_id", "target_doc_id"])
    link_pairs = set(zip(links["src_doc_id"].to_pylist(), links["target_doc_id"].to_pylist()))
    by_qid = {}
    for c in candidates:
        by_qid.setdefault(c["qid"], {}).setdefault(c["doc_id"], []).append(c["source"])
    for qid, graph in built.items():
        ids = [n["doc_id"] for n in graph["nodes"]]
        assert len(ids) == len(set(ids)) and set(ids) <= set(by_qid[qid])
        assert all(n["source"] in by_qid[qid][n["doc_id"]] for n in graph["nodes"])
        if graph["question_type"] == "comparison":
            assert graph["edge_mode"] == "full" and len(graph["edges"]) == len(ids) * (len(ids) - 1)
            assert all(n["source"] != "exp" for n in graph["nodes"])
        else:  # each edge is a hyperlink from the src page to the dst page
            assert graph["edge_mode"] == "hyperlink"
            assert all((ids[e["src"]], ids[e["dst"]]) in link_pairs for e in graph["edges"])
    assert built["untyped"]["question_type_source"] == "default"

    run = mlflow.MlflowClient(mlflow_server).get_run(summary["mlflow_run_id"])
    assert run.data.metrics["graphs"] == summary["graphs"] and run.data.params["graphs.edge_mode"] == "hyperlink"

    # a rebuild in another edge mode replaces every shard: node sequence, a chain through all nodes
    again = graphs.build(
        cfg.model_copy(
            update={
                "graphs": cfg.graphs.model_copy(
                    update={"edge_mode": "sequence", "questions_per_file": 40, "tokenizer": None}
                )
            }
        )
    )
    assert again["graphs"] == summary["graphs"] and again["tokens_per_node"] is None
    assert len(list((world / "graphs" / "hotpot").glob("part-*.parquet"))) == 2
    for graph in iter_graphs(again["output"]):
        n = len(graph["nodes"])
        if graph["question_type"] == "bridge":
            assert graph["edge_mode"] == "sequence" and len(graph["edges"]) == 2 * (n - 1)


def _files(folder):
    return {p.relative_to(folder): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_a_build_or_retrieval_run_that_fails_midway_leaves_the_previous_tables(
    ray_cluster, mlflow_server, world, monkeypatch
):
    from xh.stages import retrieve as retrieve_stage
    from xh.storage.store import located
    from xh.storage.tables import IncompleteTableError, read_marker

    cfg = _config(world, mlflow_server)
    if read_marker(located(world / "graphs" / "hotpot")) is None:
        retrieve.all_steps(cfg)
        graphs.build(cfg)
    before = {name: _files(world / name) for name in ("graphs", "retrieval")}
    assert read_marker(located(world / "graphs" / "hotpot"))["rows"] > 0

    def fails(*args, **kwargs):
        raise RuntimeError("interrupted midway")

    # graphs: every shard is written (to the staging folder), then the run fails
    monkeypatch.setattr(graph_stage, "summarize", fails)
    with pytest.raises(RuntimeError, match="interrupted midway"):
        graphs.build(cfg)
    # retrieval: the new questions are written, then the candidates fail
    monkeypatch.setattr(retrieve_stage, "candidates", fails)
    with pytest.raises(RuntimeError, match="interrupted midway"):
        retrieve.run(cfg)
    assert {name: _files(world / name) for name in ("graphs", "retrieval")} == before
    assert not [p for p in world.rglob("*.staging")]

    # a retrieval folder without its marker (an older or interrupted run) is refused by graphs, in one line
    (world / "retrieval" / "_complete.json").rename(world / "complete.bak")
    try:
        with pytest.raises(IncompleteTableError, match=r"^retrieval output at .* is incomplete .*xh retrieve run"):
            graphs.build(cfg)
    finally:
        (world / "complete.bak").rename(world / "retrieval" / "_complete.json")


def test_graphs_output_pointing_at_a_user_folder_is_refused_and_left_alone(ray_cluster, mlflow_server, world, tmp_path):
    from xh.storage.tables import ForeignFolderError

    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("mine")
    cfg = _config(world, mlflow_server, f"graphs.quarantine={tmp_path / 'mine'}")
    with pytest.raises(ForeignFolderError, match="refusing to delete"):
        graphs.build(cfg)
    assert _files(tmp_path / "mine") == {__import__("pathlib").Path("notes.txt"): b"mine"}
