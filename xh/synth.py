"""A generated mini-Wikipedia: people, cities, organisations, films and bands, with questions.

The world is a pure function of `WorldSpec(num_docs, seed)`. Page `i` is computed from
`(seed, i)` alone (its names, facts and the indices of the pages it links to), so any slice
of the world can be generated on its own and a large world is written as a stream of shards.

Write one with `xh synth --set synth.num_docs=2000` (shards in parallel on Ray, see
`workflows/synth.py`), or from Python:

    from xh.synth import WorldSpec, page, make_questions, write_world, output_under
    spec = WorldSpec(num_docs=2000, seed=13)
    print(page(spec, 0).sentences)        # one page, without generating the others
    questions = make_questions(spec, n=50, seed=0)
    summary = write_world(spec, output_under("/tmp/synth-world"))

What is written (relative to the root the `open_output` callback writes under):

    wiki/AA/wiki_00.bz2 ...      pages in the HotpotQA processed-Wikipedia format (bz2 JSON lines)
    hotpot/questions.json        HotpotQA questions (official distractor format, a JSON array)
    fever/claims.jsonl           FEVER claims (SUPPORTS / REFUTES / NOT ENOUGH INFO)
    fever/wiki-pages/wiki-000.jsonl ...  the same pages in the FEVER wiki-pages format
    truth/links/links-00000.jsonl.bz2 ...  every hyperlink: source, target, anchor, sentence index
    truth/summary.json           counts and paths (`WorldSummary`)

Why it is not too easy: names are built from shared word lists (many "Port ..." cities, many
people called Orla or Quinn), films and bands reuse city names ("Port Arden (film)"), anchors
are sometimes only a surname or a name without its disambiguator, and many people share a
birthplace, a nationality or a birth year. Questions draw their distractor paragraphs from
look-alike pages.

Standard library only (numpy is not needed); nothing happens at import.
"""

from __future__ import annotations

import bz2
import json
import math
import random
import re
import queue
import threading
import urllib.parse
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from typing import IO, Callable, ContextManager, Iterable, Iterator, NamedTuple

MIN_DOCS = 20
MAX_DOCS = 1_000_000

# --------------------------------------------------------------------------------------------
# Word lists. Lists that feed different kinds of names are kept disjoint (a test checks it), so
# that two kinds can only share a title where the world reuses a name on purpose.
# --------------------------------------------------------------------------------------------

FEMALE_FIRST_NAMES = (
    "Orla", "Mara", "Lena", "Ada", "Iris", "Nora", "Clara", "Elena", "Freya", "Greta",
    "Hanna", "Ines", "Julia", "Kira", "Lucia", "Maya", "Nadia", "Olga", "Petra", "Rosa",
    "Sara", "Tara", "Vera", "Wanda", "Yara", "Zoe", "Alma", "Beatrix", "Celia", "Dora",
    "Edith", "Fiona", "Gemma", "Helga", "Ida", "Jana", "Karin", "Lotte", "Mina", "Nell",
    "Paula", "Rhea", "Selma", "Thea", "Ulla", "Viola", "Agnes", "Bianca", "Carmen", "Daria",
    "Elsa", "Flora", "Gina", "Hedda", "Ilse", "Leah", "Maren", "Nina", "Odile", "Pia",
)
MALE_FIRST_NAMES = (
    "Aaron", "Bruno", "Caspar", "Dmitri", "Emil", "Felix", "Gustav", "Hugo", "Igor", "Jonas",
    "Karl", "Lars", "Magnus", "Nico", "Oskar", "Pavel", "Rafael", "Stefan", "Tobias", "Viktor",
    "Anton", "Bram", "Cyril", "Dario", "Elias", "Fabian", "Gideon", "Henrik", "Ivo", "Jasper",
    "Kai", "Leon", "Matteo", "Nils", "Otto", "Pieter", "Quentin", "Rolf", "Silas", "Theo",
    "Ulrich", "Vilem", "Walter", "Xavier", "Yannick", "Zoltan", "Adrian", "Bastian", "Conrad", "Dominik",
    "Erik", "Florian", "Georg", "Hector", "Ismael", "Julian", "Konrad", "Lukas", "Milo", "Oren",
)
FIRST_NAMES = FEMALE_FIRST_NAMES + MALE_FIRST_NAMES

SURNAMES = (
    "Brennan", "Quinn", "Hart", "Novak", "Keller", "Lindqvist", "Moreau", "Okafor", "Petrov", "Ramos",
    "Schmidt", "Tanaka", "Vidal", "Weber", "Yilmaz", "Zeller", "Abbott", "Barlow", "Castell", "Draper",
    "Ellery", "Fennell", "Garrow", "Halloran", "Ingram", "Jessop", "Kessler", "Lorimer", "Marchetti", "Nyberg",
    "Oakes", "Pruitt", "Quayle", "Rourke", "Sandoval", "Thorne", "Underhill", "Varga", "Whitlock", "Yates",
    "Aldous", "Becker", "Carver", "Dalton", "Esposito", "Farrow", "Gallagher", "Hennessy", "Ivanov", "Jansen",
    "Kowalski", "Larsen", "Mendez", "Nakamura", "Oliveira", "Pereira", "Quiroga", "Rossi", "Sorensen", "Tremblay",
    "Ueda", "Vasquez", "Wagner", "Xu", "Young", "Zimmer", "Achebe", "Bauer", "Coppola", "Duval",
    "Engel", "Fischer", "Gruber", "Hoffman", "Iqbal", "Jovanovic", "Kaur", "Lambert", "Moretti", "Nilsen",
    "Osei", "Pajari", "Rahman", "Sato", "Toivonen", "Umarov", "Valdez", "Wolff", "Yusuf", "Zamora",
    "Arnaud", "Berger", "Costa", "Dubois", "Eklund", "Ferreira", "Galli", "Haas", "Ibarra", "Jaramillo",
    "Kruger", "Lehmann", "Mancini", "Navarro", "Olsen", "Pavlov", "Renard", "Silva", "Takahashi", "Urban",
    "Vogel", "Winter", "Yamada", "Zito", "Asante", "Bianchi", "Conti", "Dimitrov", "Eriksen", "Fontaine",
    "Giordano", "Horvat", "Ionescu", "Jung", "Kovacs", "Lucas", "Marsh", "Nowak", "Ortega", "Pike",
    "Reyes", "Stone", "Tamura", "Ulloa", "Vance", "Walsh", "Yoon", "Zorn", "Ashdown", "Blake",
    "Crane", "Doyle", "Emery", "Frost", "Gage", "Hale", "Irwin", "Joyce", "Kemp", "Lowe",
    "Mercer", "Nash", "Orr", "Pryce", "Rowe", "Sykes", "Tate", "Voss", "Wren", "Yeats",
)

# City names: a stem from two syllables ("Ar" + "den") inside a pattern ("Port {}").
CITY_ONSETS = (
    "Ar", "Bel", "Cal", "Dun", "El", "Fal", "Gar", "Hal", "Ing", "Kel",
    "Lan", "Mar", "Nor", "Ol", "Pen", "Ros", "Sal", "Tor", "Ul", "Val",
    "Wes", "Ash", "Brom", "Carr", "Del", "Eb", "Fen", "Glen", "Hav", "Kin",
    "Lin", "Mel", "Ned", "Or", "Pel", "Rad", "Sel", "Tam", "Ver", "Wil",
)
CITY_ENDINGS = (
    "den", "ford", "mouth", "wick", "ley", "more", "ton", "bury", "field", "haven",
    "stead", "brook", "mere", "gate", "holm", "by", "worth", "ham", "dale", "burn",
    "croft", "hurst", "well", "stone", "moor", "bridge", "port", "shaw", "wood", "cliff",
)
CITY_PATTERNS = (
    "{}", "Port {}", "{} Falls", "New {}", "{} Springs", "Fort {}",
    "Lake {}", "{} Bay", "Mount {}", "{} Heights", "East {}", "{} Junction",
)
SETTLEMENT_TYPES = ("city", "town", "port city", "market town", "village")
RIVERS = ("Aune", "Vessa", "Tarn", "Lusk", "Orme", "Calder", "Wend", "Isel", "Maro", "Tessel")

# (country, demonym): real countries, invented cities.
COUNTRIES = (
    ("Ireland", "Irish"), ("Norway", "Norwegian"), ("Portugal", "Portuguese"), ("Canada", "Canadian"),
    ("Chile", "Chilean"), ("Austria", "Austrian"), ("Finland", "Finnish"), ("Greece", "Greek"),
    ("Kenya", "Kenyan"), ("Japan", "Japanese"), ("Poland", "Polish"), ("Scotland", "Scottish"),
    ("Brazil", "Brazilian"), ("Denmark", "Danish"), ("Hungary", "Hungarian"), ("Iceland", "Icelandic"),
    ("Mexico", "Mexican"), ("Peru", "Peruvian"), ("Belgium", "Belgian"), ("Estonia", "Estonian"),
)

OCCUPATIONS = (
    "architect", "painter", "novelist", "physicist", "composer", "journalist", "engineer", "actor",
    "singer", "photographer", "economist", "chemist", "historian", "poet", "sculptor", "politician",
    "mathematician", "cellist", "diplomat", "businessperson",
)

# Companies: "<surname or city stem> <suffix>"; the suffix fixes the industry.
COMPANY_SUFFIXES = (
    ("Motors", "automotive"), ("Airlines", "aviation"), ("Records", "music"),
    ("Pictures", "film production"), ("Pharmaceuticals", "pharmaceutical"), ("Foods", "food processing"),
    ("Steelworks", "steel"), ("Software", "software"), ("Shipping", "shipping"),
    ("Energy", "energy"), ("Publishing", "publishing"), ("Textiles", "textile"),
)
UNIVERSITY_PATTERNS = ("University of {}", "{} State University", "{} Institute of Technology", "{} College")

# Films: "The <adjective> <noun>" or "The <noun> of <city stem>"; bands: "The <adjective> <plural>"
# or "<city stem> <plural>". Adjectives are shared by films and bands on purpose.
ADJECTIVES = (
    "Silent", "Crimson", "Hollow", "Broken", "Golden", "Distant", "Burning", "Quiet", "Hidden", "Last",
    "Frozen", "Wild", "Bitter", "Secret", "Endless", "Fallen", "Pale", "Restless", "Scarlet", "Shattered",
    "Sleeping", "Velvet", "Wandering", "Forgotten", "Lonely", "Midnight", "Northern", "Painted", "Savage", "Silver",
    "Stolen", "Sunken", "Twisted", "Whispering", "Wintry", "Amber", "Black", "Blue", "Copper", "Dark",
    "Early", "Final", "Gentle", "Iron", "Lost", "Narrow", "Open", "Long", "Paper", "Glass",
)
FILM_NOUNS = (
    "Harbor", "Orchard", "Mirror", "River", "Garden", "Lantern", "Horizon", "Kingdom", "Letter", "Promise",
    "Season", "Shadow", "Station", "Summer", "Tide", "Valley", "Voyage", "Window", "Witness", "Anchor",
    "Archive", "Border", "Canyon", "Carnival", "Castle", "Circle", "Compass", "Crown", "Desert", "Dream",
    "Echo", "Empire", "Engine", "Feather", "Fire", "Forest", "Frontier", "Game", "Gate", "Heart",
    "Hour", "House", "Island", "Journey", "Key", "Ladder", "Lighthouse", "Machine", "Meadow", "Moon",
    "Mountain", "Night", "Ocean", "Passage", "Road", "Room", "Sky", "Storm", "Street", "Tower",
)
BAND_NOUNS = (
    "Foxes", "Wolves", "Ravens", "Sparrows", "Pilots", "Strangers", "Saints", "Sailors", "Tigers", "Rebels",
    "Giants", "Dreamers", "Drifters", "Hounds", "Owls", "Lions", "Comets", "Rockets", "Bandits", "Monarchs",
    "Hermits", "Jackals", "Kings", "Magpies", "Mariners", "Nomads", "Outlaws", "Pirates", "Poets", "Rivals",
    "Rovers", "Seekers", "Skylarks", "Swans", "Thieves", "Travellers", "Vandals", "Wanderers", "Wizards", "Youths",
)
# How many city stems films and bands may borrow ("The Tide of Belford", "Arden Wolves").
BORROWED_STEMS = 150

FILM_GENRES = (
    "drama", "comedy", "thriller", "western", "musical", "horror", "documentary", "science fiction",
    "romance", "crime",
)
BAND_GENRES = ("rock", "jazz", "folk", "punk", "synth-pop", "indie", "metal", "reggae", "blues", "electronic")
REVIEWS = ("mixed", "positive", "negative", "lukewarm")
CONSORTIA = ("Harbour", "Meridian", "Northgate", "Compass", "Lighthouse")

# --------------------------------------------------------------------------------------------
# The spec and the kinds of entity
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WorldSpec:
    """Everything the world depends on: its size and its seed."""

    num_docs: int
    seed: int = 13

    def __post_init__(self) -> None:
        if isinstance(self.num_docs, bool) or not isinstance(self.num_docs, int):
            raise ValueError(f"num_docs must be an int between {MIN_DOCS:,} and {MAX_DOCS:,}, got {self.num_docs!r}")
        if not MIN_DOCS <= self.num_docs <= MAX_DOCS:
            raise ValueError(
                f"num_docs must be between {MIN_DOCS:,} and {MAX_DOCS:,} documents, got {self.num_docs:,}"
            )
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ValueError(f"seed must be an int, got {self.seed!r}")


PERSON, CITY, ORGANISATION, FILM, BAND = "person", "city", "organisation", "film", "band"
KINDS = (PERSON, CITY, ORGANISATION, FILM, BAND)

# Kinds repeat in this cycle of 20 page indices: 9 people, 3 cities, 3 organisations, 3 films,
# 2 bands. Any world of 20 or more pages has every kind, and the kind of page i is i's slot.
KIND_CYCLE = (
    PERSON, CITY, PERSON, ORGANISATION, PERSON, FILM, PERSON, BAND, PERSON, CITY,
    ORGANISATION, PERSON, FILM, PERSON, CITY, ORGANISATION, PERSON, BAND, FILM, PERSON,
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
# Names. Each sort of entity draws base names from a "name pool": a mixed-radix product of word
# lists (first name x surname, pattern x onset x ending, ...). Entity m of the sort gets slot
# q = order(m); base name scatter(q mod size), and round q // size. Round 0 names are plain; a
# later round adds a Wikipedia-style disambiguator ("(born 1972)", ", Norway", "(1987 film)")
# that is distinct for each round, so titles are unique and computable from the index alone.
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Shuffle:
    """x -> (mult * x + shift) mod size: a cheap invertible shuffle of range(size)."""

    size: int
    mult: int
    shift: int
    inverse_mult: int

    @staticmethod
    def make(size: int, salt: int) -> "_Shuffle":
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


# Year ranges (first year, number of years). Their lengths are coprime to 37, the stride that
# spreads the years forced by disambiguators ("(1987 film)") over the range.
BIRTH_YEARS = (1920, 81)
CITY_FOUNDING_YEARS = (1600, 301)
ORG_FOUNDING_YEARS = (1800, 216)
FILM_YEARS = (1930, 93)
BAND_YEARS = (1955, 68)

# How many rounds (distinct disambiguators) each naming style supports.
_MAX_ROUNDS = {
    "person": 2 * min(len(OCCUPATIONS), BIRTH_YEARS[1]),
    "city": len(COUNTRIES) + 1,
    "university": ORG_FOUNDING_YEARS[1] + 1,
    "company": ORG_FOUNDING_YEARS[1] + 2,
    "city_film": FILM_YEARS[1] + 1,
    "phrase_film": FILM_YEARS[1] + 2,
    "city_band": BAND_YEARS[1] + 1,
    "phrase_band": BAND_YEARS[1] + 2,
}


def _pool(spec: WorldSpec, style: str, kind: str, every: int, special: bool, count: int,
          radix: tuple[int, ...], salt: int) -> _NamePool:
    size = math.prod(radix)
    pool = _NamePool(
        style=style, kind=kind, every=every, special=special, count=count, radix=radix,
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
    cities = _pool(spec, "city", CITY, 0, False, counts[CITY],
                   (len(CITY_PATTERNS), len(CITY_ONSETS), len(CITY_ENDINGS)), 11)
    named_cities = min(cities.count, cities.size)
    n_univ, n_comp = _split_counts(counts[ORGANISATION], UNIVERSITY_EVERY)
    n_city_films, n_phrase_films = _split_counts(counts[FILM], CITY_NAMED_FILM_EVERY)
    n_city_bands, n_phrase_bands = _split_counts(counts[BAND], CITY_NAMED_BAND_EVERY)
    qualifiers = len(ADJECTIVES) + BORROWED_STEMS
    return _Layout(
        counts=counts,
        persons=_pool(spec, "person", PERSON, 0, False, counts[PERSON], (len(FIRST_NAMES), len(SURNAMES)), 10),
        cities=cities,
        universities=_pool(spec, "university", ORGANISATION, UNIVERSITY_EVERY, True, n_univ,
                           (len(UNIVERSITY_PATTERNS), named_cities), 12),
        companies=_pool(spec, "company", ORGANISATION, UNIVERSITY_EVERY, False, n_comp,
                        (len(COMPANY_SUFFIXES), len(SURNAMES) + n_city_stems), 13),
        city_films=_pool(spec, "city_film", FILM, CITY_NAMED_FILM_EVERY, True, n_city_films, (named_cities,), 14),
        phrase_films=_pool(spec, "phrase_film", FILM, CITY_NAMED_FILM_EVERY, False, n_phrase_films,
                           (len(FILM_NOUNS), qualifiers), 15),
        city_bands=_pool(spec, "city_band", BAND, CITY_NAMED_BAND_EVERY, True, n_city_bands, (named_cities,), 16),
        phrase_bands=_pool(spec, "phrase_band", BAND, CITY_NAMED_BAND_EVERY, False, n_phrase_bands,
                           (len(BAND_NOUNS), qualifiers), 17),
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


class Name(NamedTuple):
    """The names of one entity."""

    title: str  # unique page title, with disambiguator where needed
    base: str  # the title without disambiguator: what the page's first sentence calls it
    short: str  # shortest usual surface form (a person's surname; else the base)
    forced: tuple | None  # (attribute, value) the disambiguator commits the entity to
    shared: bool  # another entity (any kind) has the same base name


def _forced_year(years: tuple[int, int], base: int, k: int) -> int:
    first, span = years
    return first + (base * 7 + 37 * k) % span


def _city_stem(stem: int) -> str:
    return CITY_ONSETS[stem % len(CITY_ONSETS)] + CITY_ENDINGS[stem // len(CITY_ONSETS)]


def _borrowed_stem(k: int) -> str:
    # spread the borrowed stems over the whole stem list
    return _city_stem(k * 8 % (len(CITY_ONSETS) * len(CITY_ENDINGS)))


def _city_base(base: int) -> str:
    pattern, stem = base % len(CITY_PATTERNS), base // len(CITY_PATTERNS)
    return CITY_PATTERNS[pattern].format(_city_stem(stem))


def _phrase(base: int, nouns: tuple[str, ...], film: bool) -> str:
    noun, qualifier = nouns[base % len(nouns)], base // len(nouns)
    if qualifier < len(ADJECTIVES):
        return f"The {ADJECTIVES[qualifier]} {noun}"
    stem = _borrowed_stem(qualifier - len(ADJECTIVES))
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
        first, last = FIRST_NAMES[base % len(FIRST_NAMES)], SURNAMES[base // len(FIRST_NAMES)]
        text = f"{first} {last}"
        if round_ == 0:
            return Name(text, text, last, None, shared)
        if round_ % 2:
            occupation = (base + round_ // 2) % len(OCCUPATIONS)
            return Name(f"{text} ({OCCUPATIONS[occupation]})", text, last, ("occupation", occupation), shared)
        year = _forced_year(BIRTH_YEARS, base, round_ // 2 - 1)
        return Name(f"{text} (born {year})", text, last, ("birth_year", year), shared)
    if style == "city":
        text = _city_base(base)
        if round_ == 0:
            t = pool.scatter.backward(base)  # round-0 cities are numbered by their slot
            return Name(text, text, text, None, shared or _city_namesakes(layout, t) > 0)
        country = (base + round_ - 1) % len(COUNTRIES)
        return Name(f"{text}, {COUNTRIES[country][0]}", text, text, ("country", country), True)
    if style in ("city_film", "city_band"):
        text = _city_base(_named_city_base(layout, base))
        label = "film" if style == "city_film" else "band"
        if round_ == 0:
            return Name(f"{text} ({label})", text, text, None, True)
        years = FILM_YEARS if label == "film" else BAND_YEARS
        year = _forced_year(years, base, round_ - 1)
        attr = "release_year" if label == "film" else "formation_year"
        return Name(f"{text} ({year} {label})", text, text, (attr, year), True)
    if style in ("phrase_film", "phrase_band"):
        film = style == "phrase_film"
        text = _phrase(base, FILM_NOUNS if film else BAND_NOUNS, film)
        label = "film" if film else "band"
        if round_ == 0:
            return Name(text, text, text, None, shared)
        if round_ == 1:
            return Name(f"{text} ({label})", text, text, None, shared)
        years = FILM_YEARS if film else BAND_YEARS
        year = _forced_year(years, base, round_ - 2)
        attr = "release_year" if film else "formation_year"
        return Name(f"{text} ({year} {label})", text, text, (attr, year), shared)
    if style == "university":
        pattern, t = base % len(UNIVERSITY_PATTERNS), base // len(UNIVERSITY_PATTERNS)
        text = UNIVERSITY_PATTERNS[pattern].format(_city_base(_named_city_base(layout, t)))
        if round_ == 0:
            return Name(text, text, text, None, shared)
        year = _forced_year(ORG_FOUNDING_YEARS, base, round_ - 1)
        return Name(f"{text} (founded {year})", text, text, ("founding_year", year), shared)
    # company
    suffix, stem = base % len(COMPANY_SUFFIXES), base // len(COMPANY_SUFFIXES)
    stem_text = SURNAMES[stem] if stem < len(SURNAMES) else _city_stem(stem - len(SURNAMES))
    text = f"{stem_text} {COMPANY_SUFFIXES[suffix][0]}"  # short form: the stem ("Quinn")
    if round_ == 0:
        return Name(text, text, stem_text, None, shared)
    if round_ == 1:
        return Name(f"{text} (company)", text, stem_text, None, shared)
    year = _forced_year(ORG_FOUNDING_YEARS, base, round_ - 2)
    return Name(f"{text} (founded {year})", text, stem_text, ("founding_year", year), shared)


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
        return (base + round_ - 1) % len(COUNTRIES)  # as its title says
    # some countries have many more cities than others
    return int(len(COUNTRIES) * _unit(spec.seed, _SALT_COUNTRY, city_local) ** 1.7)


# --------------------------------------------------------------------------------------------
# Pages
# --------------------------------------------------------------------------------------------


class Link(NamedTuple):
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
    links: tuple[Link, ...]
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
        self.links: list[Link] = []
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
                self.links.append(Link(part.title, part.text, idx, part.index))
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
    forced = dict([name.forced]) if name.forced else {}
    birth_year = forced.get("birth_year", BIRTH_YEARS[0] + rng.randrange(BIRTH_YEARS[1]))
    occupation = OCCUPATIONS[forced["occupation"]] if "occupation" in forced else rng.choice(OCCUPATIONS)
    counts = layout.counts
    city_local = _skewed(rng, counts[CITY], 3.0)
    birthplace = _global_index(CITY, city_local)
    if rng.random() < 0.8:
        country = _city_country(spec, layout, city_local)
    else:
        country = rng.randrange(len(COUNTRIES))
    demonym = COUNTRIES[country][1]

    p = _ParagraphBuilder()
    p.add((f"{name.base} (born {birth_year}) is {_article(demonym)} {demonym} {occupation}.",),
          ("birth_year", "nationality", "occupation"))
    city_anchor, city_name = _anchor(layout, rng, birthplace)
    p.add((f"{he} was born in ", city_anchor, "."), ("birthplace",))
    relations = {"birthplace": birthplace}
    attributes = {
        "first_name": FIRST_NAMES[first_index], "surname": name.short, "gender": "female" if female else "male",
        "birth_year": birth_year, "occupation": occupation, "nationality": demonym,
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
    p.add((f"{name.base} is {_article(settlement)} {settlement} in {COUNTRIES[country][0]}.",), ("country",))
    p.add((f"It was founded in {founded}.",), ("founding_year",))
    attributes = {"country": COUNTRIES[country][0], "founding_year": founded, "settlement_type": settlement}
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
    forced = dict([name.forced]) if name.forced else {}
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
        p.add((f"{name.base} is {_article(industry)} {industry} company headquartered in ", hq_anchor, "."),
              ("headquarters", "industry"))
    founder_anchor, founder_name = _anchor(layout, rng, founder)
    p.add((f"It was founded in {founded} by ", founder_anchor, "."), ("founding_year", "founder"))
    relations = {"headquarters": headquarters, "founder": founder}
    attributes = {
        "organisation_type": "university" if university else "company", "industry": industry,
        "founding_year": founded, "headquarters": hq_name.title, "founder": founder_name.title,
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
    forced = dict([name.forced]) if name.forced else {}
    year = forced.get("release_year", FILM_YEARS[0] + rng.randrange(FILM_YEARS[1]))
    genre = rng.choice(FILM_GENRES)
    counts = layout.counts
    director = _global_index(PERSON, _skewed(rng, counts[PERSON], 2.0))
    filmed_in = _global_index(CITY, _skewed(rng, counts[CITY], 2.0))
    p = _ParagraphBuilder()
    d_anchor, d_name = _anchor(layout, rng, director)
    p.add((f"{name.base} is a {year} {genre} film directed by ", d_anchor, "."),
          ("release_year", "genre", "director"))
    c_anchor, c_name = _anchor(layout, rng, filmed_in)
    p.add(("It was filmed in ", c_anchor, "."), ("filmed_in",))
    relations = {"director": director, "filmed_in": filmed_in}
    attributes = {
        "release_year": year, "genre": genre, "director": d_name.title, "filmed_in": c_name.title,
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
    forced = dict([name.forced]) if name.forced else {}
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
        "genre": genre, "formation_year": year, "origin": o_name.title, "founding_member": m_name.title,
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
    PERSON: _person_page, CITY: _city_page, ORGANISATION: _organisation_page, FILM: _film_page, BAND: _band_page,
}


def page(spec: WorldSpec, i: int) -> Page:
    """Page i of the world, computed from (spec.seed, i) alone."""
    _check_index(spec, i)
    layout = _layout(spec)
    kind = KIND_CYCLE[i % _CYCLE]
    rng = random.Random(layout.page_salt + i)
    name, p, attributes, relations = _PAGE_BUILDERS[kind](spec, layout, i, _local_index(i), rng)
    return Page(
        index=i, doc_id=str(i + 1), kind=kind, title=name.title, base_name=name.base,
        sentences=tuple(p.plain), sentences_with_links=tuple(p.linked), links=tuple(p.links),
        attributes=attributes, relations=relations, fact_sentences=p.facts,
    )


def iter_pages(spec: WorldSpec, start: int = 0, stop: int | None = None) -> Iterator[Page]:
    """Pages start .. stop-1 (default: to the end), one at a time."""
    stop = spec.num_docs if stop is None else min(stop, spec.num_docs)
    for i in range(max(start, 0), stop):
        yield page(spec, i)


# --------------------------------------------------------------------------------------------
# Records in the public formats
# --------------------------------------------------------------------------------------------

# A tag counts as one token, as in the HotpotQA dump (CoreNLP kept tags whole).
_TOKEN = re.compile(r'<a href="[^"]*">|</a>|\w+|[^\w\s]')
_TAG = re.compile(r"</?a[^>]*>")


def _char_offsets(sentences: tuple[str, ...]) -> list[list[tuple[int, int]]]:
    """Token [start, end) offsets per sentence, counted from the start of the paragraph.

    (Pairs are tuples: JSON writes them as the [start, end] lists of the HotpotQA dump.)
    """
    paragraph = "".join(sentences)
    tokens, span = _TOKEN.finditer, re.Match.span
    out = []
    start = 0
    for sentence in sentences:
        end = start + len(sentence)
        out.append(list(map(span, tokens(paragraph, start, end))))
        start = end
    return out


def strip_links(sentence: str) -> str:
    """Remove the <a> tags of a linked sentence: gives the plain sentence back."""
    return _TAG.sub("", sentence)


def hotpot_record(p: Page) -> dict:
    """The page as one line of the HotpotQA processed-Wikipedia (abstracts) dump.

    Offsets are [start, end) character positions in the page's paragraph ("".join of its
    sentences, with or without links); the pairs are tuples, which JSON writes as arrays.
    """
    return {
        "id": p.doc_id,
        "url": f"https://en.wikipedia.org/wiki?curid={p.doc_id}",
        "title": p.title,
        "text": list(p.sentences),
        "charoffset": _char_offsets(p.sentences),
        "text_with_links": list(p.sentences_with_links),
        "charoffset_with_links": _char_offsets(p.sentences_with_links),
    }


def fever_page_id(page_title: str) -> str:
    """FEVER's page id: underscores for spaces, -LRB- / -RRB- for brackets, -COLON- for colons."""
    return (page_title.replace(" ", "_").replace("(", "-LRB-").replace(")", "-RRB-")
            .replace(":", "-COLON-"))


def fever_page_record(p: Page) -> dict:
    """The page as one line of FEVER's wiki-pages: lines are 'i<TAB>sentence[<TAB>anchor<TAB>target]...'."""
    by_sentence: dict[int, list[str]] = {}
    for link in p.links:
        by_sentence.setdefault(link.sentence_index, []).extend((link.anchor, link.target_title))
    lines = []
    for k, sentence in enumerate(p.sentences):
        lines.append("\t".join([str(k), sentence.lstrip(), *by_sentence.get(k, ())]))
    return {"id": fever_page_id(p.title), "text": p.text, "lines": "\n".join(lines)}


def link_rows(p: Page) -> list[dict]:
    """Ground truth for the hyperlinks of a page (one row per link, as in truth/links.jsonl.bz2)."""
    return [
        {"source": p.title, "target": link.target_title, "anchor": link.anchor, "sentence": link.sentence_index}
        for link in p.links
    ]


def iter_link_rows(spec: WorldSpec, start: int = 0, stop: int | None = None) -> Iterator[dict]:
    """Ground-truth hyperlinks of pages start .. stop-1, in page order (for tests and checks)."""
    for p in iter_pages(spec, start, stop):
        yield from link_rows(p)


# --------------------------------------------------------------------------------------------
# Questions (HotpotQA) and claims (FEVER). Both touch only the pages they need, through a cache.
# --------------------------------------------------------------------------------------------


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


def _fact_surface(pages: _Pages, p: Page, fact: str) -> str:
    """The string a sentence of page p uses for one of its facts (the answer to ask for)."""
    if fact in p.relations:
        return _name(pages.layout, p.relations[fact]).base
    if fact == "country":
        return p.attributes["country"]
    return str(p.attributes[fact])


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
    _BridgeTemplate("founder_birthplace", ORGANISATION, "founder", "birthplace",
                    "In which city was the founder of {name} born?"),
    _BridgeTemplate("founder_nationality", ORGANISATION, "founder", "nationality",
                    "What nationality is the person who founded {name}?"),
    _BridgeTemplate("headquarters_founding_year", ORGANISATION, "headquarters", "founding_year",
                    "In what year was the city where {name} is based founded?"),
    _BridgeTemplate("director_nationality", FILM, "director", "nationality",
                    "What nationality is the director of {name}?"),
    _BridgeTemplate("director_birthplace", FILM, "director", "birthplace",
                    "Where was the director of {name} born?"),
    _BridgeTemplate("filming_location_country", FILM, "filmed_in", "country",
                    "In which country is the city where {name} was filmed?"),
    _BridgeTemplate("star_birth_year", FILM, "star", "birth_year",
                    "In what year was the star of {name} born?"),
    _BridgeTemplate("member_birth_year", BAND, "founding_member", "birth_year",
                    "In what year was the founding member of {name} born?"),
    _BridgeTemplate("band_origin_country", BAND, "origin", "country",
                    "The band {name} comes from a city in which country?"),
    _BridgeTemplate("alma_mater_founding_year", PERSON, "alma_mater", "founding_year",
                    "In what year was the university attended by {name} founded?"),
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
    _ComparisonTemplate("same_formation_year", BAND, "formation_year", "Were {a} and {b} formed in the same year?",
                        True),
    _ComparisonTemplate("same_film_genre", FILM, "genre", "Are {a} and {b} films of the same genre?", True),
    _ComparisonTemplate("released_first", FILM, "release_year", "Which film was released first, {a} or {b}?", False),
    _ComparisonTemplate("formed_first", BAND, "formation_year", "Which band was formed first, {a} or {b}?", False),
    _ComparisonTemplate("born_first", PERSON, "birth_year", "Who was born first, {a} or {b}?", False),
    _ComparisonTemplate("founded_first", ORGANISATION, "founding_year",
                        "Which organisation was founded first, {a} or {b}?", False),
    _ComparisonTemplate("city_founded_first", CITY, "founding_year", "Which city was founded first, {a} or {b}?",
                        False),
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
    anchor = next(link.anchor for link in source.links
                  if link.target_index == bridge.index and link.sentence_index == link_sentence)
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


def _comparison_question(pages: _Pages, rng: random.Random, template: _ComparisonTemplate,
                         pool: _ComparisonPool, want_yes: bool) -> dict | None:
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


def make_questions(spec: WorldSpec, n: int, seed: int = 0, comparison_fraction: float = 0.2,
                   with_context: bool = True) -> list[dict]:
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


class _ClaimTemplate(NamedTuple):
    kind: str
    fact: str
    claim: str  # format with {name} and {value}


CLAIM_TEMPLATES = (
    _ClaimTemplate(PERSON, "birthplace", "{name} was born in {value}."),
    _ClaimTemplate(PERSON, "birth_year", "{name} was born in {value}."),
    _ClaimTemplate(PERSON, "nationality", "{name} is {value}."),
    _ClaimTemplate(PERSON, "occupation", "{name} is {article} {value}."),
    _ClaimTemplate(CITY, "country", "{name} is located in {value}."),
    _ClaimTemplate(CITY, "founding_year", "{name} was founded in {value}."),
    _ClaimTemplate(ORGANISATION, "headquarters", "{name} is headquartered in {value}."),
    _ClaimTemplate(ORGANISATION, "founder", "{name} was founded by {value}."),
    _ClaimTemplate(ORGANISATION, "founding_year", "{name} was founded in {value}."),
    _ClaimTemplate(FILM, "director", "{name} was directed by {value}."),
    _ClaimTemplate(FILM, "release_year", "{name} was released in {value}."),
    _ClaimTemplate(FILM, "filmed_in", "{name} was filmed in {value}."),
    _ClaimTemplate(FILM, "genre", "{name} is {article} {value} film."),
    _ClaimTemplate(BAND, "origin", "{name} is a band from {value}."),
    _ClaimTemplate(BAND, "formation_year", "{name} was formed in {value}."),
    _ClaimTemplate(BAND, "founding_member", "{name} was formed by {value}."),
    _ClaimTemplate(BAND, "genre", "{name} is {article} {value} band."),
)

# Predicates the world never states: claims made of them are NOT ENOUGH INFO.
UNSTATED_CLAIMS = {
    PERSON: ("{name} has won an Olympic gold medal.", "{name} has a twin sibling.",
             "{name} speaks five languages.", "{name} once lived in a lighthouse."),
    CITY: ("{name} has hosted the Winter Olympics.", "{name} has an underground railway.",
           "{name} has a population of over one million."),
    ORGANISATION: ("{name} is listed on a stock exchange.", "{name} has offices in more than forty countries.",
                   "{name} once sponsored a football club."),
    FILM: ("{name} was shot in black and white.", "{name} won an award at the Venice Film Festival.",
           "{name} has a sequel."),
    BAND: ("{name} has released a live album.", "{name} has won a Grammy Award.",
           "{name} once split up and later reunited."),
}
# Relations a page may lack: claiming one it lacks is NOT ENOUGH INFO too (harder to spot).
OPTIONAL_RELATION_CLAIMS = {
    PERSON: ("alma_mater", ORGANISATION, "{name} studied at {value}."),
    FILM: ("star", PERSON, "{name} stars {value}."),
    BAND: ("record_label", ORGANISATION, "{name} released its debut album through {value}."),
}

SUPPORTS, REFUTES, NOT_ENOUGH_INFO = "SUPPORTS", "REFUTES", "NOT ENOUGH INFO"


def _changed_value(pages: _Pages, rng: random.Random, p: Page, fact: str, true_value: str) -> str | None:
    """A value for `fact` that differs from the true one on the surface: a real city, a near year..."""
    for _ in range(20):
        if fact in p.relations:
            target_kind = kind_of(p.relations[fact])
            other = _global_index(target_kind, rng.randrange(pages.layout.counts[target_kind]))
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
            value = rng.choice(FILM_GENRES if p.kind == FILM else BAND_GENRES)
        if value != true_value:
            return value
    return None


def make_claims(spec: WorldSpec, n: int, seed: int = 0) -> list[dict]:
    """n FEVER claims (labels in equal thirds) about the world's pages, in FEVER's JSON-lines format."""
    if n < 0:
        raise ValueError("n must be >= 0")
    rng = random.Random(_mix64(spec.seed, _SALT_CLAIMS, seed))
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
                    if target_kind == ORGANISATION and optional[0] == "alma_mater":
                        target = pages.layout.universities.page_index(
                            rng.randrange(pages.layout.universities.count))
                    elif target_kind == ORGANISATION:
                        target = pages.layout.companies.page_index(rng.randrange(pages.layout.companies.count))
                    else:
                        target = _global_index(target_kind, rng.randrange(pages.layout.counts[target_kind]))
                    text = optional[2].format(name=_in_prose(name, True),
                                              value=_in_prose(_name(pages.layout, target).base))
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
            claims.append({
                "id": claim_id,
                "verifiable": "NOT VERIFIABLE" if label == NOT_ENOUGH_INFO else "VERIFIABLE",
                "label": label,
                "claim": text,
                "evidence": evidence,
            })
            break
    return claims


# --------------------------------------------------------------------------------------------
# Writing a world: shard by shard, through a caller-supplied `open_output`
# --------------------------------------------------------------------------------------------

OpenOutput = Callable[[str], ContextManager[IO[bytes]]]


def output_under(root: str, s3=None) -> OpenOutput:
    """An `open_output` writing under a storage URI (local folder or s3://bucket/prefix)."""
    from xh.storage import join, open_output

    return lambda relative_path: open_output(join(root, relative_path), s3)


def wiki_shard_path(shard: int) -> str:
    """wiki/AA/wiki_00.bz2 ... wiki/AA/wiki_99.bz2, wiki/AB/wiki_00.bz2 ...: 100 shards a folder."""
    folder = shard // 100
    if folder >= 26 * 26:
        raise ValueError(f"shard {shard} is past the last folder (ZZ)")
    return f"wiki/{chr(65 + folder // 26)}{chr(65 + folder % 26)}/wiki_{shard % 100:02d}.bz2"


def links_shard_path(shard: int) -> str:
    return f"truth/links/links-{shard:05d}.jsonl.bz2"


def fever_pages_path(shard: int) -> str:
    return f"fever/wiki-pages/wiki-{shard:03d}.jsonl"


QUESTIONS_PATH = "hotpot/questions.json"
CLAIMS_PATH = "fever/claims.jsonl"
SUMMARY_PATH = "truth/summary.json"


@dataclass
class WorldSummary:
    """What `write_world` wrote: counts and the paths relative to the output root."""

    num_docs: int
    seed: int
    docs_by_kind: dict
    num_links: int
    num_shards: int
    docs_per_shard: int
    num_questions: dict = field(default_factory=dict)  # by type, and "total"
    num_claims: dict = field(default_factory=dict)  # by label, and "total"
    paths: dict = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)


class _Bz2Lines:
    """Writes lines bz2-compressed into an open binary file, a chunk at a time.

    Compression runs in a helper thread: bz2 releases the GIL, so pages are generated while the
    previous chunk is compressed. At most `max_waiting` chunks wait, so memory stays bounded.
    Use as a context manager; leaving it finishes the stream (or, on error, just stops).
    """

    def __init__(self, raw: IO[bytes], chunk_bytes: int = 1 << 20, max_waiting: int = 3) -> None:
        self.raw, self.chunk_bytes = raw, chunk_bytes
        self.lines: list[str] = []
        self.pending = 0
        self.error: BaseException | None = None
        self.aborted = False
        self.chunks: queue.Queue = queue.Queue(maxsize=max_waiting)
        self.worker = threading.Thread(target=self._compress, name="synth-bz2", daemon=True)
        self.worker.start()

    def _compress(self) -> None:
        compressor = bz2.BZ2Compressor(BZ2_LEVEL)
        while True:
            chunk = self.chunks.get()
            if chunk is None:
                break
            if self.error is None:
                try:
                    self.raw.write(compressor.compress(chunk))
                except BaseException as error:  # reported by close(); keep draining so put() never blocks
                    self.error = error
        if self.error is None and not self.aborted:
            try:
                self.raw.write(compressor.flush())
            except BaseException as error:
                self.error = error

    def write(self, line: str) -> None:
        self.lines.append(line)
        self.pending += len(line)
        if self.pending >= self.chunk_bytes:
            self._hand_over()

    def _hand_over(self) -> None:
        if self.lines:
            self.lines.append("")
            self.chunks.put("\n".join(self.lines).encode("utf-8"))
            self.lines, self.pending = [], 0

    def __enter__(self) -> "_Bz2Lines":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.aborted = exc_type is not None
        if not self.aborted:
            self._hand_over()
        self.chunks.put(None)
        self.worker.join()
        if self.error is not None and not self.aborted:
            raise self.error


BZ2_LEVEL = 9  # bz2's default; levels 1-5 are only 10-25 % faster and compress worse
_JSON = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


def _default_questions(num_docs: int) -> int:
    return min(5_000, max(10, num_docs // 10))


@dataclass
class ShardSummary:
    """What one shard of pages wrote (paths relative to the output root)."""

    shard: int
    wiki: str
    fever_pages: str | None
    links: str
    num_links: int


def num_shards(spec: WorldSpec, docs_per_shard: int) -> int:
    if docs_per_shard < 1:
        raise ValueError(f"docs_per_shard must be >= 1, got {docs_per_shard}")
    return -(-spec.num_docs // docs_per_shard)


def write_shard(spec: WorldSpec, shard: int, open_output: OpenOutput, *, docs_per_shard: int = 10_000,
                fever_pages: bool = True) -> ShardSummary:
    """Write pages `[shard * docs_per_shard, ...)`: their HotpotQA shard, FEVER pages and true links.

    Shards depend on nothing but the spec, so they can be written in any order, in parallel.
    """
    start, stop = shard * docs_per_shard, min(spec.num_docs, (shard + 1) * docs_per_shard)
    wiki_path, links_path = wiki_shard_path(shard), links_shard_path(shard)
    fever_lines = []
    num_links = 0
    with open_output(wiki_path) as wiki_raw, _Bz2Lines(wiki_raw) as wiki_out, \
            open_output(links_path) as links_raw, _Bz2Lines(links_raw) as links_out:
        for i in range(start, stop):
            p = page(spec, i)
            wiki_out.write(_JSON(hotpot_record(p)))
            for row in link_rows(p):
                links_out.write(_JSON(row))
            num_links += len(p.links)
            if fever_pages:
                fever_lines.append(_JSON(fever_page_record(p)))
    fever_path = fever_pages_path(shard) if fever_pages else None
    if fever_path:
        with open_output(fever_path) as fever_raw:
            fever_raw.write(("\n".join(fever_lines) + "\n").encode("utf-8"))
    return ShardSummary(shard, wiki_path, fever_path, links_path, num_links)


def write_tasks_and_summary(spec: WorldSpec, open_output: OpenOutput, shards: list[ShardSummary], *,
                            docs_per_shard: int, num_questions: int | None = None, num_claims: int | None = None,
                            question_seed: int = 0, comparison_fraction: float = 0.2) -> WorldSummary:
    """After the shards: the questions, the claims and the summary (they touch only the pages they need)."""
    questions = make_questions(spec, _default_questions(spec.num_docs) if num_questions is None else num_questions,
                               seed=question_seed, comparison_fraction=comparison_fraction)
    with open_output(QUESTIONS_PATH) as f:
        f.write(json.dumps(questions).encode("utf-8"))
    claims = make_claims(spec, _default_questions(spec.num_docs) if num_claims is None else num_claims,
                         seed=question_seed)
    with open_output(CLAIMS_PATH) as f:
        f.write("".join(json.dumps(c) + "\n" for c in claims).encode("utf-8"))

    by_type: dict[str, int] = {"total": len(questions)}
    for q in questions:
        by_type[q["type"]] = by_type.get(q["type"], 0) + 1
    by_label: dict[str, int] = {"total": len(claims)}
    for c in claims:
        by_label[c["label"]] = by_label.get(c["label"], 0) + 1
    shards = sorted(shards, key=lambda s: s.shard)
    summary = WorldSummary(
        num_docs=spec.num_docs, seed=spec.seed, docs_by_kind=kind_counts(spec),
        num_links=sum(s.num_links for s in shards), num_shards=len(shards), docs_per_shard=docs_per_shard,
        num_questions=by_type, num_claims=by_label,
        paths={"wiki": [s.wiki for s in shards], "fever_pages": [s.fever_pages for s in shards if s.fever_pages],
               "questions": QUESTIONS_PATH, "claims": CLAIMS_PATH, "links": [s.links for s in shards],
               "summary": SUMMARY_PATH},
    )
    with open_output(SUMMARY_PATH) as f:
        f.write(summary.to_json().encode("utf-8"))
    return summary


def write_world(spec: WorldSpec, open_output: OpenOutput, *, docs_per_shard: int = 10_000,
                num_questions: int | None = None, num_claims: int | None = None, fever_pages: bool = True,
                question_seed: int = 0, comparison_fraction: float = 0.2) -> WorldSummary:
    """Write the whole world in this process, one shard at a time; returns a `WorldSummary`.

    Memory does not grow with the size. `workflows/synth.py` writes the shards in parallel on Ray.
    `num_questions` / `num_claims` default to a tenth of the pages (at least 10, at most 5,000).
    """
    shards = [write_shard(spec, k, open_output, docs_per_shard=docs_per_shard, fever_pages=fever_pages)
              for k in range(num_shards(spec, docs_per_shard))]
    return write_tasks_and_summary(spec, open_output, shards, docs_per_shard=docs_per_shard,
                                   num_questions=num_questions, num_claims=num_claims, question_seed=question_seed,
                                   comparison_fraction=comparison_fraction)
