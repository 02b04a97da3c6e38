"""HotpotQA questions over the generated world: bridge (two hops along a link) and comparison.

    from xh.synth import WorldSpec, make_questions
    questions = make_questions(WorldSpec(num_docs=2000), n=50, seed=0)   # official distractor format

Questions touch only the pages they need (through `_Pages`); their distractor paragraphs are
look-alike pages (namesakes, one word of the name changed) and pages the gold pages link to.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from typing import NamedTuple

from xh.synth.layout import (
    _SALT_QUESTIONS,
    BAND,
    CITY,
    FILM,
    ORGANISATION,
    PERSON,
    WorldSpec,
    _global_index,
    _Layout,
    _mix64,
    _pool_of,
)
from xh.synth.names import _display_name, _in_prose, _name
from xh.synth.pages import Page, _fact_surface, _Pages


def _look_alikes(layout: _Layout, i: int, rng: random.Random, tries: int = 12) -> list[int]:
    """Pages whose names look like page i's: same base name, or one word of it changed."""
    pool, m = _pool_of(layout, i)
    base, round_ = pool.slot(m)
    found = []
    for r in range(pool.holders(base)):  # namesakes of the same sort
        if r != round_:
            found.append(pool.page_index(pool.holder(base, r)))
    # cities and the films / bands named after them
    if pool.style == "city" and round_ == 0:
        t = pool.scatter.backward(base)
        for other in (layout.city_films, layout.city_bands):
            for r in range(other.holders(t)):
                found.append(other.page_index(other.holder(t, r)))
    elif pool.style in ("city_film", "city_band"):
        found.append(_global_index(CITY, layout.cities.order.backward(base)))
    if len(pool.radix) > 1:
        digits = []
        rest = base
        for size in pool.radix:
            digits.append(rest % size)
            rest //= size
        for _ in range(tries):
            position = rng.randrange(len(digits))
            changed = list(digits)
            changed[position] = rng.randrange(pool.radix[position])
            other_base, scale = 0, 1
            for d, size in zip(changed, pool.radix):
                other_base += d * scale
                scale *= size
            holders = pool.holders(other_base)
            if holders and other_base != base:
                found.append(pool.page_index(pool.holder(other_base, rng.randrange(holders))))
    return found


def _distractors(pages: _Pages, gold: list[int], rng: random.Random, k: int = 8) -> list[int]:
    """k look-alike paragraphs for a question: namesakes, pages the gold pages link to, same kinds."""
    seen, chosen = set(gold), []

    def take(candidates: Iterable[int], limit: int) -> None:
        for c in candidates:
            if len(chosen) >= limit:
                return
            if c not in seen:
                seen.add(c)
                chosen.append(c)

    look_alikes = [c for g in gold for c in _look_alikes(pages.layout, g, rng)]
    rng.shuffle(look_alikes)
    take(look_alikes, 4)
    linked = [link.target_index for g in gold for link in pages[g].links]
    rng.shuffle(linked)
    take(linked, 6)
    kinds = [pages[g].kind for g in gold]
    attempts = 0
    while len(chosen) < k and attempts < 200:
        attempts += 1
        take([pages.random_of_kind(rng, rng.choice(kinds)).index], k)
    while len(chosen) < k and len(seen) < pages.spec.num_docs:  # tiny worlds: anything left
        take([rng.randrange(pages.spec.num_docs)], k)
    return chosen


def _context(pages: _Pages, gold: list[int], rng: random.Random) -> list:
    members = gold + _distractors(pages, gold, rng)
    rng.shuffle(members)
    return [[pages[i].title, list(pages[i].sentences)] for i in members]


def _question_id(spec: WorldSpec, seed: int, k: int) -> str:
    return f"{_mix64(spec.seed, _SALT_QUESTIONS, seed, k):016x}{_mix64(seed, k, spec.seed) >> 32:08x}"


class _BridgeTemplate(NamedTuple):
    name: str
    kind: str  # kind of the page the question names
    relation: str  # the link from that page to the bridge page
    fact: str  # the fact on the bridge page that is the answer
    question: str


BRIDGE_TEMPLATES = (
    _BridgeTemplate(
        "founder_birthplace", ORGANISATION, "founder", "birthplace", "In which city was the founder of {name} born?"
    ),
    _BridgeTemplate(
        "founder_nationality",
        ORGANISATION,
        "founder",
        "nationality",
        "What nationality is the person who founded {name}?",
    ),
    _BridgeTemplate(
        "headquarters_founding_year",
        ORGANISATION,
        "headquarters",
        "founding_year",
        "In what year was the city where {name} is based founded?",
    ),
    _BridgeTemplate(
        "director_nationality", FILM, "director", "nationality", "What nationality is the director of {name}?"
    ),
    _BridgeTemplate("director_birthplace", FILM, "director", "birthplace", "Where was the director of {name} born?"),
    _BridgeTemplate(
        "filming_location_country",
        FILM,
        "filmed_in",
        "country",
        "In which country is the city where {name} was filmed?",
    ),
    _BridgeTemplate("star_birth_year", FILM, "star", "birth_year", "In what year was the star of {name} born?"),
    _BridgeTemplate(
        "member_birth_year",
        BAND,
        "founding_member",
        "birth_year",
        "In what year was the founding member of {name} born?",
    ),
    _BridgeTemplate(
        "band_origin_country", BAND, "origin", "country", "The band {name} comes from a city in which country?"
    ),
    _BridgeTemplate(
        "alma_mater_founding_year",
        PERSON,
        "alma_mater",
        "founding_year",
        "In what year was the university attended by {name} founded?",
    ),
)


class _ComparisonTemplate(NamedTuple):
    name: str
    kind: str
    fact: str
    question: str
    yes_no: bool  # else: which of the two (the earlier one)


COMPARISON_TEMPLATES = (
    _ComparisonTemplate("same_birthplace", PERSON, "birthplace", "Were {a} and {b} born in the same city?", True),
    _ComparisonTemplate("same_nationality", PERSON, "nationality", "Are {a} and {b} of the same nationality?", True),
    _ComparisonTemplate(
        "same_formation_year", BAND, "formation_year", "Were {a} and {b} formed in the same year?", True
    ),
    _ComparisonTemplate("same_film_genre", FILM, "genre", "Are {a} and {b} films of the same genre?", True),
    _ComparisonTemplate("released_first", FILM, "release_year", "Which film was released first, {a} or {b}?", False),
    _ComparisonTemplate("formed_first", BAND, "formation_year", "Which band was formed first, {a} or {b}?", False),
    _ComparisonTemplate("born_first", PERSON, "birth_year", "Who was born first, {a} or {b}?", False),
    _ComparisonTemplate(
        "founded_first", ORGANISATION, "founding_year", "Which organisation was founded first, {a} or {b}?", False
    ),
    _ComparisonTemplate(
        "city_founded_first", CITY, "founding_year", "Which city was founded first, {a} or {b}?", False
    ),
)


def _bridge_question(pages: _Pages, rng: random.Random, template: _BridgeTemplate) -> dict | None:
    source = pages.random_of_kind(rng, template.kind)
    if template.relation not in source.relations:
        return None
    bridge = pages[source.relations[template.relation]]
    if template.fact not in bridge.fact_sentences:
        return None
    answer = _fact_surface(pages, bridge, template.fact)
    answer_sentence = bridge.sentences[bridge.fact_sentences[template.fact]]
    source_name = _display_name(pages.layout, source.index)
    question = template.question.format(name=_in_prose(source_name))
    # the answer must need the second hop: absent from the first page and from the question
    if answer not in answer_sentence or answer in source.text or answer.lower() in question.lower():
        return None
    link_sentence = source.fact_sentences[template.relation]
    anchor = next(
        link.anchor
        for link in source.links
        if link.target_index == bridge.index and link.sentence_index == link_sentence
    )
    # how hard it is to follow the link: "easy" when its text is the full title, "hard" when the
    # text is a name other pages share (a surname, a reused name), "medium" otherwise
    bridge_name = _name(pages.layout, bridge.index)
    if anchor == bridge.title:
        level = "easy"
    elif bridge_name.shared or anchor != bridge_name.base:
        level = "hard"
    else:
        level = "medium"
    return {
        "answer": answer,
        "question": question,
        "supporting_facts": [[source.title, link_sentence], [bridge.title, bridge.fact_sentences[template.fact]]],
        "type": "bridge",
        "level": level,
        "_gold": [source.index, bridge.index],
        "_key": (template.name, source.index),
    }


def _comparison_key(pages: _Pages, p: Page, fact: str):
    # same city means the same surface name: two different cities called "Port Arden" would read
    # the same in the text, so a "no" over them could not be answered
    return _fact_surface(pages, p, fact) if fact in p.relations else p.attributes[fact]


class _ComparisonPool:
    """A sample of pages of one kind with one fact, grouped by its value, for pairing."""

    def __init__(self, pages: _Pages, sample: list[Page], fact: str) -> None:
        self.candidates = [p for p in sample if fact in p.fact_sentences]
        self.key = {p.index: _comparison_key(pages, p, fact) for p in self.candidates}
        self.names = {p.index: _display_name(pages.layout, p.index) for p in self.candidates}
        groups: dict = {}
        for p in self.candidates:
            groups.setdefault(self.key[p.index], []).append(p)
        self.shared_value_groups = [g for g in groups.values() if len(g) > 1]

    def distinct(self, a: Page, b: Page) -> bool:
        # neither name inside the other, so the answer names exactly one of them
        na, nb = self.names[a.index], self.names[b.index]
        return a.index != b.index and na not in nb and nb not in na

    def same_value_pair(self, rng: random.Random) -> tuple[Page, Page] | None:
        for _ in range(20):
            if not self.shared_value_groups:
                return None
            a, b = rng.sample(rng.choice(self.shared_value_groups), 2)
            if self.distinct(a, b):
                return a, b
        return None

    def different_value_pair(self, rng: random.Random) -> tuple[Page, Page] | None:
        """Two pages with different values; where one is at hand, a pair whose names share a word."""
        if len(self.candidates) < 2:
            return None
        a = rng.choice(self.candidates)
        a_words = set(self.names[a.index].split()) - {"The", "of"}
        fallback = None
        for _ in range(30):
            b = rng.choice(self.candidates)
            if self.key[a.index] == self.key[b.index] or not self.distinct(a, b):
                continue
            if a_words & set(self.names[b.index].split()):
                return a, b
            fallback = fallback or (a, b)
        return fallback


def _comparison_question(
    pages: _Pages, rng: random.Random, template: _ComparisonTemplate, pool: _ComparisonPool, want_yes: bool
) -> dict | None:
    if template.yes_no and want_yes:
        pair = pool.same_value_pair(rng)
    else:
        pair = pool.different_value_pair(rng)
    if pair is None:
        return None
    a, b = pair
    if rng.random() < 0.5:
        a, b = b, a
    key, names = pool.key, pool.names
    if template.yes_no:
        answer = "yes" if key[a.index] == key[b.index] else "no"
    else:
        answer = names[a.index] if key[a.index] < key[b.index] else names[b.index]
    # "hard" for look-alike names (sharing a word), "easy" for names no other page has
    layout = pages.layout
    if set(names[a.index].split()) & set(names[b.index].split()) - {"The", "of"}:
        level = "hard"
    elif _name(layout, a.index).shared or _name(layout, b.index).shared:
        level = "medium"
    else:
        level = "easy"
    return {
        "answer": answer,
        "question": template.question.format(a=names[a.index], b=names[b.index]),
        "supporting_facts": [[a.title, a.fact_sentences[template.fact]], [b.title, b.fact_sentences[template.fact]]],
        "type": "comparison",
        "level": level,
        "_gold": [a.index, b.index],
        "_key": (template.name, min(a.index, b.index), max(a.index, b.index)),
    }


def make_questions(
    spec: WorldSpec, n: int, seed: int = 0, comparison_fraction: float = 0.2, with_context: bool = True
) -> list[dict]:
    """Up to n HotpotQA questions (official format), generating only the pages they need.

    Bridge questions ask for a fact of a page linked from the named page; comparison questions
    are yes/no (balanced) or which-of-two (no ties). Each has `_id, question, answer,
    supporting_facts, type, level` and, with_context, the 2 gold paragraphs and 8 distractors.
    Small worlds may yield fewer than n distinct questions.
    """
    if n < 0 or not 0.0 <= comparison_fraction <= 1.0:
        raise ValueError("n must be >= 0 and comparison_fraction within [0, 1]")
    rng = random.Random(_mix64(spec.seed, _SALT_QUESTIONS, seed))
    pages = _Pages(spec)
    n_comparison = round(n * comparison_fraction)
    drafts: list[dict] = []
    seen: set = set()

    def keep(q: dict | None) -> bool:
        if q is None or q["_key"] in seen:
            return False
        seen.add(q["_key"])
        drafts.append(q)
        return True

    made, attempts = 0, 0
    while made < n - n_comparison and attempts < 60 * (n - n_comparison) + 100:
        attempts += 1
        made += keep(_bridge_question(pages, rng, rng.choice(BRIDGE_TEMPLATES)))

    # comparison pairs come from a sample of pages per kind: grouping it finds "yes" pairs
    sample_size = min(5_000, 40 + 8 * n_comparison)
    samples: dict[str, list[Page]] = {}
    pools: dict[tuple[str, str], _ComparisonPool] = {}

    def pool_of(kind: str, fact: str) -> _ComparisonPool:
        if kind not in samples:
            count = pages.layout.counts[kind]
            locals_ = rng.sample(range(count), min(count, sample_size))
            samples[kind] = [pages[_global_index(kind, j)] for j in locals_]
        if (kind, fact) not in pools:
            pools[kind, fact] = _ComparisonPool(pages, samples[kind], fact)
        return pools[kind, fact]

    yes = no = 0
    made, attempts = 0, 0
    while made < n_comparison and attempts < 60 * n_comparison + 100:
        attempts += 1
        template = rng.choice(COMPARISON_TEMPLATES)
        want_yes = yes <= no  # ask for whichever is behind, so yes and no stay balanced
        q = _comparison_question(pages, rng, template, pool_of(template.kind, template.fact), want_yes)
        if keep(q):
            made += 1
            yes += q["answer"] == "yes"
            no += q["answer"] == "no"

    questions = []
    for k, q in enumerate(drafts):
        record = {
            "_id": _question_id(spec, seed, k),
            "question": q["question"],
            "answer": q["answer"],
            "supporting_facts": q["supporting_facts"],
            "type": q["type"],
            "level": q["level"],
        }
        if with_context:
            record["context"] = _context(pages, q["_gold"], rng)
        questions.append(record)
    rng.shuffle(questions)
    return questions
