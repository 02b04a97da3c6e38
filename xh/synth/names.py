"""Names: a page's title, base name and short form, computed from its index alone.

    from xh.synth import WorldSpec, name_of, title
    spec = WorldSpec(num_docs=2000, seed=13)
    title(spec, 5)              # 'Radmere Bay (film)': a film named after a city of the world
    name_of(spec, 0).short      # 'Kessler': the shortest surface form an anchor may use

Entity m of a name pool (`xh.synth.layout`) has a base name and a round; round 0 is the plain
name, a later round adds a Wikipedia-style disambiguator ("(born 1972)", ", Norway",
"(1987 film)") that is distinct for each round, so titles are unique. Only worlds past about 1.7M
pages reach the forms after those ("(painter, born 1972)", ", Sweden").
"""

from __future__ import annotations

from typing import NamedTuple

from xh.synth import words
from xh.synth.layout import (
    _SALT_COUNTRY,
    CITY_FIRST_ROUNDS,
    PERSON_SINGLE_ROUNDS,
    WorldSpec,
    _Layout,
    _layout,
    _NamePool,
    _pool_of,
    _unit,
)


class Name(NamedTuple):
    """The names of one entity."""

    title: str  # unique page title, with disambiguator where needed
    base: str  # the title without disambiguator: what the page's first sentence calls it
    short: str  # shortest usual surface form (a person's surname; else the base)
    forced: tuple  # ((attribute, value), ...) the disambiguator commits the entity to; () if none
    shared: bool  # another entity (any kind) has the same base name


def _forced_year(years: tuple[int, int], base: int, k: int) -> int:
    first, span = years
    return first + (base * 7 + 37 * k) % span


def _round_country(base: int, round_: int) -> int:
    """The country (index into ALL_COUNTRIES) that round `round_` >= 1 of city name `base` names."""
    if round_ < CITY_FIRST_ROUNDS:
        return (base + round_ - 1) % len(words.COUNTRIES)
    return len(words.COUNTRIES) + (base + round_ - CITY_FIRST_ROUNDS) % len(words.MORE_COUNTRIES)


def _city_stem(stem: int) -> str:
    return words.CITY_ONSETS[stem % len(words.CITY_ONSETS)] + words.CITY_ENDINGS[stem // len(words.CITY_ONSETS)]


def _borrowed_stem(k: int) -> str:
    # spread the borrowed stems over the whole stem list
    return _city_stem(k * 8 % (len(words.CITY_ONSETS) * len(words.CITY_ENDINGS)))


def _city_base(base: int) -> str:
    pattern, stem = base % len(words.CITY_PATTERNS), base // len(words.CITY_PATTERNS)
    return words.CITY_PATTERNS[pattern].format(_city_stem(stem))


def _phrase(base: int, nouns: tuple[str, ...], film: bool) -> str:
    noun, qualifier = nouns[base % len(nouns)], base // len(nouns)
    if qualifier < len(words.ADJECTIVES):
        return f"The {words.ADJECTIVES[qualifier]} {noun}"
    stem = _borrowed_stem(qualifier - len(words.ADJECTIVES))
    return f"The {noun} of {stem}" if film else f"{stem} {noun}"


def _named_city_base(layout: _Layout, t: int) -> int:
    """Base index of the t-th city holding a round-0 name."""
    return layout.cities.scatter.forward(t)


def _city_namesakes(layout: _Layout, t: int) -> int:
    """Films and bands named after the t-th round-0 city."""
    return layout.city_films.holders(t) + layout.city_bands.holders(t)


def _name_in_pool(layout: _Layout, pool: _NamePool, m: int) -> Name:
    base, round_ = pool.slot(m)
    style = pool.style
    shared = pool.holders(base) > 1
    if style == "person":
        first, last = words.FIRST_NAMES[base % len(words.FIRST_NAMES)], words.SURNAMES[base // len(words.FIRST_NAMES)]
        text = f"{first} {last}"
        if round_ == 0:
            return Name(text, text, last, (), shared)
        if round_ >= PERSON_SINGLE_ROUNDS:  # both: each (occupation, year) pair once per name
            k = round_ - PERSON_SINGLE_ROUNDS
            occupation = (base + k) % len(words.OCCUPATIONS)
            year = _forced_year(words.BIRTH_YEARS, base, k // len(words.OCCUPATIONS))
            forced = (("occupation", occupation), ("birth_year", year))
            return Name(f"{text} ({words.OCCUPATIONS[occupation]}, born {year})", text, last, forced, shared)
        if round_ % 2:
            occupation = (base + round_ // 2) % len(words.OCCUPATIONS)
            forced = (("occupation", occupation),)
            return Name(f"{text} ({words.OCCUPATIONS[occupation]})", text, last, forced, shared)
        year = _forced_year(words.BIRTH_YEARS, base, round_ // 2 - 1)
        return Name(f"{text} (born {year})", text, last, (("birth_year", year),), shared)
    if style == "city":
        text = _city_base(base)
        if round_ == 0:
            t = pool.scatter.backward(base)  # round-0 cities are numbered by their slot
            return Name(text, text, text, (), shared or _city_namesakes(layout, t) > 0)
        country = _round_country(base, round_)
        return Name(f"{text}, {words.ALL_COUNTRIES[country][0]}", text, text, (("country", country),), True)
    if style in ("city_film", "city_band"):
        text = _city_base(_named_city_base(layout, base))
        label = "film" if style == "city_film" else "band"
        if round_ == 0:
            return Name(f"{text} ({label})", text, text, (), True)
        years = words.FILM_YEARS if label == "film" else words.BAND_YEARS
        year = _forced_year(years, base, round_ - 1)
        attr = "release_year" if label == "film" else "formation_year"
        return Name(f"{text} ({year} {label})", text, text, ((attr, year),), True)
    if style in ("phrase_film", "phrase_band"):
        film = style == "phrase_film"
        text = _phrase(base, words.FILM_NOUNS if film else words.BAND_NOUNS, film)
        label = "film" if film else "band"
        if round_ == 0:
            return Name(text, text, text, (), shared)
        if round_ == 1:
            return Name(f"{text} ({label})", text, text, (), shared)
        years = words.FILM_YEARS if film else words.BAND_YEARS
        year = _forced_year(years, base, round_ - 2)
        attr = "release_year" if film else "formation_year"
        return Name(f"{text} ({year} {label})", text, text, ((attr, year),), shared)
    if style == "university":
        pattern, t = base % len(words.UNIVERSITY_PATTERNS), base // len(words.UNIVERSITY_PATTERNS)
        text = words.UNIVERSITY_PATTERNS[pattern].format(_city_base(_named_city_base(layout, t)))
        if round_ == 0:
            return Name(text, text, text, (), shared)
        year = _forced_year(words.ORG_FOUNDING_YEARS, base, round_ - 1)
        return Name(f"{text} (founded {year})", text, text, (("founding_year", year),), shared)
    # company
    suffix, stem = base % len(words.COMPANY_SUFFIXES), base // len(words.COMPANY_SUFFIXES)
    stem_text = words.SURNAMES[stem] if stem < len(words.SURNAMES) else _city_stem(stem - len(words.SURNAMES))
    text = f"{stem_text} {words.COMPANY_SUFFIXES[suffix][0]}"  # short form: the stem ("Quinn")
    if round_ == 0:
        return Name(text, text, stem_text, (), shared)
    if round_ == 1:
        return Name(f"{text} (company)", text, stem_text, (), shared)
    year = _forced_year(words.ORG_FOUNDING_YEARS, base, round_ - 2)
    return Name(f"{text} (founded {year})", text, stem_text, (("founding_year", year),), shared)


def _name(layout: _Layout, i: int) -> Name:
    pool, m = _pool_of(layout, i)
    return _name_in_pool(layout, pool, m)


def _check_index(spec: WorldSpec, i: int) -> None:
    if not 0 <= i < spec.num_docs:
        raise IndexError(f"page index {i} out of range for a world of {spec.num_docs:,} pages")


def name_of(spec: WorldSpec, i: int) -> Name:
    """All names of page i (title, base name, short form), without generating the page."""
    _check_index(spec, i)
    return _name(_layout(spec), i)


def title(spec: WorldSpec, i: int) -> str:
    """The title of page i: the fast path, names only."""
    return name_of(spec, i).title


def _city_country(spec: WorldSpec, layout: _Layout, city_local: int) -> int:
    """Country of a city: cheap (a hash), so people born there can take its nationality."""
    base, round_ = layout.cities.slot(city_local)
    if round_:
        return _round_country(base, round_)  # as its title says
    # some countries have many more cities than others
    return int(len(words.COUNTRIES) * _unit(spec.seed, _SALT_COUNTRY, city_local) ** 1.7)


# How questions and claims name a page in their own text.


def _display_name(layout: _Layout, i: int) -> str:
    """What a question or claim calls page i: its base name, or its title where others share the base."""
    pool, m = _pool_of(layout, i)
    name = _name_in_pool(layout, pool, m)
    return name.title if pool.holders(pool.slot(m)[0]) > 1 else name.base


def _in_prose(name: str, sentence_start: bool = False) -> str:
    """A name as running text uses it: "the University of X" (titles drop the article)."""
    if name.startswith("University of"):
        return ("The " if sentence_start else "the ") + name
    return name
