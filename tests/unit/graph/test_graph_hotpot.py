"""HotpotQA evidence graphs: node choice, edge modes and direction, labels, quarantine; the real sample."""

import json

import pytest

from xh.config import GraphsConfig, RetrieveConfig
from xh.graph.hotpot import (
    NO_ANSWER,
    NO_NODES,
    HotpotGraphBuilder,
    answer_char_spans,
    answer_type_of,
    distractor_graphs,
    distractor_items,
    make_edges,
    mention_links,
    read_distractor_questions,
    resolve_question_types,
    select_nodes,
)
from xh.wiki.titles import normalize_title

SAMPLE = "hotpotqa/hotpot_train_sample500.json"


def pairs(edges):
    return {(e["src"], e["dst"]) for e in edges}


def test_edge_modes_follow_table_4():
    links = [(0, 1), (1, 2), (0, 1), (2, 2)]  # a repeated link and a self-link
    assert pairs(make_edges(4, links, "hyperlink")) == {(0, 1), (1, 2)}
    assert pairs(make_edges(4, links, "bidirectional")) == {(0, 1), (1, 0), (1, 2), (2, 1)}
    full = pairs(make_edges(4, links, "full"))
    assert len(full) == 12 and all(s != d for s, d in full)

    seq = pairs(make_edges(6, [], "sequence", order_key="q1", seed=5))
    assert len(seq) == 10 and all((d, s) in seq for s, d in seq)  # a chain of 5 links, both ways
    degrees = sorted(sum(s == n for s, _ in seq) for n in range(6))
    assert degrees == [1, 1, 2, 2, 2, 2]  # two ends, the rest in the middle: one path through all nodes
    assert seq == pairs(make_edges(6, [], "sequence", order_key="q1", seed=5))  # deterministic
    orders = {frozenset(pairs(make_edges(6, [], "sequence", order_key=f"q{k}", seed=5))) for k in range(20)}
    assert len(orders) > 10  # the order is random per question
    with pytest.raises(ValueError, match="unknown edge mode"):
        make_edges(3, [], "star")


def test_answer_spans_are_every_whole_word_occurrence_case_insensitive():
    text = "The Art party: art deco, ART and\nNew  York art."
    assert [text[s["start"] : s["end"]] for s in answer_char_spans(text, "art")] == ["Art", "art", "ART", "art"]
    assert [text[s["start"] : s["end"]] for s in answer_char_spans(text, "new york")] == ["New  York"]
    assert answer_char_spans(text, "part") == [] and answer_char_spans(text, "  ") == []
    assert [answer_type_of(a) for a in ("Yes", "no ", "Norway", None)] == ["yes", "no", "span", None]


def test_question_type_from_data_then_classifier_then_default():
    questions = [{"question": "a", "type": "comparison"}, {"question": "b", "type": None}, {"question": "c"}]
    assert resolve_question_types(questions, None) == [
        ("comparison", "data"),
        ("bridge", "default"),
        ("bridge", "default"),
    ]
    seen = []

    def classify(texts):
        seen.extend(texts)
        return ["comparison"] * len(texts)

    assert resolve_question_types(questions, classify)[1:] == [("comparison", "classifier")] * 2
    assert seen == ["b", "c"]  # only questions without a type go to the classifier
    with pytest.raises(ValueError, match="classifier"):
        resolve_question_types(questions, lambda texts: ["other"] * len(texts))


def _cand(doc_id, source, rank, surface=None):
    return {"qid": "q", "doc_id": doc_id, "source": source, "score": 10.0 - rank, "rank": rank, "surface": surface}


def test_node_choice_ir_el_per_surface_expansion_and_first_source_wins():
    cands = [
        _cand("a", "ir", 0),
        _cand("b", "ir", 1),
        _cand("c", "ir", 2),
        _cand("b", "el", 0, "Bee"),
        _cand("d", "el", 1, "Bee"),
        _cand("e", "el", 2, "Eel"),
        *(_cand(f"x{k}", "exp", k) for k in range(20)),
        _cand("a", "exp", 20),
    ]
    bridge = select_nodes(cands, "bridge", RetrieveConfig())
    assert [n["doc_id"] for n in bridge] == ["a", "b", "e", *(f"x{k}" for k in range(15))]
    assert [n["source"] for n in bridge[:3]] == ["ir", "ir", "el"]  # b is ir and el: keeps ir
    comparison = select_nodes(cands, "comparison", RetrieveConfig())
    assert [n["doc_id"] for n in comparison] == ["a", "b", "e"]  # no expansion
    assert [n["doc_id"] for n in select_nodes(cands, "bridge", RetrieveConfig(el_per_surface=2, expansion_keep=0))] == [
        "a",
        "b",
        "d",
        "e",
    ]


def _builder(**settings):
    docs = {
        "A": ("Arden Works", ["Arden Works is a firm.", " It was founded by Bo Lind."]),
        "B": ("Bo Lind", ["Bo Lind was born in Parva.", " He founded Arden Works."]),
        "C": ("Parva", ["Parva is a city."]),
    }
    links = {"A": [("B", "Bo Lind", 1)], "B": [("C", "Parva", 0), ("A", "Arden Works", 1)]}
    return HotpotGraphBuilder(docs, links, GraphsConfig(**settings), RetrieveConfig())


def _question(qid="q", answer="Parva", qtype="bridge", facts=(("Bo Lind", 0),)):
    return {
        "qid": qid,
        "question": "Where was the founder of Arden Works born?",
        "answer": answer,
        "type": qtype,
        "level": None,
        "supporting_facts": [{"title": t, "sent": s} for t, s in facts],
    }


def test_hyperlinks_become_edges_from_linking_to_linked_page_with_anchors():
    cands = [_cand("A", "ir", 0), _cand("C", "ir", 1), _cand("B", "exp", 0)]
    outcome = _builder().build(_question(), cands)
    graph = outcome.graph
    assert [n["doc_id"] for n in graph["nodes"]] == ["A", "C", "B"]
    # A links to B, B to C and A: information flows along each link, into the page linked to
    assert pairs(graph["edges"]) == {(0, 2), (2, 1), (2, 0)} and graph["edge_mode"] == "hyperlink"
    assert [n["anchors"] for n in graph["nodes"]] == [["Arden Works"], ["Parva"], ["Bo Lind"]]
    assert graph["nodes"][1]["answer_spans"] == [{"start": 0, "end": 5}]
    assert graph["nodes"][2]["answer_spans"] == [{"start": 20, "end": 25}]
    assert [n["is_evidence"] for n in graph["nodes"]] == [False, False, True]
    assert graph["nodes"][2]["supporting_sentences"] == [0]
    assert graph["answer_type"] == "span" and graph["question_type_source"] == "data"

    both = _builder(edge_mode="bidirectional").build(_question(), cands).graph
    assert pairs(both["edges"]) == {(0, 2), (2, 0), (2, 1), (1, 2)}


def test_comparison_graphs_are_fully_connected_unless_told_otherwise():
    cands = [_cand("A", "ir", 0), _cand("C", "ir", 1), _cand("B", "exp", 0)]
    question = _question(answer="yes", qtype="comparison")
    graph = _builder().build(question, cands).graph
    assert [n["doc_id"] for n in graph["nodes"]] == ["A", "C"]  # no expansion
    assert graph["edge_mode"] == "full" and pairs(graph["edges"]) == {(0, 1), (1, 0)}
    assert graph["answer_type"] == "yes" and all(n["answer_spans"] == [] for n in graph["nodes"])
    same = _builder(comparison_full=False).build(question, cands).graph
    assert same["edge_mode"] == "hyperlink" and same["edges"] == []


def test_questions_without_answer_node_or_nodes_are_quarantined_with_the_reason():
    builder = _builder()
    questions = [_question("ok"), _question("miss", answer="Zyxx"), _question("none"), _question("new", answer=None)]
    cands = {"ok": [_cand("C", "ir", 0)], "miss": [_cand("C", "ir", 0)], "new": [_cand("A", "ir", 0)]}
    outcomes = builder.build_many(questions, cands)
    assert [o.reason for o in outcomes] == [None, NO_ANSWER, NO_NODES, None]
    assert outcomes[3].graph["nodes"][0]["answer_spans"] is None  # unknown answer: unknown spans, kept
    keep = _builder(require_answer=False).build(_question("miss", answer="Zyxx"), cands["miss"])
    assert keep.graph is not None and keep.graph["nodes"][0]["answer_spans"] == []


def test_bad_records_are_quarantined_with_reasons():
    good = {"_id": "g", "question": "Who?", "answer": "x", "context": [["T", ["x y."]]]}
    records = [
        good,
        {"_id": "n", "question": "Who?"},
        {"_id": "b", "question": "Who?", "context": [["T", "x"]]},
        {"_id": "e", "question": "Who?", "context": [["T", []]]},
        {"_id": "", "question": "Who?"},
        dict(good),
    ]
    items, quarantined = distractor_items(records, "f.json")
    assert [i.question["qid"] for i in items] == ["g"] and items[0].position == 1
    reasons = {q["position"]: q["reason"] for q in quarantined}
    assert reasons == {
        2: "invalid context: no context paragraphs",
        3: "invalid context: context paragraph \"['T', 'x']\" is not [title, [sentences]]",
        4: "invalid context: no context paragraphs with text",
        5: "missing id",
        6: "duplicate id",
    }
    assert len(items) + len(quarantined) == len(records)


def test_mentions_of_a_title_link_paragraphs():
    context = [
        ("Caliente (Inna song)", ['"Caliente" is a song by Inna.']),
        ("Inna", ["Inna is a singer."]),
        ("Party Never Ends", ["An album; a party never ends."]),
    ]
    links = mention_links(context)
    assert [(link.src, link.dst, link.anchor) for link in links] == [
        (0, 1, "Inna")
    ]  # case-sensitive: "party never ends" is no mention


@pytest.mark.shared_data
def test_real_sample_distractor_graphs(shared_data):
    records = json.loads((shared_data / SAMPLE).read_text())
    items, quarantined = read_distractor_questions(str(shared_data / SAMPLE))
    outcomes = distractor_graphs(items, GraphsConfig())
    graphs = [o.graph for o in outcomes if o.graph]
    assert len(records) == len(graphs) + len(quarantined) + sum(o.graph is None for o in outcomes)
    by_id = {r["_id"]: r for r in records}
    out_of_range = 0
    for graph in graphs:
        record = by_id[graph["qid"]]
        assert graph["question_type"] == record["type"] and graph["question_type_source"] == "data"
        assert len(graph["nodes"]) == len(record["context"])
        # supporting-fact labels point at the sentences the gold names, in the right paragraph; titles
        # stay as the record writes them ("Lawrence &amp; Gibson"), the gold's spelling
        labelled = {(n["title"], s) for n in graph["nodes"] for s in n["supporting_sentences"]}
        context = dict(record["context"])
        gold = {(t, s) for t, s in record["supporting_facts"]}
        assert {(f["title"], f["sent"]) for f in graph["supporting_facts"]} == gold
        in_range = {(t, s) for t, s in gold if s < len(context[t])}
        out_of_range += len(gold - in_range)
        assert labelled == in_range
        for node in graph["nodes"]:
            assert node["sentences"] == context[node["title"]] and node["doc_id"] == normalize_title(node["title"])
            assert node["is_evidence"] == (node["title"] in {t for t, _ in gold})
        # every edge is a mention of dst's title in src's paragraph
        for e in graph["edges"] if graph["edge_mode"] == "hyperlink" else ():
            src, dst = graph["nodes"][e["src"]], graph["nodes"][e["dst"]]
            assert any(a in "".join(src["sentences"]) for a in dst["anchors"])
        if record["type"] == "comparison":
            n = len(graph["nodes"])
            assert graph["edge_mode"] == "full" and len(graph["edges"]) == n * (n - 1)
    assert out_of_range == 5  # as the data's README says: 5 supporting facts point past their paragraph
    assert sum("supporting_fact_out_of_range" in o.flags for o in outcomes) == 5
