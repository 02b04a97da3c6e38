"""The generated mini-Wikipedia (xh.synth): deterministic, unique titles, faithful formats, sound questions."""

from __future__ import annotations

import bz2
import collections
import json
import re
import urllib.parse
from pathlib import Path

import pytest

from xh import synth
from xh.synth.layout import _MAX_ROUNDS, _layout
from xh.synth.names import _name_in_pool

pytestmark = pytest.mark.unit

SMALL = synth.WorldSpec(num_docs=500, seed=7)
LINK = re.compile(r'<a href="([^"]*)">([^<]*)</a>')


def open_under(root: Path):
    """The `open_output` a caller supplies: files under a local folder."""

    def open_output(relative_path: str):
        path = root / relative_path
        path.parent.mkdir(parents=True, exist_ok=True)
        return open(path, "wb")

    return open_output


def read_jsonl_bz2(path: Path) -> list[dict]:
    with bz2.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A 500-page world written to disk, read back with plain bz2 + json."""
    root = tmp_path_factory.mktemp("world")
    summary = synth.write_world(SMALL, open_under(root), docs_per_shard=120, num_questions=120, num_claims=150)
    records = []
    for relative in summary.paths["wiki"]:
        records.extend(read_jsonl_bz2(root / relative))
    by_title = {r["title"]: r for r in records}
    return {
        "root": root,
        "summary": summary,
        "records": records,
        "by_title": by_title,
        "links": [row for relative in summary.paths["links"] for row in read_jsonl_bz2(root / relative)],
        "questions": json.loads((root / summary.paths["questions"]).read_text()),
        "claims": [json.loads(line) for line in (root / summary.paths["claims"]).read_text().splitlines()],
        "fever_pages": [
            json.loads(line)
            for relative in summary.paths["fever_pages"]
            for line in (root / relative).read_text().splitlines()
        ],
    }


# --- the spec -------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [0, 19, -5, 5_500_001, 10**9])
def test_num_docs_out_of_range_is_a_clear_value_error(bad):
    assert synth.MAX_DOCS == 5_500_000  # HotpotQA's 5.23M abstracts fit
    with pytest.raises(ValueError, match=r"between 20 and 5,500,000"):
        synth.WorldSpec(num_docs=bad)


def test_num_docs_must_be_an_int():
    with pytest.raises(ValueError, match="int"):
        synth.WorldSpec(num_docs=500.0)


def test_extreme_sizes_build():
    for n in (20, 1_000_000, 5_230_000, synth.MAX_DOCS):
        spec = synth.WorldSpec(num_docs=n)
        counts = synth.kind_counts(spec)
        assert sum(counts.values()) == n and all(counts.values())
        for i in (0, n // 2, n - 1):
            p = synth.page(spec, i)
            assert p.title == synth.title(spec, i) and 2 <= len(p.sentences) <= 5
    with pytest.raises(IndexError):
        synth.page(synth.WorldSpec(num_docs=20), 20)


# --- determinism and independence -------------------------------------------------------------


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_same_seed_gives_identical_bytes_and_another_seed_does_not(tmp_path):
    spec = synth.WorldSpec(num_docs=90, seed=5)
    synth.write_world(spec, open_under(tmp_path / "a"), docs_per_shard=40, num_questions=12, num_claims=12)
    synth.write_world(spec, open_under(tmp_path / "b"), docs_per_shard=40, num_questions=12, num_claims=12)
    synth.write_world(
        synth.WorldSpec(num_docs=90, seed=6),
        open_under(tmp_path / "c"),
        docs_per_shard=40,
        num_questions=12,
        num_claims=12,
    )
    a, b, c = (_files(tmp_path / x) for x in "abc")
    assert a == b
    assert a.keys() == c.keys()
    assert a["wiki/AA/wiki_00.bz2"] != c["wiki/AA/wiki_00.bz2"]
    assert a["hotpot/questions.json"] != c["hotpot/questions.json"]
    titles_5 = {synth.title(spec, i) for i in range(90)}
    titles_6 = {synth.title(synth.WorldSpec(num_docs=90, seed=6), i) for i in range(90)}
    assert titles_5 != titles_6


def test_a_page_depends_only_on_seed_and_index():
    spec = synth.WorldSpec(num_docs=5_000, seed=3)
    streamed = {p.index: p for p in synth.iter_pages(spec, 4_000, 4_050)}
    for i in reversed(range(4_000, 4_050)):  # any order, any slice: the same pages
        assert synth.page(spec, i) == streamed[i]
    # link targets are page indices of the same world, named without generating those pages
    for p in streamed.values():
        for link in p.links:
            assert synth.title(spec, link.target_index) == link.target_title


# --- names --------------------------------------------------------------------------------------


def test_titles_are_unique_at_200k_documents():
    spec = synth.WorldSpec(num_docs=200_000, seed=13)
    titles = [synth.title(spec, i) for i in range(spec.num_docs)]
    assert len(set(titles)) == len(titles)


@pytest.mark.parametrize("num_docs", [1_000_000, synth.MAX_DOCS])
def test_plain_names_of_different_sorts_never_collide(num_docs):
    """Round-0 names of every name pool, at the largest sizes: only deliberate reuse may repeat."""
    layout = _layout(synth.WorldSpec(num_docs=num_docs))
    pools = [
        layout.persons,
        layout.cities,
        layout.universities,
        layout.companies,
        layout.phrase_films,
        layout.phrase_bands,
    ]
    seen: dict[str, str] = {}
    for pool in pools:
        for base in range(pool.size):
            m = pool.holder(base, 0)
            if m is None:  # no entity of this world holds that name
                continue
            name = _name_in_pool(layout, pool, m)
            assert name.title == name.base  # round 0: no disambiguator
            assert seen.setdefault(name.title, pool.style) == pool.style, name.title
        assert pool.rounds <= _MAX_ROUNDS[pool.style]


def test_world_is_full_of_look_alikes():
    spec = synth.WorldSpec(num_docs=3_000, seed=13)
    pages = list(synth.iter_pages(spec))
    people = [p for p in pages if p.kind == synth.PERSON]
    surnames = collections.Counter(p.attributes["surname"] for p in people)
    birthplaces = collections.Counter(p.attributes["birthplace"] for p in people)
    years = collections.Counter(p.attributes["birth_year"] for p in people)
    assert surnames.most_common(1)[0][1] >= 5
    assert birthplaces.most_common(1)[0][1] >= 30  # a few cities are the birthplace of many
    assert years.most_common(1)[0][1] >= 10
    titles = {p.title for p in pages}
    assert sum(t.startswith("Port ") for t in titles) >= 10
    # films and bands named after a city of the world, with a disambiguator
    city_bases = {p.base_name for p in pages if p.kind == synth.CITY}
    reused = [p for p in pages if p.kind in (synth.FILM, synth.BAND) and p.base_name in city_bases]
    assert reused and all(p.title != p.base_name for p in reused)
    # anchors: sometimes the title, sometimes shorter; one surface form for several pages
    links = [link for p in pages for link in p.links]
    assert any(link.anchor == link.target_title for link in links)
    assert sum(link.anchor != link.target_title for link in links) > len(links) // 10
    targets_by_anchor = collections.defaultdict(set)
    for link in links:
        targets_by_anchor[link.anchor].add(link.target_title)
    assert sum(len(t) > 1 for t in targets_by_anchor.values()) >= 20


# --- the written world ----------------------------------------------------------------------------


def test_layout_and_summary(world):
    root, summary = world["root"], world["summary"]
    assert summary.num_docs == 500 and summary.num_shards == 5
    assert summary.paths["wiki"] == [f"wiki/AA/wiki_0{k}.bz2" for k in range(5)]
    assert summary.paths["fever_pages"] == [f"fever/wiki-pages/wiki-00{k}.jsonl" for k in range(5)]
    assert json.loads((root / "truth/summary.json").read_text()) == json.loads(summary.to_json())
    assert summary.num_links == len(world["links"])
    assert summary.num_questions["total"] == len(world["questions"])
    assert summary.num_claims["total"] == len(world["claims"])
    assert synth.wiki_shard_path(100) == "wiki/AB/wiki_00.bz2"


def test_pages_in_hotpotqa_format(world):
    records = world["records"]
    assert len(records) == 500 and len(world["by_title"]) == 500
    assert [r["id"] for r in records] == [str(i + 1) for i in range(500)]
    assert collections.Counter(synth.kind_of(i) for i in range(500)) == synth.kind_counts(SMALL)
    for r in records:
        assert set(r) == {"id", "url", "title", "text", "text_with_links", "charoffset", "charoffset_with_links"}
        assert r["url"] == f"https://en.wikipedia.org/wiki?curid={r['id']}"
        text = r["text"]
        assert 2 <= len(text) <= 5
        assert not text[0].startswith(" ") and all(s.startswith(" ") for s in text[1:])
        assert [synth.strip_links(s) for s in r["text_with_links"]] == text
        for sentences, offsets in ((text, r["charoffset"]), (r["text_with_links"], r["charoffset_with_links"])):
            paragraph = "".join(sentences)
            assert len(offsets) == len(sentences)
            start = 0
            for sentence, spans in zip(sentences, offsets):
                end = start + len(sentence)
                assert all(start <= a < b <= end for a, b in spans)
                assert all(a >= b_prev for (a, _), (_, b_prev) in zip(spans[1:], spans))  # in order
                covered = {k for a, b in spans for k in range(a, b)}
                assert all(k in covered for k in range(start, end) if not paragraph[k].isspace())
                assert all(not paragraph[a].isspace() and not paragraph[b - 1].isspace() for a, b in spans)
                start = end
        assert r == json.loads(json.dumps(synth.hotpot_record(synth.page(SMALL, int(r["id"]) - 1))))


def test_every_ground_truth_link_is_in_the_text(world):
    by_title = world["by_title"]
    expected = collections.Counter()
    for row in world["links"]:
        assert set(row) == {"source", "target", "anchor", "sentence"}
        sentence = by_title[row["source"]]["text_with_links"][row["sentence"]]
        assert f'<a href="{urllib.parse.quote(row["target"])}">{row["anchor"]}</a>' in sentence
        assert row["target"] in by_title  # no dangling links
        expected[row["source"], row["sentence"], row["target"], row["anchor"]] += 1
    found = collections.Counter()
    for r in world["records"]:
        for k, sentence in enumerate(r["text_with_links"]):
            for href, anchor in LINK.findall(sentence):
                found[r["title"], k, urllib.parse.unquote(href), anchor] += 1
    assert found == expected
    assert len(world["links"]) >= 1.5 * 500


def test_questions(world):
    by_title, questions = world["by_title"], world["questions"]
    assert len(questions) == 120
    assert len({q["_id"] for q in questions}) == len(questions)
    types = collections.Counter(q["type"] for q in questions)
    assert types["bridge"] == 96 and types["comparison"] == 24
    yes_no = collections.Counter(q["answer"] for q in questions if q["answer"] in ("yes", "no"))
    assert yes_no["yes"] >= 3 and abs(yes_no["yes"] - yes_no["no"]) <= 1
    for q in questions:
        assert set(q) == {"_id", "question", "answer", "supporting_facts", "context", "type", "level"}
        assert q["level"] in ("easy", "medium", "hard")
        context = dict((title, sentences) for title, sentences in q["context"])
        assert len(q["context"]) == 10 == len(context)
        facts = q["supporting_facts"]
        assert len(facts) == 2 and len({t for t, _ in facts}) == 2
        for title, k in facts:
            assert title in context  # the gold paragraphs are in the distractor context
            assert context[title] == by_title[title]["text"]
            assert 0 <= k < len(context[title])
        (first, first_k), (second, second_k) = facts
        answer = q["answer"]
        if q["type"] == "bridge":
            assert answer in by_title[second]["text"][second_k]
            assert answer not in "".join(by_title[first]["text"])  # needs the second hop
            hrefs = [urllib.parse.unquote(h) for h, _ in LINK.findall(by_title[first]["text_with_links"][first_k])]
            assert second in hrefs  # the first-hop sentence links to the answer's page
        elif answer in ("yes", "no"):
            assert q["question"].startswith(("Were ", "Are "))
        else:  # which of two: the answer is one of the two names asked about
            a, b = re.search(r", (.+) or (.+)\?$", q["question"]).groups()
            assert answer in (a, b) and a != b
            assert a in first or a in second and b in first or b in second


def test_which_of_two_has_no_ties(world):
    by_title = world["by_title"]
    fact_of = {"released": "release_year", "formed": "formation_year", "born": "birth_year", "founded": "founding_year"}
    checked = 0
    for q in world["questions"]:
        if q["type"] != "comparison" or q["answer"] in ("yes", "no"):
            continue
        fact = next(f for word, f in fact_of.items() if f" {word} first" in q["question"])
        values = []
        for title, _ in q["supporting_facts"]:
            p = synth.page(SMALL, int(by_title[title]["id"]) - 1)
            values.append(p.attributes[fact])
        assert values[0] != values[1]
        (first, _), (second, _) = q["supporting_facts"]
        earlier = first if values[0] < values[1] else second
        assert q["answer"] in earlier
        checked += 1
    assert checked >= 3


def test_claims(world):
    claims = world["claims"]
    fever_lines = {p["id"]: p["lines"].split("\n") for p in world["fever_pages"]}
    labels = collections.Counter(c["label"] for c in claims)
    assert len(claims) >= 140
    for label in ("SUPPORTS", "REFUTES", "NOT ENOUGH INFO"):
        assert 0.25 <= labels[label] / len(claims) <= 0.42
    assert len({c["id"] for c in claims}) == len(claims)
    for c in claims:
        assert isinstance(c["id"], int) and c["claim"].endswith(".")
        if c["label"] == "NOT ENOUGH INFO":
            assert len(c["evidence"]) == 1 and c["evidence"][0][0][1:] == [None, None, None]
            continue
        for evidence_set in c["evidence"]:
            for annotation_id, evidence_id, page_id, line in evidence_set:
                assert isinstance(annotation_id, int) and isinstance(evidence_id, int)
                assert " " not in page_id and "(" not in page_id
                assert 0 <= line < len(fever_lines[page_id])


def test_fever_pages(world):
    by_title = world["by_title"]
    pages = world["fever_pages"]
    assert len(pages) == 500
    assert synth.fever_page_id("Port Arden (film)") == "Port_Arden_-LRB-film-RRB-"
    by_id = {synth.fever_page_id(t): r for t, r in by_title.items()}
    for p in pages:
        record = by_id[p["id"]]
        assert p["text"] == "".join(record["text"])
        for k, line in enumerate(p["lines"].split("\n")):
            fields = line.split("\t")
            assert fields[0] == str(k) and fields[1] == record["text"][k].lstrip()
            assert len(fields) % 2 == 0  # then (anchor, target) pairs
            for target in fields[3::2]:
                assert target in by_title


# --- questions and claims on their own ---------------------------------------------------------


def test_make_questions_is_deterministic_and_seeded():
    spec = synth.WorldSpec(num_docs=2_000)
    a = synth.make_questions(spec, 30, seed=1)
    assert a == synth.make_questions(spec, 30, seed=1)
    assert a != synth.make_questions(spec, 30, seed=2)
    assert all("context" not in q for q in synth.make_questions(spec, 5, seed=1, with_context=False))


def test_tiny_world(tmp_path):
    spec = synth.WorldSpec(num_docs=20)
    summary = synth.write_world(spec, open_under(tmp_path), num_questions=10, num_claims=9)
    assert summary.num_shards == 1 and summary.num_docs == 20
    assert all(synth.kind_counts(spec).values())
    questions = json.loads((tmp_path / "hotpot/questions.json").read_text())
    assert 1 <= len(questions) <= 10
    for q in questions:
        assert len(q["context"]) == 10
    assert len(read_jsonl_bz2(tmp_path / "wiki/AA/wiki_00.bz2")) == 20


# --- the controlled worlds of the science checks (xh.synth.evidence) -----------------------------------

EVIDENCE_WORLD = synth.WorldSpec(num_docs=2_000, seed=7)


@pytest.fixture(scope="module")
def evidence_claims():
    return synth.make_evidence_claims(EVIDENCE_WORLD, 300, seed=0)


def test_evidence_claims_are_deterministic_with_the_asked_slices(evidence_claims):
    assert evidence_claims == synth.make_evidence_claims(EVIDENCE_WORLD, 300, seed=0)
    assert evidence_claims != synth.make_evidence_claims(EVIDENCE_WORLD, 300, seed=1)
    counts = collections.Counter((c["_slice"], c["label"]) for c in evidence_claims)
    assert counts == {
        ("multi", "SUPPORTS"): 75,
        ("multi", "REFUTES"): 75,
        ("single", "SUPPORTS"): 45,
        ("single", "REFUTES"): 45,
        ("nei", "NOT ENOUGH INFO"): 60,
    }
    assert len({c["claim"] for c in evidence_claims}) == 300
    with pytest.raises(ValueError):
        synth.make_evidence_claims(EVIDENCE_WORLD, 10, multi_fraction=0.9, nei_fraction=0.2)


def test_multi_evidence_claims_need_the_linked_page_and_the_decoy_mirrors_the_verdict(evidence_claims):
    """Two linked pages per group; the claimed value is stated by B (SUPPORTS) or by a decoy of B's kind
    (REFUTES), never by A: a node that cannot see A cannot tell B from the decoy."""
    for c in (c for c in evidence_claims if c["_slice"] == "multi"):
        [group] = c["evidence"]
        (_, _, page_a, line_a), (_, _, page_b, line_b) = group
        assert page_a != page_b
        position = {(pid, line): k for k, (pid, _, line, _) in enumerate(c["_candidates"])}
        a_pos, b_pos = position[page_a, line_a], position[page_b, line_b]
        assert [a_pos, b_pos] in c["_links"]  # A's sentence names B's page
        value = c["claim"].rstrip(".").split(" in " if " in " in c["claim"] else " is ")[-1]
        states_value = [k for k, (_, _, _, text) in enumerate(c["_candidates"]) if value in text]
        assert a_pos not in states_value
        assert (b_pos in states_value) == (c["label"] == "SUPPORTS")
        assert (c["_decoy"] in states_value) == (c["label"] == "REFUTES")  # the decoy states it instead


def test_evidence_graph_rows_label_the_gold_sentences_and_type_the_links(evidence_claims):
    claims = evidence_claims[:40]
    full = synth.evidence_graph_rows(claims)
    typed = synth.evidence_graph_rows(claims, "typed")
    linked = synth.evidence_graph_rows(claims, "hyperlink")
    for c, f, t, h in zip(claims, full, typed, linked):
        n = len(c["_candidates"])
        assert f["qid"] == t["qid"] == h["qid"] == str(c["id"]) and f["claim_label"] == c["label"]
        assert len(f["nodes"]) == n and len(f["edges"]) == n * (n - 1) and t["edges"] == f["edges"]
        gold = {
            (p, line) for group in (c["evidence"] if c["label"] != "NOT ENOUGH INFO" else []) for *_, p, line in group
        }
        assert {(node["doc_id"], node["line"]) for node in f["nodes"] if node["is_evidence"]} == gold
        assert {node["source"] for node in f["nodes"]} == {"retrieved"}  # nothing marks the gold nodes
        hyperlinks = [(e["src"], e["dst"]) for e, kind in zip(t["edges"], t["edge_types"]) if kind == "hyperlink"]
        assert sorted(hyperlinks) == [tuple(pair) for pair in c["_links"]]
        assert [(e["src"], e["dst"]) for e in h["edges"]] == [tuple(pair) for pair in c["_links"]]
    with pytest.raises(ValueError):
        synth.evidence_graph_rows(claims, "nonsense")


def test_question_graph_rows_are_the_distractor_graphs_without_anchors():
    questions = synth.make_questions(EVIDENCE_WORLD, 40, seed=0, comparison_fraction=0.25)
    rows = synth.question_graph_rows(questions)
    with_anchors = synth.question_graph_rows(questions, anchors=True)
    assert [r["qid"] for r in rows] == [q["_id"] for q in questions]
    assert collections.Counter(r["question_type"] for r in rows) == {"bridge": 30, "comparison": 10}
    assert all(node["anchors"] == [] for r in rows for node in r["nodes"])
    assert any(node["anchors"] for r in with_anchors for node in r["nodes"])
    assert [r["edges"] for r in rows] == [r["edges"] for r in with_anchors]
