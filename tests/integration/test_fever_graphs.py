"""FEVER graphs on the Ray cluster: `workflows.graphs` with graphs.task=fever over a generated world."""

import json

import pyarrow.dataset as pads
import pytest

from workflows import graphs
from xh import synth
from xh.config import load_config
from xh.graph import store
from xh.stages import wiki
from xh.storage.store import Store


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A 600-page world's FEVER pages as docs, and its claims plus three bad lines."""
    root = tmp_path_factory.mktemp("fever-graphs")
    spec = synth.WorldSpec(num_docs=600, seed=21)
    synth.write_world(
        spec, synth.output_under(str(root / "world")), docs_per_shard=300, num_questions=10, num_claims=90
    )
    wiki.write_tables(
        Store().at(str(root / "tables")),
        [Store().at(str(root / "world" / "fever" / "wiki-pages"))],
        "fever",
        partitions=2,
        local=True,
    )
    claims = (root / "world" / "fever" / "claims.jsonl").read_text().splitlines()
    claims += [
        '{"id": 9001, "claim": "broken',
        json.dumps(
            {
                "id": 9002,
                "claim": "Nowhere Town was founded in 1800.",
                "label": "SUPPORTS",
                "evidence": [[[1, 2, "Nowhere_Town", 0]]],
            }
        ),
        json.dumps(
            {
                "id": 9003,
                "claim": "It is what it was.",
                "label": "NOT ENOUGH INFO",
                "evidence": [[[1, None, None, None]]],
            }
        ),
    ]
    (root / "claims.jsonl").write_text("\n".join(claims) + "\n")
    return root


def test_fever_graphs_on_ray(ray_cluster, world, minilm_path):
    overrides = [
        f"storage.root={world}",
        "graphs.task=fever",
        f"graphs.questions={world / 'claims.jsonl'}",
        "graphs.questions_per_file=40",
        "graphs.workers=2",
        f"graphs.tokenizer={minilm_path}",
    ]
    summary = graphs.build(load_config(None, overrides))
    assert summary["questions"] == 93 == summary["graphs"] + summary["quarantined"]
    reasons = summary["quarantine_reasons"]
    assert reasons == {
        "invalid json: Unterminated string starting at": 1,
        "gold evidence missing from the corpus: page 'Nowhere_Town' is not in the docs table": 1,
        "no evidence sentences: only stop words in the query": 1,
    }, reasons
    flags = summary["flags"]
    assert flags["fever_verifiable"] == 60 and flags["fever_gold_group_in_graph"] == 60  # training graphs: gold first
    assert summary["nodes_per_graph"]["max"] == 5
    tokens = summary["tokens_per_node"]
    assert 8 < tokens["mean"] < 64 and summary["nodes_at_token_limit"] == 0

    built = list(store.iter_graphs(summary["output"]))
    assert len(built) == 90 and {g["edge_mode"] for g in built} == {"full"}
    quarantined = pads.dataset(summary["quarantine"], format="parquet").to_table().to_pylist()
    assert sorted(q["position"] for q in quarantined) == [91, 91, 92]  # reader line 91; graph items 91 and 92

    # evaluation graphs: retrieval only; the claim without gold in the corpus is graphed too
    summary = graphs.build(load_config(None, [*overrides, "graphs.require_answer=false"]))
    assert summary["graphs"] == 91 and summary["quarantined"] == 2
    assert summary["flags"]["fever_gold_group_in_graph"] >= 0.9 * summary["flags"]["fever_verifiable"]


@pytest.mark.timeout(900)  # four Ray stages and a Ray Train run; on a loaded 2-core machine they take minutes
def test_fever_train_promote_batch_score_and_the_official_score(
    ray_cluster, world, tiny_backbone, mlflow_server, s3_endpoint, tmp_path
):
    """Held-out splits built apart; a FEVER run whose dev evaluation is the official scorer on the files it
    logs; promotion gated on the FEVER score; batch scoring whose output `xh eval fever` scores the same."""
    import uuid

    import mlflow
    from typer.testing import CliRunner

    from workflows import promote, score, train
    from workflows.cli import app
    from xh.eval.fever import evaluate_fever_files
    from xh.inputs.claims import write_claim_split
    from xh.registry.champion import promote as registry_promote

    claims = world / "world" / "fever" / "claims.jsonl"  # the generated claims only: every one gets a graph
    fractions = ["graphs.dev_fraction=0.3", "graphs.test_fraction=0.3"]
    base = [f"storage.root={tmp_path}", f"graphs.tables={world / 'tables'}", "graphs.task=fever", "graphs.workers=1"]
    built = {
        split: graphs.build(
            load_config(None, [*base, *fractions, f"graphs.questions={claims}", f"graphs.claims_split={split}"])
        )
        for split in ("train", "dev", "test")
    }
    assert sum(s["graphs"] for s in built.values()) == 90 and built["test"]["output"].endswith("fever-test")

    name = f"xh-fever-{uuid.uuid4().hex[:6]}"
    summary = train.run(
        load_config(
            None,
            [
                f"storage.root={tmp_path}",
                f"ray.address={ray_cluster.address}",
                f"mlflow.tracking_uri={mlflow_server}",
                "mlflow.experiment=fever-e2e",
                f"model.backbone={tiny_backbone}",
                "model.task=fever",
                "model.max_node_tokens=64",
                "train.batch_graphs=4",
                "train.max_steps=2",
                "train.cpus_per_worker=0.5",
                "train.attention_figures=false",
                f"train.run_name={name}",
                f"train.register_as={name}",
            ],
        )
    )
    assert summary["dev_graphs"] == built["dev"]["graphs"]  # the held-out build, not a split of gold-first graphs
    client = mlflow.MlflowClient(mlflow_server)
    run = client.get_run(summary["mlflow_run_id"])
    for key in ("fever_score", "label_accuracy", "evidence_precision", "evidence_recall", "evidence_f1"):
        assert f"dev_{key}" in run.data.metrics, key
    assert {"dev_single_evidence_fever_score", "dev_nei_label_accuracy"} <= set(run.data.metrics)
    files = mlflow.artifacts.download_artifacts(run_id=run.info.run_id, artifact_path="dev", tracking_uri=mlflow_server)
    pred = f"{files}/predictions-{summary['step']}.jsonl"
    result = CliRunner().invoke(app, ["eval", "fever", "--gold", f"{files}/gold.jsonl", "--pred", pred])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["fever_score"] == pytest.approx(run.data.metrics["dev_fever_score"], abs=1e-12)

    # promotion gates on the FEVER score of the retrieval-only test graphs
    gate = [
        f"storage.root={tmp_path}",
        f"mlflow.tracking_uri={mlflow_server}",
        f"promote.model={name}",
        f"promote.eval_set={built['test']['output']}",
        "promote.metric=fever_score",
    ]
    first = promote.run(load_config(None, [*gate, "promote.floor=100"]))  # no model reaches 100 points
    assert not first["promoted"] and first["metric"] == "fever_score" and "floor 100" in first["reason"]
    rows = store.iter_graphs(built["test"]["output"])
    just_above = registry_promote(
        name, list(rows), metric="fever_score", floor=first["challenger_score"] + 0.01, task="fever"
    )
    assert not just_above["promoted"]
    rows = list(store.iter_graphs(built["test"]["output"]))
    at = registry_promote(name, rows, metric="fever_score", floor=first["challenger_score"] - 1e-6, task="fever")
    assert at["promoted"] and at["challenger_score"] == first["challenger_score"]
    assert client.get_model_version_by_alias(name, "champion").version == "1"

    # batch scoring of the test claims as new ones; `xh eval fever` on its output table
    gold = str(tmp_path / "test-gold.jsonl")
    write_claim_split(str(claims), "test", gold, 0.3, 0.3)
    write_claim_split(str(claims), "test", str(tmp_path / "incoming" / "claims.jsonl"), 0.3, 0.3, labels=False)
    scored = score.run(
        load_config(
            None,
            [
                f"storage.root={tmp_path}",
                f"retrieve.tables={world / 'tables'}",
                f"mlflow.tracking_uri={mlflow_server}",
                "graphs.task=fever",
                f"score.input={tmp_path / 'incoming'}",
                f"score.model=models:/{name}@champion",
                "score.run_date=2026-11-25",
            ],
        )
    )
    assert scored["predictions"] == built["test"]["graphs"] and scored["records"] == scored["predictions"]
    official = evaluate_fever_files(gold, scored["output"])
    assert 100 * official["fever_score"] == pytest.approx(first["challenger_score"], abs=1e-9)
