"""FEVER claims (xh.inputs.claims) and evidence graphs (xh.graph.fever).

Every test that builds graphs also checks the invariant the pipeline relies on:
claims in == graphs out + quarantined.
"""

from __future__ import annotations

import json
from collections import Counter

import pyarrow as pa
import pytest

from xh import schemas, synth
from xh.graph.fever import FeverGraphBuilder, FeverGraphSettings, build_fever_graphs, evidence_recall
from xh.inputs.claims import claim_rows, read_fever_claims
from xh.stages import wiki
from xh.storage.store import Store

pytestmark = pytest.mark.unit


def build(claims: list[dict], docs: pa.Table, **settings) -> tuple[list[dict], list[dict]]:
    graphs, quarantined = build_fever_graphs(claims, docs, FeverGraphSettings(**settings))
    assert len(graphs) + len(quarantined) == len(claims)
    pa.Table.from_pylist(graphs, schema=schemas.GRAPHS)  # rows fit the table they go to
    pa.Table.from_pylist(quarantined, schema=schemas.QUARANTINE)
    return graphs, quarantined


# --- the claims reader ---------------------------------------------------------------------------


@pytest.mark.shared_data
def test_reads_the_real_fever_slice(shared_data):
    path = shared_data / "fever" / "paper_dev_first3000.jsonl"
    rows, quarantined = read_fever_claims(str(path))
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    assert len(rows) + len(quarantined) == len(records) == 3000
    assert quarantined == []  # the official file is well formed
    assert Counter(r["label"] for r in rows) == Counter(r["label"] for r in records)
    pa.Table.from_pylist(rows, schema=schemas.CLAIMS)

    by_qid = {r["qid"]: r for r in rows}
    # five annotators chose the same sentence: one group
    assert by_qid["137334"]["evidence"] == [[{"page": "Soul_Food_-LRB-film-RRB-", "line": 0}]]
    # groups stay groups: a claim is verified by all sentences of one of them
    assert [{"page": "Telemundo", "line": 4}, {"page": "Hispanic_and_Latino_Americans", "line": 0}] in by_qid["111897"][
        "evidence"
    ]
    for row, record in zip(rows, records):
        gold = {(e[2], e[3]) for group in record["evidence"] for e in group if e[2] is not None}
        assert {(s["page"], s["line"]) for group in row["evidence"] for s in group} == gold
        assert (row["evidence"] == []) == (row["label"] == "NOT ENOUGH INFO")


def test_malformed_claims_are_quarantined_with_the_reason():
    good = {
        "id": 7,
        "claim": "Soul Food was released by Fox 2000 Pictures.",
        "label": "SUPPORTS",
        "evidence": [[[1, 2, "Soul_Food_-LRB-film-RRB-", 2]]],
    }
    lines = [
        json.dumps(good),
        "",  # blank: not a record
        '{"id": 8, "claim": "broken',
        json.dumps([1, 2]),
        json.dumps({"claim": "No id here.", "label": "SUPPORTS", "evidence": []}),
        json.dumps({**good, "id": 7}),
        json.dumps({"id": 9, "claim": "  ", "label": "SUPPORTS"}),
        json.dumps({"id": 10, "claim": "A claim.", "label": "MAYBE"}),
        json.dumps({"id": 11, "claim": "A claim.", "label": "SUPPORTS", "evidence": [[[1, 2, "Page"]]]}),
        json.dumps({"id": 12, "claim": "A claim.", "label": "SUPPORTS", "evidence": [[[1, None, None, None]]]}),
        json.dumps({"id": 13, "claim": "A claim.", "label": "REFUTES", "evidence": [[[1, 2, "Page", -1]]]}),
        json.dumps({"id": 14, "claim": "A claim.", "label": "NOT ENOUGH INFO", "evidence": [[[1, 2, "Page", 0]]]}),
        json.dumps(
            {
                "id": 15,
                "claim": "A claim.",
                "label": "SUPPORTS",
                "evidence": [[[1, 2, "Page", 0], [1, None, None, None]]],
            }
        ),
        json.dumps({"id": 16, "claim": "A new claim."}),  # no label, no evidence: a claim to verify
        json.dumps({"id": "17", "claim": "Unknown evidence.", "label": "REFUTES", "evidence": None}),
    ]
    data = "\n".join(lines).encode() + b"\n\xff\xfe not utf-8\n"
    rows, quarantined = claim_rows(data.split(b"\n"), "claims.jsonl")
    records = sum(1 for line in data.split(b"\n") if line.strip())
    assert len(rows) + len(quarantined) == records == 15

    reasons = {q["position"]: q["reason"] for q in quarantined}
    assert reasons[3].startswith("invalid json")
    assert reasons[4].startswith("invalid record")
    assert reasons[5] == "missing id"
    assert reasons[6] == "duplicate id: 7"
    assert reasons[7] == "missing claim"
    assert reasons[8] == "unknown label: 'MAYBE'"
    assert reasons[9].startswith("bad evidence: an entry is not")
    assert reasons[10] == "bad evidence: a SUPPORTS claim without evidence sentences"
    assert reasons[11].startswith("bad evidence: line -1")
    assert reasons[12] == "bad evidence: a NOT ENOUGH INFO claim with evidence sentences"
    assert reasons[13] == "bad evidence: a group mixes sentences and null entries"
    assert reasons[16].startswith("non-utf8 bytes")
    assert all(q["source"] == "claims.jsonl" and q["raw"] for q in quarantined)

    assert rows == [
        {
            "qid": "7",
            "claim": good["claim"],
            "label": "SUPPORTS",
            "evidence": [[{"page": "Soul_Food_-LRB-film-RRB-", "line": 2}]],
        },
        {"qid": "16", "claim": "A new claim.", "label": None, "evidence": None},
        {"qid": "17", "claim": "Unknown evidence.", "label": "REFUTES", "evidence": None},
    ]
    pa.Table.from_pylist(rows, schema=schemas.CLAIMS)
    pa.Table.from_pylist(quarantined, schema=schemas.QUARANTINE)


# --- graphs over a small hand-made corpus ---------------------------------------------------------

PAGES = {
    "Soul_Food_-LRB-film-RRB-": [
        "Soul Food is a 1997 American comedy-drama film.",
        "It was produced by Kenneth Edmonds.",
        "",
        "It was released by Fox 2000 Pictures.",
    ],
    "Fox_2000_Pictures": [
        "Fox 2000 Pictures is an American film production company.",
        "It is a division of 20th Century Studios.",
    ],
    "Telemundo": [
        "Telemundo is an American Spanish-language television network.",
        "It is owned by NBCUniversal.",
        "Its audience is Hispanic and Latino Americans.",
    ],
    "Hispanic_and_Latino_Americans": ["Hispanic and Latino Americans are Americans of Spanish descent."],
    "Soul_music": ["Soul music is a popular music genre.", "It originated in the United States."],
    "Kenneth_Edmonds": ["Kenneth Edmonds is an American singer and record producer."],
}


@pytest.fixture(scope="module")
def docs(fever_docs) -> pa.Table:
    """The pages through the real FEVER wiki-pages reader, as the wiki stage makes them."""
    return fever_docs(PAGES)


def claim(qid: str, text: str, label: str | None, *groups: list[tuple[str, int]]) -> dict:
    evidence = [[{"page": p, "line": line} for p, line in group] for group in groups]
    return {"qid": qid, "claim": text, "label": label, "evidence": evidence if label else None}


SOUL_FOOD = claim("1", "Soul Food was released by Fox 2000 Pictures.", "SUPPORTS", [("Soul_Food_-LRB-film-RRB-", 3)])
TELEMUNDO = claim(
    "2",
    "Telemundo is an English-language network for Hispanic and Latino Americans.",
    "REFUTES",
    [("Missing_page", 0)],
    [("Telemundo", 0), ("Hispanic_and_Latino_Americans", 0)],
    [("Telemundo", 2)],
)
UNVERIFIABLE = claim("3", "Kenneth Edmonds has a twin sibling.", "NOT ENOUGH INFO")


def test_gold_evidence_comes_first_with_its_lines(docs):
    graphs, quarantined = build([SOUL_FOOD, TELEMUNDO], docs, gold_evidence=True)
    assert quarantined == []
    soul, telemundo = graphs

    first = soul["nodes"][0]
    assert (first["doc_id"], first["line"], first["source"], first["is_evidence"]) == (
        "Soul_Food_-LRB-film-RRB-",
        3,
        "evidence",
        True,
    )
    assert first["sentences"] == ["It was released by Fox 2000 Pictures."]  # line 3, the empty line 2 counted
    assert first["title"] == "Soul Food (film)" and first["anchors"] == ["Soul Food (film)"]
    assert first["supporting_sentences"] == [0]
    assert [n["source"] for n in soul["nodes"][1:]] == ["retrieved"] * 4
    assert all(n["is_evidence"] is False and n["supporting_sentences"] == [] for n in soul["nodes"][1:])
    assert len({(n["doc_id"], n["line"]) for n in soul["nodes"]}) == 5

    # the first group is not in the corpus: the first complete one leads, then the other groups' sentences
    assert [(n["doc_id"], n["line"], n["source"]) for n in telemundo["nodes"][:3]] == [
        ("Telemundo", 0, "evidence"),
        ("Hispanic_and_Latino_Americans", 0, "evidence"),
        ("Telemundo", 2, "evidence"),
    ]
    assert telemundo["claim_label"] == "REFUTES" and telemundo["question"] == TELEMUNDO["claim"]
    assert {"title": "Telemundo", "sent": 2} in telemundo["supporting_facts"]
    assert {"title": "Missing page", "sent": 0} in telemundo["supporting_facts"]  # gold, whatever the corpus has


def test_retrieved_graphs_label_gold_sentences_they_find(docs):
    [soul], _ = build([SOUL_FOOD], docs)
    assert all(n["source"] == "retrieved" for n in soul["nodes"])
    scores = [n["score"] for n in soul["nodes"]]
    assert scores == sorted(scores, reverse=True)
    assert {(n["doc_id"], n["line"]) for n in soul["nodes"] if n["is_evidence"]} == {("Soul_Food_-LRB-film-RRB-", 3)}
    assert evidence_recall([soul], [SOUL_FOOD])["evidence_recall"] == 1.0


def test_not_enough_info_claims_get_retrieved_sentences(docs):
    [graph], quarantined = build([UNVERIFIABLE], docs, gold_evidence=True)
    assert quarantined == []
    assert graph["claim_label"] == "NOT ENOUGH INFO" and graph["supporting_facts"] == []
    assert all(n["source"] == "retrieved" and n["is_evidence"] is False for n in graph["nodes"])
    assert graph["nodes"][0]["doc_id"] == "Kenneth_Edmonds"  # its title is in the claim


def test_new_claims_have_unknown_labels(docs):
    new = claim("4", "Telemundo is owned by NBCUniversal.", None)
    [graph], _ = build([new], docs, gold_evidence=True)
    assert graph["claim_label"] is None and graph["supporting_facts"] is None
    assert all(n["is_evidence"] is None and n["supporting_sentences"] is None for n in graph["nodes"])
    assert (graph["nodes"][0]["doc_id"], graph["nodes"][0]["line"]) == ("Telemundo", 1)


def test_missing_gold_evidence_is_quarantined_only_for_training(docs):
    lost = claim(
        "5",
        "Soul Food was directed by George Tillman Jr.",
        "SUPPORTS",
        [("George_Tillman_Jr.", 0)],
        [("Soul_Food_-LRB-film-RRB-", 9)],
    )
    graphs, quarantined = build([lost, SOUL_FOOD], docs, gold_evidence=True)
    assert [g["qid"] for g in graphs] == ["1"]
    [q] = quarantined
    assert q["reason"] == "gold evidence missing from the corpus: page 'George_Tillman_Jr.' is not in the docs table"
    assert q["source"] == "graphs/fever" and q["position"] == 0 and json.loads(q["raw"])["qid"] == "5"

    graphs, quarantined = build([lost], docs)  # not training: built from retrieval, nothing is gold
    assert quarantined == [] and len(graphs[0]["nodes"]) == 5
    assert not any(n["is_evidence"] for n in graphs[0]["nodes"])


def test_a_claim_with_nothing_to_retrieve_is_quarantined(docs):
    empty = claim("6", "It was what it is.", None)
    graphs, quarantined = build([empty, UNVERIFIABLE], docs)
    assert [g["qid"] for g in graphs] == ["3"]
    assert quarantined[0]["reason"] == "no evidence sentences: only stop words in the query"


def test_nodes_are_fully_connected_without_self_loops(docs):
    graphs, _ = build([SOUL_FOOD, TELEMUNDO, UNVERIFIABLE], docs, max_nodes=4)
    for graph in graphs:
        n = len(graph["nodes"])
        assert n == 4 and graph["edge_mode"] == "full" and graph["task"] == "fever"
        pairs = [(e["src"], e["dst"]) for e in graph["edges"]]
        assert len(pairs) == len(set(pairs)) == n * (n - 1)
        assert set(pairs) == {(i, j) for i in range(n) for j in range(n) if i != j}


def test_a_builder_serves_many_batches_with_positions(docs):
    builder = FeverGraphBuilder(docs, FeverGraphSettings(gold_evidence=True))
    lost = claim("7", "Soul Food was released in 1997.", "SUPPORTS", [("Nowhere", 0)])
    graphs, quarantined = builder.build([SOUL_FOOD, lost], positions=[100, 101])
    assert [g["qid"] for g in graphs] == ["1"] and quarantined[0]["position"] == 101
    assert builder.build([SOUL_FOOD])[0] == graphs  # the same claim, the same graph


# --- a generated world, through the real wiki stage ------------------------------------------------


@pytest.fixture(scope="module")
def fever_world(tmp_path_factory) -> tuple[pa.Table, list[dict]]:
    """A 400-page generated world's FEVER pages processed into a docs table, and its 90 claims."""
    import pyarrow.parquet as pq

    tmp = tmp_path_factory.mktemp("fever-world")
    spec = synth.WorldSpec(num_docs=400, seed=5)
    synth.write_world(spec, synth.output_under(str(tmp / "world")), docs_per_shard=200, num_questions=10, num_claims=90)
    pages = Store().at(str(tmp / "world" / "fever" / "wiki-pages"))
    wiki.write_tables(Store().at(str(tmp / "tables")), [pages], "fever", partitions=2, local=True)
    claims, bad = read_fever_claims(str(tmp / "world" / "fever" / "claims.jsonl"))
    assert bad == []
    return pq.read_table(tmp / "tables" / "docs", schema=schemas.DOCS), claims


def test_generated_world_graphs(fever_world):
    docs, claims = fever_world
    sentences = {d["doc_id"]: d["sentences"] for d in docs.to_pylist()}
    labels = Counter(c["label"] for c in claims)
    assert labels["NOT ENOUGH INFO"] and labels["SUPPORTS"] and labels["REFUTES"]

    training, quarantined = build(claims, docs, gold_evidence=True)
    assert quarantined == []  # every page a claim names is in the world
    by_qid = {c["qid"]: c for c in claims}
    for graph in training:
        c = by_qid[graph["qid"]]
        nodes = graph["nodes"]
        assert 1 <= len(nodes) <= 5
        for n in nodes:  # a node is its page's sentence at its line
            assert n["sentences"] == [sentences[n["doc_id"]][n["line"]].strip()]
        if c["label"] == "NOT ENOUGH INFO":
            assert all(n["source"] == "retrieved" and not n["is_evidence"] for n in nodes)
        else:
            group = [(s["page"], s["line"]) for s in c["evidence"][0]]
            assert [(n["doc_id"], n["line"]) for n in nodes[: len(group)]] == group
            assert all(n["source"] == "evidence" and n["is_evidence"] for n in nodes[: len(group)])

    retrieved, quarantined = build(claims, docs)
    assert quarantined == []
    assert all(n["source"] == "retrieved" for g in retrieved for n in g["nodes"])
    report = evidence_recall(retrieved, claims)
    assert report["verifiable_claims"] == labels["SUPPORTS"] + labels["REFUTES"]
    assert report["evidence_recall"] >= 0.9, report  # measured 0.97-0.98 on 2,000- and 20,000-page worlds
    assert evidence_recall(training, claims)["evidence_recall"] == 1.0


def test_encode_reads_fever_graphs_unchanged(docs, minilm_path):
    from transformers import AutoTokenizer

    from xh.graph.encode import encode_graph
    from xh.graph.encoded import CLAIM_LABELS

    tokenizer = AutoTokenizer.from_pretrained(minilm_path)
    [graph], _ = build([SOUL_FOOD], docs, gold_evidence=True)
    encoded = encode_graph(graph, tokenizer, max_node_tokens=128)
    assert tokenizer.decode(encoded.input_ids[0]) == (
        "[CLS] soul food was released by fox 2000 pictures. [SEP] soul food ( film ) [SEP] "
        "it was released by fox 2000 pictures. [SEP]"
    )
    assert encoded.claim_label == CLAIM_LABELS.index("SUPPORTS")
    assert encoded.node_relevance.tolist() == [1, 0, 0, 0, 0]
    assert encoded.node_lines.tolist() == [n["line"] for n in graph["nodes"]]
    assert len(encoded.edges) == 20
