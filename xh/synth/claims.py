"""FEVER claims over the generated world: SUPPORTS, REFUTES and NOT ENOUGH INFO in equal thirds.

    from xh.synth import WorldSpec, make_claims
    claims = make_claims(WorldSpec(num_docs=2000), n=60, seed=0)   # FEVER's JSON-lines records

A claim states a fact of one page (true or changed) or something the world never says; its
evidence names the page by its FEVER page id and the sentence that states the fact.
"""

from __future__ import annotations

import random
from typing import NamedTuple

from xh.synth import layout
from xh.synth.names import _display_name, _in_prose, _name
from xh.synth.pages import Page, _article, _fact_surface, _Pages
from xh.synth.words import BAND_GENRES, COUNTRIES, FILM_GENRES, OCCUPATIONS
from xh.wiki.titles import fever_page_id


class _ClaimTemplate(NamedTuple):
    kind: str
    fact: str
    claim: str  # format with {name} and {value}


CLAIM_TEMPLATES = (
    _ClaimTemplate(layout.PERSON, "birthplace", "{name} was born in {value}."),
    _ClaimTemplate(layout.PERSON, "birth_year", "{name} was born in {value}."),
    _ClaimTemplate(layout.PERSON, "nationality", "{name} is {value}."),
    _ClaimTemplate(layout.PERSON, "occupation", "{name} is {article} {value}."),
    _ClaimTemplate(layout.CITY, "country", "{name} is located in {value}."),
    _ClaimTemplate(layout.CITY, "founding_year", "{name} was founded in {value}."),
    _ClaimTemplate(layout.ORGANISATION, "headquarters", "{name} is headquartered in {value}."),
    _ClaimTemplate(layout.ORGANISATION, "founder", "{name} was founded by {value}."),
    _ClaimTemplate(layout.ORGANISATION, "founding_year", "{name} was founded in {value}."),
    _ClaimTemplate(layout.FILM, "director", "{name} was directed by {value}."),
    _ClaimTemplate(layout.FILM, "release_year", "{name} was released in {value}."),
    _ClaimTemplate(layout.FILM, "filmed_in", "{name} was filmed in {value}."),
    _ClaimTemplate(layout.FILM, "genre", "{name} is {article} {value} film."),
    _ClaimTemplate(layout.BAND, "origin", "{name} is a band from {value}."),
    _ClaimTemplate(layout.BAND, "formation_year", "{name} was formed in {value}."),
    _ClaimTemplate(layout.BAND, "founding_member", "{name} was formed by {value}."),
    _ClaimTemplate(layout.BAND, "genre", "{name} is {article} {value} band."),
)

# Predicates the world never states: claims made of them are NOT ENOUGH INFO.
UNSTATED_CLAIMS = {
    layout.PERSON: (
        "{name} has won an Olympic gold medal.",
        "{name} has a twin sibling.",
        "{name} speaks five languages.",
        "{name} once lived in a lighthouse.",
    ),
    layout.CITY: (
        "{name} has hosted the Winter Olympics.",
        "{name} has an underground railway.",
        "{name} has a population of over one million.",
    ),
    layout.ORGANISATION: (
        "{name} is listed on a stock exchange.",
        "{name} has offices in more than forty countries.",
        "{name} once sponsored a football club.",
    ),
    layout.FILM: (
        "{name} was shot in black and white.",
        "{name} won an award at the Venice Film Festival.",
        "{name} has a sequel.",
    ),
    layout.BAND: (
        "{name} has released a live album.",
        "{name} has won a Grammy Award.",
        "{name} once split up and later reunited.",
    ),
}
# Relations a page may lack: claiming one it lacks is NOT ENOUGH INFO too (harder to spot).
OPTIONAL_RELATION_CLAIMS = {
    layout.PERSON: ("alma_mater", layout.ORGANISATION, "{name} studied at {value}."),
    layout.FILM: ("star", layout.PERSON, "{name} stars {value}."),
    layout.BAND: ("record_label", layout.ORGANISATION, "{name} released its debut album through {value}."),
}

SUPPORTS, REFUTES, NOT_ENOUGH_INFO = "SUPPORTS", "REFUTES", "NOT ENOUGH INFO"


def _changed_value(pages: _Pages, rng: random.Random, p: Page, fact: str, true_value: str) -> str | None:
    """A value for `fact` that differs from the true one on the surface: a real city, a near year..."""
    for _ in range(20):
        if fact in p.relations:
            target_kind = layout.kind_of(p.relations[fact])
            other = layout._global_index(target_kind, rng.randrange(pages.layout.counts[target_kind]))
            value = _name(pages.layout, other).base
        elif fact.endswith("year"):
            value = str(int(true_value) + rng.choice((-1, 1)) * rng.randrange(1, 15))
        elif fact == "nationality":
            value = rng.choice(COUNTRIES)[1]
        elif fact == "country":
            value = rng.choice(COUNTRIES)[0]
        elif fact == "occupation":
            value = rng.choice(OCCUPATIONS)
        else:  # genre
            value = rng.choice(FILM_GENRES if p.kind == layout.FILM else BAND_GENRES)
        if value != true_value:
            return value
    return None


def make_claims(spec: layout.WorldSpec, n: int, seed: int = 0) -> list[dict]:
    """n FEVER claims (labels in equal thirds) about the world's pages, in FEVER's JSON-lines format."""
    if n < 0:
        raise ValueError("n must be >= 0")
    rng = random.Random(layout._mix64(spec.seed, layout._SALT_CLAIMS, seed))
    pages = _Pages(spec)
    by_kind: dict[str, list[_ClaimTemplate]] = {}
    for t in CLAIM_TEMPLATES:
        by_kind.setdefault(t.kind, []).append(t)
    labels = [(SUPPORTS, REFUTES, NOT_ENOUGH_INFO)[k % 3] for k in range(n)]
    rng.shuffle(labels)
    claims, seen = [], set()
    evidence_id = 100_000
    for k, label in enumerate(labels):
        claim_id = k + 1
        annotation_id = 500_000 + claim_id
        for _ in range(50):
            p = pages[rng.randrange(spec.num_docs)]
            name = _display_name(pages.layout, p.index)
            evidence = None
            if label == NOT_ENOUGH_INFO:
                optional = OPTIONAL_RELATION_CLAIMS.get(p.kind)
                if optional and optional[0] not in p.relations and rng.random() < 0.4:
                    target_kind = optional[1]
                    if target_kind == layout.ORGANISATION and optional[0] == "alma_mater":
                        target = pages.layout.universities.page_index(rng.randrange(pages.layout.universities.count))
                    elif target_kind == layout.ORGANISATION:
                        target = pages.layout.companies.page_index(rng.randrange(pages.layout.companies.count))
                    else:
                        target = layout._global_index(target_kind, rng.randrange(pages.layout.counts[target_kind]))
                    text = optional[2].format(
                        name=_in_prose(name, True), value=_in_prose(_name(pages.layout, target).base)
                    )
                else:
                    text = rng.choice(UNSTATED_CLAIMS[p.kind]).format(name=_in_prose(name, True))
                evidence = [[[annotation_id, None, None, None]]]
            else:
                template = rng.choice(by_kind[p.kind])
                true_value = _fact_surface(pages, p, template.fact)
                value = true_value if label == SUPPORTS else _changed_value(pages, rng, p, template.fact, true_value)
                if value is None:
                    continue
                text = template.claim.format(name=_in_prose(name, True), value=value, article=_article(value))
                evidence_id += 1
                evidence = [[[annotation_id, evidence_id, fever_page_id(p.title), p.fact_sentences[template.fact]]]]
            if text in seen:
                continue
            seen.add(text)
            claims.append(
                {
                    "id": claim_id,
                    "verifiable": "NOT VERIFIABLE" if label == NOT_ENOUGH_INFO else "VERIFIABLE",
                    "label": label,
                    "claim": text,
                    "evidence": evidence,
                }
            )
            break
    return claims
