"""xh.synth past a million pages: worlds up to 1,000,000 pages are the ones they always were, and a world
of HotpotQA's size (5.23M abstracts) still has unique, readable titles whose disambiguators agree with
the pages' facts."""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import random
import re

import pytest

from xh import synth
from xh.config import load_config
from xh.synth import words
from xh.synth.layout import _MAX_ROUNDS, CITY_FIRST_ROUNDS, PERSON_SINGLE_ROUNDS, _layout, _NamePool
from xh.synth.names import _name_in_pool

pytestmark = pytest.mark.unit

# --- identity: worlds up to 1,000,000 pages are unchanged ----------------------------------------

# sha256 of `_fingerprint(...)` below (`_digest(case)`), computed with the generator as it was before
# its pools were widened past 1,000,000 pages (when MAX_DOCS was 1,000,000): this file's `_digest` run
# against main's xh.synth at commits c2867b0 and e9102b1 (the same code there) gave these. A change here
# changes the science test's and the demo's worlds and the committed figures made from them.
EXPECTED_DIGESTS = {
    "20 pages, seed 13, whole": "dbe5a8c65925f4b5004a77871a4626c09ab0a64f9e63fc91b430b42d73ad413b",
    "2,000 pages, seed 13, whole": "152853efa567aeb56e959af5f533f079a115f2de8cbbea199269d45ef8f844fb",
    "2,000 pages, seed 7, whole": "9212b599560930c3fb171b2aa8a4ade5623b30f716c2359c905e7532c9067354",
    "20,000 pages, seed 7, 3,000 sampled pages": "04079a35df6cf3f02aa341fc6d6ce82077380ceb236ed36c43b068e1c85b8a6c",
    "1,000,000 pages, seed 13, 20,000 sampled pages": "5d4e43a6faa8ebf9a929b7552b167bef3aa01ef2a31feeb08aba8270495b9d42",
}


def _sample(num_docs: int, k: int) -> list[int]:
    rng = random.Random(num_docs)
    return sorted({0, num_docs - 1, *(rng.randrange(num_docs) for _ in range(k))})


CASES = {
    "20 pages, seed 13, whole": (synth.WorldSpec(num_docs=20, seed=13), None),
    "2,000 pages, seed 13, whole": (synth.WorldSpec(num_docs=2_000, seed=13), None),
    "2,000 pages, seed 7, whole": (synth.WorldSpec(num_docs=2_000, seed=7), None),
    "20,000 pages, seed 7, 3,000 sampled pages": (synth.WorldSpec(num_docs=20_000, seed=7), _sample(20_000, 3_000)),
    "1,000,000 pages, seed 13, 20,000 sampled pages": (
        synth.WorldSpec(num_docs=1_000_000, seed=13),
        _sample(1_000_000, 20_000),
    ),
}


def _fingerprint(spec: synth.WorldSpec, indices: list[int] | None):
    """Everything written about the pages (HotpotQA and FEVER records, true links), and the tasks."""
    indices = range(spec.num_docs) if indices is None else indices
    for i in indices:
        p = synth.page(spec, i)
        yield synth.hotpot_record(p)
        yield synth.fever_page_record(p)
        yield synth.link_rows(p)
        name = synth.name_of(spec, i)
        yield name.title, name.base, name.short, name.shared
    yield synth.make_questions(spec, 40, seed=0)
    yield synth.make_claims(spec, 40, seed=0)
    yield synth.make_evidence_claims(spec, 20, seed=0)


def _digest(case: str) -> str:
    h = hashlib.sha256()
    for item in _fingerprint(*CASES[case]):
        h.update(json.dumps(item, sort_keys=True, ensure_ascii=False).encode("utf-8"))
        h.update(b"\n")
    return h.hexdigest()


@pytest.mark.parametrize("case", list(CASES))
def test_worlds_up_to_a_million_pages_are_unchanged(case):
    assert _digest(case) == EXPECTED_DIGESTS[case]


# --- HotpotQA's size: 5.23M pages ------------------------------------------------------------------

HOTPOT = synth.WorldSpec(num_docs=5_230_000, seed=13)


def _pools(layout):
    return [
        getattr(layout, f.name) for f in dataclasses.fields(layout) if isinstance(getattr(layout, f.name), _NamePool)
    ]


@pytest.mark.parametrize("num_docs", [HOTPOT.num_docs, synth.MAX_DOCS])
def test_every_name_pool_has_the_rounds_it_needs(num_docs):
    """Capacity: each pool's base names times its distinct disambiguators covers its entities."""
    layout = _layout(synth.WorldSpec(num_docs=num_docs))
    pools = _pools(layout)
    assert sum(p.count for p in pools) == num_docs
    for pool in pools:
        assert pool.rounds <= _MAX_ROUNDS[pool.style], pool.style
        assert pool.count <= pool.size * _MAX_ROUNDS[pool.style]
    # these sizes need the forms past the first ones: the checks below exercise them
    assert layout.persons.rounds > PERSON_SINGLE_ROUNDS and layout.cities.rounds > CITY_FIRST_ROUNDS


def test_titles_of_namesakes_are_unique_at_hotpotqa_size():
    """Every holder of sampled base names, in every round the world uses, across all pools: one title each.

    Round-0 names differ between bases (`test_plain_names_of_different_sorts_never_collide` at
    MAX_DOCS), so unique disambiguators per base make every title unique."""
    layout = _layout(HOTPOT)
    rng = random.Random(0)
    titles: dict[str, tuple] = {}
    for pool in _pools(layout):
        bases = {0, pool.size - 1, *(rng.randrange(pool.size) for _ in range(80))}
        for base in sorted(bases):
            family = [pool.holder(base, r) for r in range(pool.holders(base))]
            assert family and None not in family
            for r, m in enumerate(family):
                assert pool.slot(m) == (base, r)
                name = _name_in_pool(layout, pool, m)
                plain = r == 0 and pool.style not in ("city_film", "city_band")  # "Port Arden (film)"
                assert name.title.startswith(name.base) and plain == (name.title == name.base)
                assert titles.setdefault(name.title, (pool.style, m)) == (pool.style, m), name.title
    assert len(titles) > 20_000


def test_sampled_pages_at_hotpotqa_size():
    """Random pages of the 5.23M world: unique titles, and the new disambiguators agree with the facts."""
    rng = random.Random(1)
    indices = sorted({rng.randrange(HOTPOT.num_docs) for _ in range(60_000)})
    titles = [synth.title(HOTPOT, i) for i in indices]
    assert len(set(titles)) == len(titles)
    person_both = re.compile(r"\(([a-z]+), born (\d{4})\)$")
    city_country = re.compile(r", ([A-Z][A-Za-z ]+)$")
    new_countries = {country for country, _ in words.MORE_COUNTRIES}
    seen = collections.Counter()
    for i, t in zip(indices[::4], titles[::4]):
        p = synth.page(HOTPOT, i)
        assert p.title == t and 2 <= len(p.sentences) <= 5
        for link in p.links:
            assert synth.title(HOTPOT, link.target_index) == link.target_title
        if p.kind == synth.PERSON and (match := person_both.search(t)):
            occupation, year = match.groups()
            assert p.attributes["occupation"] == occupation and p.attributes["birth_year"] == int(year)
            seen["person with occupation and year"] += 1
        if p.kind == synth.CITY and (match := city_country.search(t)):
            assert p.attributes["country"] == match.group(1)
            seen["city in a new country"] += match.group(1) in new_countries
    assert seen["person with occupation and year"] >= 100 and seen["city in a new country"] >= 30


def test_questions_and_claims_at_hotpotqa_size():
    questions = synth.make_questions(HOTPOT, 30, seed=0)
    assert len(questions) == 30 and all(len(q["context"]) == 10 for q in questions)
    for q in questions:
        context = dict(q["context"])
        for title, k in q["supporting_facts"]:
            assert 0 <= k < len(context[title])
    claims = synth.make_claims(HOTPOT, 30, seed=0)
    assert len(claims) == 30 and {c["label"] for c in claims} == {"SUPPORTS", "REFUTES", "NOT ENOUGH INFO"}


def test_config_allows_what_the_generator_builds():
    """`synth.num_docs` is bounded where `xh.synth.MAX_DOCS` is: HotpotQA's size passes, past it does not."""
    assert load_config(None, ["synth.num_docs=5230000"]).synth.num_docs == HOTPOT.num_docs
    assert load_config(None, [f"synth.num_docs={synth.MAX_DOCS}"]).synth.num_docs == synth.MAX_DOCS
    with pytest.raises(ValueError, match="less than or equal to 5500000"):
        load_config(None, [f"synth.num_docs={synth.MAX_DOCS + 1}"])
