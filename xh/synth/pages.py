"""Pages: one generated article (lead paragraph, links, facts), computed from (seed, index) alone.

    from xh.synth import WorldSpec, page, iter_pages
    spec = WorldSpec(num_docs=2000, seed=13)
    p = page(spec, 0)
    p.sentences[1]          # ' She was born in Valham Bay.'
    p.links[0]              # PageLink(target_title='Valham Bay', anchor='Valham Bay', sentence_index=1, ...)
    p.attributes["birthplace"], p.relations["birthplace"]     # ('Valham Bay', 1): title and page index
    for p in iter_pages(spec, 100, 200): ...

Each kind has a template (`_person_page`, `_city_page`, ...) that draws its facts and link
targets from a `random.Random` seeded by the page index. Questions and claims read pages through
`_Pages`, a cache of the few pages they need.
"""

from __future__ import annotations

import random
import re
import urllib.parse
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import NamedTuple

from xh.synth.layout import (
    _CYCLE,
    BAND,
    CITY,
    CITY_NAMED_BAND_EVERY,
    CITY_NAMED_FILM_EVERY,
    FILM,
    KIND_CYCLE,
    ORGANISATION,
    PERSON,
    UNIVERSITY_EVERY,
    WorldSpec,
    _global_index,
    _Layout,
    _layout,
    _local_index,
    _skewed,
    _split,
)
from xh.synth.names import Name, _check_index, _city_country, _name, _name_in_pool
from xh.synth.words import (
    ALL_COUNTRIES,
    BAND_GENRES,
    BAND_YEARS,
    BIRTH_YEARS,
    CITY_FOUNDING_YEARS,
    COMPANY_SUFFIXES,
    COUNTRIES,
    FEMALE_FIRST_NAMES,
    FILM_GENRES,
    FILM_YEARS,
    FIRST_NAMES,
    OCCUPATIONS,
    ORG_FOUNDING_YEARS,
    REVIEWS,
    RIVERS,
    SETTLEMENT_TYPES,
    UNIVERSITY_PATTERNS,
)


class PageLink(NamedTuple):
    """A hyperlink: `anchor` in sentence `sentence_index` points at page `target_title`."""

    target_title: str
    anchor: str
    sentence_index: int
    target_index: int


@dataclass(slots=True)  # not frozen: frozen dataclasses are slow to build, and pages are many
class Page:
    """One generated article: its lead paragraph, split into sentences, and what it states.

    Treat it as read-only; `page(spec, i)` builds the same page again whenever asked.
    """

    index: int  # position in the world, 0 .. num_docs - 1
    doc_id: str  # Wikipedia-style curid: str(index + 1)
    kind: str
    title: str
    base_name: str
    sentences: tuple[str, ...]  # sentences after the first start with a space
    sentences_with_links: tuple[str, ...]  # the same, with <a href="Target%20Title">anchor</a>
    links: tuple[PageLink, ...]
    attributes: dict  # fact name -> readable value (years as int, related pages by title)
    relations: dict  # relation name -> page index of the related entity
    fact_sentences: dict  # fact or relation name -> index of the sentence that states it

    @property
    def text(self) -> str:
        return "".join(self.sentences)


_NEEDS_GENERAL_QUOTING = re.compile(r"[^A-Za-z0-9 ,()_.~-]")


def quote_title(page_title: str) -> str:
    """The href of a link to `page_title`: urllib.parse.quote(page_title), fast for our titles."""
    if _NEEDS_GENERAL_QUOTING.search(page_title):
        return urllib.parse.quote(page_title)
    return page_title.replace(" ", "%20").replace(",", "%2C").replace("(", "%28").replace(")", "%29")


class _Anchor(NamedTuple):
    index: int
    title: str
    text: str


class _ParagraphBuilder:
    """Collects sentences, their linked form and the links, as the page template dictates."""

    __slots__ = ("plain", "linked", "links", "facts")

    def __init__(self) -> None:
        self.plain: list[str] = []
        self.linked: list[str] = []
        self.links: list[PageLink] = []
        self.facts: dict[str, int] = {}

    def add(self, parts: Iterable, facts: tuple[str, ...] = ()) -> None:
        idx = len(self.plain)
        plain, linked = [" "] if idx else [], [" "] if idx else []
        for part in parts:
            if type(part) is str:
                plain.append(part)
                linked.append(part)
            else:
                plain.append(part.text)
                linked.append(f'<a href="{quote_title(part.title)}">{part.text}</a>')
                self.links.append(PageLink(part.title, part.text, idx, part.index))
        self.plain.append("".join(plain))
        self.linked.append("".join(linked))
        for fact in facts:
            self.facts[fact] = idx

    def __len__(self) -> int:
        return len(self.plain)


def _article(word: str) -> str:
    return "an" if word[0] in "aeiouAEIOU" else "a"


def _anchor(layout: _Layout, rng: random.Random, i: int) -> tuple[_Anchor, Name]:
    """A link to page i; the anchor text is the full title, the base name or the short form."""
    name = _name(layout, i)
    r = rng.random()
    if r < 0.25:
        text = name.title
    elif r < 0.5:
        text = name.short
    else:
        text = name.base
    return _Anchor(i, name.title, text), name


def _person_page(spec: WorldSpec, layout: _Layout, i: int, local: int, rng: random.Random):
    name = _name_in_pool(layout, layout.persons, local)
    first_index = layout.persons.slot(local)[0] % len(FIRST_NAMES)
    female = first_index < len(FEMALE_FIRST_NAMES)
    he, his = ("She", "her") if female else ("He", "his")
    forced = dict(name.forced)
    birth_year = forced.get("birth_year", BIRTH_YEARS[0] + rng.randrange(BIRTH_YEARS[1]))
    occupation = OCCUPATIONS[forced["occupation"]] if "occupation" in forced else rng.choice(OCCUPATIONS)
    counts = layout.counts
    city_local = _skewed(rng, counts[CITY], 3.0)
    birthplace = _global_index(CITY, city_local)
    if rng.random() < 0.8:
        country = _city_country(spec, layout, city_local)
    else:
        country = rng.randrange(len(COUNTRIES))
    demonym = ALL_COUNTRIES[country][1]

    p = _ParagraphBuilder()
    p.add(
        (f"{name.base} (born {birth_year}) is {_article(demonym)} {demonym} {occupation}.",),
        ("birth_year", "nationality", "occupation"),
    )
    city_anchor, city_name = _anchor(layout, rng, birthplace)
    p.add((f"{he} was born in ", city_anchor, "."), ("birthplace",))
    relations = {"birthplace": birthplace}
    attributes = {
        "first_name": FIRST_NAMES[first_index],
        "surname": name.short,
        "gender": "female" if female else "male",
        "birth_year": birth_year,
        "occupation": occupation,
        "nationality": demonym,
        "birthplace": city_name.title,
    }
    if rng.random() < 0.45:
        n_univ = layout.universities.count
        univ = layout.universities.page_index(_skewed(rng, n_univ, 2.0))
        a, n = _anchor(layout, rng, univ)
        the = "the " if a.text.startswith("University of") else ""
        p.add((f"{he} studied at {the}", a, "."), ("alma_mater",))
        relations["alma_mater"], attributes["alma_mater"] = univ, n.title
    if rng.random() < 0.35:
        other = _global_index(PERSON, rng.randrange(counts[PERSON]))
        if other != i:
            a, n = _anchor(layout, rng, other)
            p.add((f"{name.short} has worked with ", a, "."), ("collaborator",))
            relations["collaborator"], attributes["collaborator"] = other, n.title
    if rng.random() < 0.4 and birth_year < 1995:  # a year that is not a stated fact
        p.add((f"{he} began {his} career in {birth_year + 18 + rng.randrange(12)}.",))
    return name, p, attributes, relations


def _city_page(spec: WorldSpec, layout: _Layout, i: int, local: int, rng: random.Random):
    name = _name_in_pool(layout, layout.cities, local)
    country = _city_country(spec, layout, local)
    founded = CITY_FOUNDING_YEARS[0] + rng.randrange(CITY_FOUNDING_YEARS[1])
    settlement = rng.choice(SETTLEMENT_TYPES)
    p = _ParagraphBuilder()
    p.add((f"{name.base} is {_article(settlement)} {settlement} in {ALL_COUNTRIES[country][0]}.",), ("country",))
    p.add((f"It was founded in {founded}.",), ("founding_year",))
    attributes = {"country": ALL_COUNTRIES[country][0], "founding_year": founded, "settlement_type": settlement}
    relations = {}
    if rng.random() < 0.5:
        other = _global_index(CITY, _skewed(rng, layout.counts[CITY], 2.0))
        if other != i:
            a, n = _anchor(layout, rng, other)
            p.add((f"{name.base} is twinned with ", a, "."), ("twin_city",))
            relations["twin_city"], attributes["twin_city"] = other, n.title
    if rng.random() < 0.4:
        p.add((f"It lies on the {rng.choice(RIVERS)} River.",))
    return name, p, attributes, relations


def _organisation_page(spec: WorldSpec, layout: _Layout, i: int, local: int, rng: random.Random):
    university, m = _split(local, UNIVERSITY_EVERY)
    pool = layout.universities if university else layout.companies
    name = _name_in_pool(layout, pool, m)
    forced = dict(name.forced)
    founded = forced.get("founding_year", ORG_FOUNDING_YEARS[0] + rng.randrange(ORG_FOUNDING_YEARS[1]))
    counts = layout.counts
    founder = _global_index(PERSON, _skewed(rng, counts[PERSON], 2.0))
    p = _ParagraphBuilder()
    if university:
        # a university stands in the city it is named after
        t = pool.slot(m)[0] // len(UNIVERSITY_PATTERNS)
        headquarters = _global_index(CITY, layout.cities.order.backward(t))
        industry = "higher education"
        hq_anchor, hq_name = _anchor(layout, rng, headquarters)
        the = "The " if name.base.startswith("University of") else ""
        p.add((f"{the}{name.base} is a public university in ", hq_anchor, "."), ("headquarters", "industry"))
    else:
        headquarters = _global_index(CITY, _skewed(rng, counts[CITY], 2.0))
        suffix = pool.slot(m)[0] % len(COMPANY_SUFFIXES)
        industry = COMPANY_SUFFIXES[suffix][1]
        hq_anchor, hq_name = _anchor(layout, rng, headquarters)
        p.add(
            (f"{name.base} is {_article(industry)} {industry} company headquartered in ", hq_anchor, "."),
            ("headquarters", "industry"),
        )
    founder_anchor, founder_name = _anchor(layout, rng, founder)
    p.add((f"It was founded in {founded} by ", founder_anchor, "."), ("founding_year", "founder"))
    relations = {"headquarters": headquarters, "founder": founder}
    attributes = {
        "organisation_type": "university" if university else "company",
        "industry": industry,
        "founding_year": founded,
        "headquarters": hq_name.title,
        "founder": founder_name.title,
    }
    if not university and rng.random() < 0.3:
        parent = layout.companies.page_index(rng.randrange(layout.companies.count))
        if parent != i:
            a, n = _anchor(layout, rng, parent)
            p.add((f"{name.base} is a subsidiary of ", a, "."), ("parent",))
            relations["parent"], attributes["parent"] = parent, n.title
    if rng.random() < 0.4:
        if university:
            p.add((f"It has about {rng.randrange(2, 60) * 500:,} students.",))
        else:
            p.add((f"The company employs about {rng.randrange(1, 200) * 100:,} people.",))
    return name, p, attributes, relations


def _film_page(spec: WorldSpec, layout: _Layout, i: int, local: int, rng: random.Random):
    city_named, m = _split(local, CITY_NAMED_FILM_EVERY)
    name = _name_in_pool(layout, layout.city_films if city_named else layout.phrase_films, m)
    forced = dict(name.forced)
    year = forced.get("release_year", FILM_YEARS[0] + rng.randrange(FILM_YEARS[1]))
    genre = rng.choice(FILM_GENRES)
    counts = layout.counts
    director = _global_index(PERSON, _skewed(rng, counts[PERSON], 2.0))
    filmed_in = _global_index(CITY, _skewed(rng, counts[CITY], 2.0))
    p = _ParagraphBuilder()
    d_anchor, d_name = _anchor(layout, rng, director)
    p.add((f"{name.base} is a {year} {genre} film directed by ", d_anchor, "."), ("release_year", "genre", "director"))
    c_anchor, c_name = _anchor(layout, rng, filmed_in)
    p.add(("It was filmed in ", c_anchor, "."), ("filmed_in",))
    relations = {"director": director, "filmed_in": filmed_in}
    attributes = {
        "release_year": year,
        "genre": genre,
        "director": d_name.title,
        "filmed_in": c_name.title,
    }
    if rng.random() < 0.6:
        star = _global_index(PERSON, _skewed(rng, counts[PERSON], 1.5))
        a, n = _anchor(layout, rng, star)
        p.add(("It stars ", a, "."), ("star",))
        relations["star"], attributes["star"] = star, n.title
    if rng.random() < 0.4:
        p.add((f"The film received {rng.choice(REVIEWS)} reviews.",))
    return name, p, attributes, relations


def _band_page(spec: WorldSpec, layout: _Layout, i: int, local: int, rng: random.Random):
    city_named, m = _split(local, CITY_NAMED_BAND_EVERY)
    name = _name_in_pool(layout, layout.city_bands if city_named else layout.phrase_bands, m)
    forced = dict(name.forced)
    year = forced.get("formation_year", BAND_YEARS[0] + rng.randrange(BAND_YEARS[1]))
    genre = rng.choice(BAND_GENRES)
    counts = layout.counts
    origin = _global_index(CITY, _skewed(rng, counts[CITY], 2.0))
    member = _global_index(PERSON, _skewed(rng, counts[PERSON], 1.5))
    p = _ParagraphBuilder()
    o_anchor, o_name = _anchor(layout, rng, origin)
    p.add((f"{name.base} are {_article(genre)} {genre} band from ", o_anchor, "."), ("genre", "origin"))
    m_anchor, m_name = _anchor(layout, rng, member)
    p.add((f"The band was formed in {year} by ", m_anchor, "."), ("formation_year", "founding_member"))
    relations = {"origin": origin, "founding_member": member}
    attributes = {
        "genre": genre,
        "formation_year": year,
        "origin": o_name.title,
        "founding_member": m_name.title,
    }
    if rng.random() < 0.4:
        other = _global_index(BAND, rng.randrange(counts[BAND]))
        if other != i:
            a, n = _anchor(layout, rng, other)
            p.add(("They have toured with ", a, "."), ("toured_with",))
            relations["toured_with"], attributes["toured_with"] = other, n.title
    if rng.random() < 0.4:
        label = layout.companies.page_index(_skewed(rng, layout.companies.count, 2.0))
        a, n = _anchor(layout, rng, label)
        p.add(("Their debut album was released by ", a, "."), ("record_label",))
        relations["record_label"], attributes["record_label"] = label, n.title
    return name, p, attributes, relations


_PAGE_BUILDERS = {
    PERSON: _person_page,
    CITY: _city_page,
    ORGANISATION: _organisation_page,
    FILM: _film_page,
    BAND: _band_page,
}


def page(spec: WorldSpec, i: int) -> Page:
    """Page i of the world, computed from (spec.seed, i) alone."""
    _check_index(spec, i)
    layout = _layout(spec)
    kind = KIND_CYCLE[i % _CYCLE]
    rng = random.Random(layout.page_salt + i)
    name, p, attributes, relations = _PAGE_BUILDERS[kind](spec, layout, i, _local_index(i), rng)
    return Page(
        index=i,
        doc_id=str(i + 1),
        kind=kind,
        title=name.title,
        base_name=name.base,
        sentences=tuple(p.plain),
        sentences_with_links=tuple(p.linked),
        links=tuple(p.links),
        attributes=attributes,
        relations=relations,
        fact_sentences=p.facts,
    )


def iter_pages(spec: WorldSpec, start: int = 0, stop: int | None = None) -> Iterator[Page]:
    """Pages start .. stop-1 (default: to the end), one at a time."""
    stop = spec.num_docs if stop is None else min(stop, spec.num_docs)
    for i in range(max(start, 0), stop):
        yield page(spec, i)


# Questions and claims touch only the pages they need, through this cache.


class _Pages:
    """Pages generated on demand and kept for the duration of one question or claim batch."""

    def __init__(self, spec: WorldSpec) -> None:
        self.spec, self.layout, self._pages = spec, _layout(spec), {}

    def __getitem__(self, i: int) -> Page:
        p = self._pages.get(i)
        if p is None:
            p = self._pages[i] = page(self.spec, i)
        return p

    def random_of_kind(self, rng: random.Random, kind: str) -> Page:
        return self[_global_index(kind, rng.randrange(self.layout.counts[kind]))]


def _fact_surface(pages: _Pages, p: Page, fact: str) -> str:
    """The string a sentence of page p uses for one of its facts (the answer to ask for)."""
    if fact in p.relations:
        return _name(pages.layout, p.relations[fact]).base
    if fact == "country":
        return p.attributes["country"]
    return str(p.attributes[fact])
