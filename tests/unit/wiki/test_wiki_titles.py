"""xh.wiki.titles: one title spelling for HotpotQA hrefs, MediaWiki links and titles, FEVER page ids."""

from __future__ import annotations

import doctest

import pytest

from xh.wiki import titles
from xh.wiki.titles import fever_page_id, normalize_title

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("raw", "title"),
    [
        # HotpotQA hrefs: URL-quoted, first letter as written in the sentence
        ("political%20philosophy", "Political philosophy"),
        ("Free%20association%20%28communism%20and%20anarchism%29", "Free association (communism and anarchism)"),
        ("Dr.%20Dre%27s%20Chronic", "Dr. Dre's Chronic"),
        ("AT%26T", "AT&T"),
        # MediaWiki links and titles
        ("political_philosophy", "Political philosophy"),
        ("New York City#History", "New York City"),
        ("  Barack   Obama ", "Barack Obama"),
        ("Barack\u00a0Obama", "Barack Obama"),
        ("AT&amp;T", "AT&T"),
        ("Caf&eacute; society", "Café society"),
        ("iPhone", "IPhone"),  # MediaWiki's first-letter rule: the page is "IPhone"
        ("éclair", "Éclair"),
        ("ßeta", "ßeta"),  # "ß".upper() is "SS": kept as MediaWiki does
        ("U.S. state", "U.S. state"),  # the rest is kept as written
        (":Category:Anarchism", "Category:Anarchism"),
        ("100% (song)", "100% (song)"),  # not a %XX escape: left alone
        # FEVER page ids
        ("Gladiator_-LRB-2000_film-RRB-", "Gladiator (2000 film)"),
        ("-LRB-I_Can't_Get_No-RRB-_Satisfaction", "(I Can't Get No) Satisfaction"),
        ("Star_Wars-COLON-_The_Force_Awakens", "Star Wars: The Force Awakens"),
        ("The_-LSB-Bracketed-RSB-_-LCB-Braced-RCB-", "The [Bracketed] {Braced}"),
        ("greeting habits", "Greeting habits"),  # a FEVER link target
        # nothing left
        ("#History", ""),
        ("", ""),
        ("   ", ""),
    ],
)
def test_normalize_title(raw: str, title: str) -> None:
    assert normalize_title(raw) == title


def test_a_link_and_its_page_meet_from_every_format() -> None:
    spellings = [
        "Gladiator (2000 film)",  # MediaWiki <title>
        "gladiator_(2000_film)",  # MediaWiki [[link]]
        "gladiator%20%282000%20film%29",  # HotpotQA href
        "Gladiator_-LRB-2000_film-RRB-",  # FEVER id
        "Gladiator (2000 film)#Plot",  # a section link
    ]
    assert {normalize_title(raw) for raw in spellings} == {"Gladiator (2000 film)"}


@pytest.mark.parametrize(
    "raw",
    ["political%20philosophy", "Gladiator_-LRB-2000_film-RRB-", "AT&amp;T#x", " eBay ", ":fr:Paris"],
)
def test_normalize_title_is_idempotent(raw: str) -> None:
    once = normalize_title(raw)
    assert normalize_title(once) == once


@pytest.mark.parametrize(
    ("title", "page_id"),
    [
        ("Gladiator (2000 film)", "Gladiator_-LRB-2000_film-RRB-"),
        ("Star Wars: The Force Awakens", "Star_Wars-COLON-_The_Force_Awakens"),
        ("(I Can't Get No) Satisfaction", "-LRB-I_Can't_Get_No-RRB-_Satisfaction"),
        ("The [Bracketed] {Braced}", "The_-LSB-Bracketed-RSB-_-LCB-Braced-RCB-"),
        ("Nikolaj Coster-Waldau", "Nikolaj_Coster-Waldau"),
    ],
)
def test_fever_page_id_is_the_inverse_on_normalised_titles(title: str, page_id: str) -> None:
    assert fever_page_id(title) == page_id
    assert normalize_title(page_id) == title


def test_the_module_docstring_examples_hold() -> None:
    assert doctest.testmod(titles).failed == 0
