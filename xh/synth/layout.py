"""The world's spec, which kind each page index is, the seeded hashes, and the name pools.

    from xh.synth.layout import WorldSpec, kind_of, kind_counts
    spec = WorldSpec(num_docs=2000, seed=13)
    kind_of(0), kind_counts(spec)["person"]     # ('person', 900)

Everything here is computed from the spec and a page index alone: the kind of page i, its
position among the pages of its kind, and (through `_layout(spec)`, cached per spec) the name
pool it draws its name from. `xh.synth.names` turns a pool slot into a title.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from functools import lru_cache

from xh.synth.words import (
    ADJECTIVES,
    BAND_NOUNS,
    BAND_YEARS,
    BIRTH_YEARS,
    BORROWED_STEMS,
    CITY_ENDINGS,
    CITY_ONSETS,
    CITY_PATTERNS,
    COMPANY_SUFFIXES,
    COUNTRIES,
    FILM_NOUNS,
    FILM_YEARS,
    FIRST_NAMES,
    MORE_COUNTRIES,
    OCCUPATIONS,
    ORG_FOUNDING_YEARS,
    SURNAMES,
    UNIVERSITY_PATTERNS,
)

# --------------------------------------------------------------------------------------------
# The spec and the kinds of entity
# --------------------------------------------------------------------------------------------

MIN_DOCS = 20
# HotpotQA's Wikipedia (5.23M abstracts) with room to spare; every name pool has enough rounds up
# to here (`_pool` checks, a test checks at this size).
MAX_DOCS = 5_500_000


@dataclass(frozen=True)
class WorldSpec:
    """Everything the world depends on: its size and its seed."""

    num_docs: int
    seed: int = 13

    def __post_init__(self) -> None:
        if isinstance(self.num_docs, bool) or not isinstance(self.num_docs, int):
            raise ValueError(f"num_docs must be an int between {MIN_DOCS:,} and {MAX_DOCS:,}, got {self.num_docs!r}")
        if not MIN_DOCS <= self.num_docs <= MAX_DOCS:
            raise ValueError(f"num_docs must be between {MIN_DOCS:,} and {MAX_DOCS:,} documents, got {self.num_docs:,}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ValueError(f"seed must be an int, got {self.seed!r}")


PERSON, CITY, ORGANISATION, FILM, BAND = "person", "city", "organisation", "film", "band"
KINDS = (PERSON, CITY, ORGANISATION, FILM, BAND)

# Kinds repeat in this cycle of 20 page indices: 9 people, 3 cities, 3 organisations, 3 films,
# 2 bands. Any world of 20 or more pages has every kind, and the kind of page i is i's slot.
KIND_CYCLE = (
    PERSON,
    CITY,
    PERSON,
    ORGANISATION,
    PERSON,
    FILM,
    PERSON,
    BAND,
    PERSON,
    CITY,
    ORGANISATION,
    PERSON,
    FILM,
    PERSON,
    CITY,
    ORGANISATION,
    PERSON,
    BAND,
    FILM,
    PERSON,
)
_CYCLE = len(KIND_CYCLE)
_SLOTS = {kind: tuple(s for s, k in enumerate(KIND_CYCLE) if k == kind) for kind in KINDS}
_RANK_IN_KIND = tuple(_SLOTS[k].index(s) for s, k in enumerate(KIND_CYCLE))

# Within a kind, every n-th entity is of a special sort: universities among organisations,
# films and bands named after a city.
UNIVERSITY_EVERY = 4
CITY_NAMED_FILM_EVERY = 6
CITY_NAMED_BAND_EVERY = 5


def kind_of(i: int) -> str:
    """The kind of page `i`."""
    return KIND_CYCLE[i % _CYCLE]


def _local_index(i: int) -> int:
    """Position of page i among the pages of its kind."""
    q, r = divmod(i, _CYCLE)
    return q * len(_SLOTS[KIND_CYCLE[r]]) + _RANK_IN_KIND[r]


def _global_index(kind: str, local: int) -> int:
    """Inverse of `_local_index`: the page index of the `local`-th entity of `kind`."""
    slots = _SLOTS[kind]
    q, m = divmod(local, len(slots))
    return q * _CYCLE + slots[m]


def _kind_count(kind: str, num_docs: int) -> int:
    q, r = divmod(num_docs, _CYCLE)
    return q * len(_SLOTS[kind]) + sum(1 for s in _SLOTS[kind] if s < r)


def kind_counts(spec: WorldSpec) -> dict[str, int]:
    """How many pages of each kind the world has."""
    return {kind: _kind_count(kind, spec.num_docs) for kind in KINDS}


def _split(local: int, every: int) -> tuple[bool, int]:
    """(is special, index among its sort) for the `local`-th entity when every n-th is special."""
    if local % every == 0:
        return True, local // every
    return False, local - local // every - 1


def _join(special: bool, m: int, every: int) -> int:
    return m * every if special else m + m // (every - 1) + 1


def _split_counts(count: int, every: int) -> tuple[int, int]:
    special = (count + every - 1) // every
    return special, count - special


# --------------------------------------------------------------------------------------------
# Hashing: every random choice is seeded from (seed, index, salt), never from global state.
# --------------------------------------------------------------------------------------------

_MASK64 = (1 << 64) - 1


def _mix64(*values: int) -> int:
    """A 64-bit hash of some integers (splitmix64 steps)."""
    h = 0x9E3779B97F4A7C15
    for v in values:
        h = (h ^ (v & _MASK64)) + 0x9E3779B97F4A7C15 & _MASK64
        h = (h ^ (h >> 30)) * 0xBF58476D1CE4E5B9 & _MASK64
        h = (h ^ (h >> 27)) * 0x94D049BB133111EB & _MASK64
        h ^= h >> 31
    return h


def _unit(*values: int) -> float:
    """A float in [0, 1) hashed from some integers."""
    return _mix64(*values) / 18446744073709551616.0


def _skewed(rng: random.Random, n: int, power: float) -> int:
    """An index in range(n), low indices more likely: a few popular cities, prolific directors."""
    return min(n - 1, int(n * rng.random() ** power))


# Salts keep the hash streams of different uses apart.
_SALT_PAGE, _SALT_COUNTRY, _SALT_QUESTIONS, _SALT_CLAIMS = 1, 2, 3, 4


# --------------------------------------------------------------------------------------------
# Name pools. Each sort of entity draws base names from a "name pool": a mixed-radix product of word
# lists (first name x surname, pattern x onset x ending, ...). Entity m of the sort gets slot
# q = order(m); base name scatter(q mod size), and round q // size. Round 0 names are plain; a
# later round adds a Wikipedia-style disambiguator ("(born 1972)", ", Norway", "(1987 film)")
# that is distinct for each round, so titles are unique and computable from the index alone.
# Worlds past about 1.7M pages run out of the first disambiguators of people and cities; their
# later rounds use forms no smaller world has ("(painter, born 1972)", ", Sweden"), so a pool's
# slots, and every world that fits the first forms, are the same as before those forms existed.
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Shuffle:
    """x -> (mult * x + shift) mod size: a cheap invertible shuffle of range(size)."""

    size: int
    mult: int
    shift: int
    inverse_mult: int

    @staticmethod
    def make(size: int, salt: int) -> _Shuffle:
        size = max(size, 1)
        if size == 1:
            return _Shuffle(1, 1, 0, 1)
        # near the golden ratio so that neighbouring inputs land far apart
        mult = (int(size * 0.6180339887498949) + salt % 1009) % size or 1
        while math.gcd(mult, size) != 1:
            mult = mult + 1 if mult + 1 < size else 1
        return _Shuffle(size, mult, (salt >> 20) % size, pow(mult, -1, size))

    def forward(self, x: int) -> int:
        return (self.mult * x + self.shift) % self.size

    def backward(self, y: int) -> int:
        return (y - self.shift) * self.inverse_mult % self.size


@dataclass(frozen=True)
class _NamePool:
    """Gives `count` entities of one sort base names from `size` possible ones, round by round."""

    style: str  # which naming function turns (base, round) into a title
    kind: str
    every: int  # 0: the whole kind; else this sort is every n-th (special) or the rest
    special: bool
    count: int
    radix: tuple[int, ...]  # the word lists the base index is a mixed-radix number over
    order: _Shuffle
    scatter: _Shuffle

    @property
    def size(self) -> int:
        return math.prod(self.radix)

    @property
    def rounds(self) -> int:
        return -(-self.count // self.size) if self.count else 0

    def slot(self, m: int) -> tuple[int, int]:
        """(base index, round) of entity m of this sort."""
        q = self.order.forward(m)
        size = self.scatter.size
        return self.scatter.forward(q % size), q // size

    def holder(self, base: int, round_: int) -> int | None:
        """The entity holding base name `base` in round `round_`, if the world has one."""
        q = round_ * self.scatter.size + self.scatter.backward(base)
        return self.order.backward(q) if q < self.count else None

    def holders(self, base: int) -> int:
        """How many entities of this sort share base name `base`."""
        q0 = self.scatter.backward(base)
        return 0 if q0 >= self.count else (self.count - q0 - 1) // self.scatter.size + 1

    def page_index(self, m: int) -> int:
        local = _join(self.special, m, self.every) if self.every else m
        return _global_index(self.kind, local)


@dataclass(frozen=True)
class _Layout:
    """Per-world bookkeeping derived from the spec: kind counts and name pools."""

    counts: dict
    persons: _NamePool
    cities: _NamePool
    universities: _NamePool
    companies: _NamePool
    city_films: _NamePool
    phrase_films: _NamePool
    city_bands: _NamePool
    phrase_bands: _NamePool
    named_cities: int  # cities holding a round-0 name: films, bands, universities borrow these
    page_salt: int  # page i seeds its random.Random with page_salt + i


# How many rounds (distinct disambiguators) each naming style supports.
PERSON_SINGLE_ROUNDS = 2 * min(len(OCCUPATIONS), BIRTH_YEARS[1])  # then "(painter, born 1972)"
CITY_FIRST_ROUNDS = len(COUNTRIES) + 1  # then MORE_COUNTRIES
_MAX_ROUNDS = {
    "person": PERSON_SINGLE_ROUNDS + len(OCCUPATIONS) * BIRTH_YEARS[1],
    "city": CITY_FIRST_ROUNDS + len(MORE_COUNTRIES),
    "university": ORG_FOUNDING_YEARS[1] + 1,
    "company": ORG_FOUNDING_YEARS[1] + 2,
    "city_film": FILM_YEARS[1] + 1,
    "phrase_film": FILM_YEARS[1] + 2,
    "city_band": BAND_YEARS[1] + 1,
    "phrase_band": BAND_YEARS[1] + 2,
}


def _pool(
    spec: WorldSpec, style: str, kind: str, every: int, special: bool, count: int, radix: tuple[int, ...], salt: int
) -> _NamePool:
    size = math.prod(radix)
    pool = _NamePool(
        style=style,
        kind=kind,
        every=every,
        special=special,
        count=count,
        radix=radix,
        order=_Shuffle.make(count, _mix64(spec.seed, salt, 1)),
        scatter=_Shuffle.make(size, _mix64(spec.seed, salt, 2)),
    )
    if pool.rounds > _MAX_ROUNDS[style]:  # cannot happen up to MAX_DOCS; guards edits to the word lists
        raise RuntimeError(f"name pool {style!r} needs {pool.rounds} rounds, supports {_MAX_ROUNDS[style]}")
    return pool


@lru_cache(maxsize=16)
def _layout(spec: WorldSpec) -> _Layout:
    counts = kind_counts(spec)
    n_city_stems = len(CITY_ONSETS) * len(CITY_ENDINGS)
    cities = _pool(
        spec, "city", CITY, 0, False, counts[CITY], (len(CITY_PATTERNS), len(CITY_ONSETS), len(CITY_ENDINGS)), 11
    )
    named_cities = min(cities.count, cities.size)
    n_univ, n_comp = _split_counts(counts[ORGANISATION], UNIVERSITY_EVERY)
    n_city_films, n_phrase_films = _split_counts(counts[FILM], CITY_NAMED_FILM_EVERY)
    n_city_bands, n_phrase_bands = _split_counts(counts[BAND], CITY_NAMED_BAND_EVERY)
    qualifiers = len(ADJECTIVES) + BORROWED_STEMS
    return _Layout(
        counts=counts,
        persons=_pool(spec, "person", PERSON, 0, False, counts[PERSON], (len(FIRST_NAMES), len(SURNAMES)), 10),
        cities=cities,
        universities=_pool(
            spec,
            "university",
            ORGANISATION,
            UNIVERSITY_EVERY,
            True,
            n_univ,
            (len(UNIVERSITY_PATTERNS), named_cities),
            12,
        ),
        companies=_pool(
            spec,
            "company",
            ORGANISATION,
            UNIVERSITY_EVERY,
            False,
            n_comp,
            (len(COMPANY_SUFFIXES), len(SURNAMES) + n_city_stems),
            13,
        ),
        city_films=_pool(spec, "city_film", FILM, CITY_NAMED_FILM_EVERY, True, n_city_films, (named_cities,), 14),
        phrase_films=_pool(
            spec, "phrase_film", FILM, CITY_NAMED_FILM_EVERY, False, n_phrase_films, (len(FILM_NOUNS), qualifiers), 15
        ),
        city_bands=_pool(spec, "city_band", BAND, CITY_NAMED_BAND_EVERY, True, n_city_bands, (named_cities,), 16),
        phrase_bands=_pool(
            spec, "phrase_band", BAND, CITY_NAMED_BAND_EVERY, False, n_phrase_bands, (len(BAND_NOUNS), qualifiers), 17
        ),
        named_cities=named_cities,
        page_salt=_mix64(spec.seed, _SALT_PAGE) << 32,
    )


def _pool_of(layout: _Layout, i: int) -> tuple[_NamePool, int]:
    """The name pool page i draws from, and its index in that pool."""
    kind, local = kind_of(i), _local_index(i)
    if kind == PERSON:
        return layout.persons, local
    if kind == CITY:
        return layout.cities, local
    if kind == ORGANISATION:
        special, m = _split(local, UNIVERSITY_EVERY)
        return (layout.universities if special else layout.companies), m
    if kind == FILM:
        special, m = _split(local, CITY_NAMED_FILM_EVERY)
        return (layout.city_films if special else layout.phrase_films), m
    special, m = _split(local, CITY_NAMED_BAND_EVERY)
    return (layout.city_bands if special else layout.phrase_bands), m
