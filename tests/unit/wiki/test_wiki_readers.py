"""xh.wiki readers (hotpot, mediawiki + wikitext, fever): dumps -> docs, redirects, quarantine.

Every test that reads a file also checks the invariant the pipeline relies on:
records read == docs + redirects + quarantined.
"""

from __future__ import annotations

import bz2
import doctest
import html
import io
import json
import re
from collections import Counter
from pathlib import Path

import pytest

from xh.schemas import DOCS, QUARANTINE, RAW_LIMIT, REDIRECTS
from xh.wiki.readers import read_records
from xh.wiki.records import REASONS, Doc, Link, Quarantine, ReadCounts, Redirect
from xh.wiki.titles import normalize_title

pytestmark = pytest.mark.unit

wikitext_module = pytest.importorskip("xh.wiki.wikitext", reason="the MediaWiki reader needs mwparserfromhell")

WIKI_SAMPLE = "wiki/enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
TABLE_SAMPLE = "wiki/enwiki-table-markup.xml.bz2"
# Markup that must never survive into a sentence.
LEFTOVER_MARKUP = re.compile(r"\{\{|\}\}|\[\[|\]\]|\{\||<ref|'''")


def read(fmt: str, data: bytes | str, source: str = "test-file") -> tuple[list, ReadCounts]:
    """All records of one in-memory file, with the invariant checked."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    counts = ReadCounts()
    records = list(read_records(fmt, io.BytesIO(data), source, counts))
    assert counts.balanced, counts
    assert (counts.docs, counts.redirects, counts.quarantined, counts.partial) == (
        sum(r.kind == "doc" for r in records),
        sum(r.kind == "redirect" for r in records),
        sum(r.kind == "quarantine" and not r.partial for r in records),
        sum(r.kind == "quarantine" and r.partial for r in records),
    )
    assert all(r.group in REASONS for r in records if r.kind == "quarantine"), records
    return records, counts


def jsonl(*objects) -> str:
    return "".join((obj if isinstance(obj, str) else json.dumps(obj)) + "\n" for obj in objects)


def only(records: list, kind: str) -> list:
    return [record for record in records if record.kind == kind]


# --- hotpot --------------------------------------------------------------------------------------

ANARCHISM = {
    "id": "12",
    "url": "https://en.wikipedia.org/wiki?curid=12",
    "title": "Anarchism",
    "text": [
        "Anarchism is a political philosophy that advocates self-governed societies based on voluntary institutions.",
        " These are often described as stateless societies, although several authors have defined them more"
        " specifically as institutions based on non-hierarchical free associations.",
        " Anarchism holds the state to be undesirable, unnecessary, and harmful.",
    ],
    "charoffset": [[[0, 9]], [[0, 6]], [[0, 10]]],
    "text_with_links": [
        'Anarchism is a <a href="political%20philosophy">political philosophy</a> that advocates '
        '<a href="self-governance">self-governed</a> societies based on voluntary institutions.',
        ' These are often described as <a href="stateless%20society">stateless societies</a>, although several'
        " authors have defined them more specifically as institutions based on non-"
        '<a href="Hierarchy">hierarchical</a> <a href="Free%20association%20%28communism%20and%20anarchism%29">'
        "free associations</a>.",
        ' Anarchism holds the <a href="state%20%28polity%29">state</a> to be undesirable, unnecessary, and harmful.',
    ],
    "charoffset_with_links": [],
}


def test_hotpot_flat_abstract_becomes_a_doc_with_its_links() -> None:
    records, counts = read("hotpot", jsonl(ANARCHISM), source="wiki/AA/wiki_00.bz2")
    (doc,) = records
    assert isinstance(doc, Doc) and doc.kind == "doc"
    assert doc.row() == {
        "doc_id": "12",
        "title": "Anarchism",
        "text": "".join(ANARCHISM["text"]),
        "sentences": ANARCHISM["text"],  # verbatim: the leading spaces stay
        "source": "wiki/AA/wiki_00.bz2",
    }
    assert set(doc.row()) == set(DOCS.names)
    assert doc.links == [
        Link("Political philosophy", "political philosophy", 0),
        Link("Self-governance", "self-governed", 0),
        Link("Stateless society", "stateless societies", 1),
        Link("Hierarchy", "hierarchical", 1),
        Link("Free association (communism and anarchism)", "free associations", 1),
        Link("State (polity)", "state", 2),
    ]
    assert doc.link_rows()[0] == {
        "src_doc_id": "12",
        "target_title": "Political philosophy",
        "anchor": "political philosophy",
        "sentence": 0,
    }
    assert (counts.records, counts.docs, counts.skipped) == (1, 1, 0)


def test_hotpot_paragraph_form_is_flattened_without_the_title_paragraph() -> None:
    page = {
        "id": "25",
        "title": "Autism",
        "text": [
            ["Autism"],
            ["Autism is a neurodevelopmental disorder.", " Parents usually notice signs early."],
            [],
            ["It affects information processing."],
        ],
        "text_with_links": [
            ["Autism"],
            [
                'Autism is a <a href="neurodevelopmental%20disorder">neurodevelopmental disorder</a>.',
                " Parents usually notice signs early.",
            ],
            [],
            ['It affects <a href="information%20processing">information processing</a>.'],
        ],
    }
    (doc,), _ = read("hotpot", jsonl(page))
    assert doc.sentences == [
        "Autism is a neurodevelopmental disorder.",
        " Parents usually notice signs early.",
        "It affects information processing.",
    ]
    assert doc.links == [
        Link("Neurodevelopmental disorder", "neurodevelopmental disorder", 0),
        Link("Information processing", "information processing", 2),
    ]


def test_hotpot_abstract_that_is_only_its_title_stays_a_doc() -> None:
    # A real HotpotQA paragraph (its context for a train question): the abstract is the bare title.
    title = "Intel Extreme Masters Season IX \u2013 World Championship"
    page = {"id": "3", "title": title, "text": [title], "text_with_links": "not a list"}
    (doc, lost), counts = read("hotpot", jsonl(page))
    assert doc.sentences == [title] and doc.links == []  # a malformed text_with_links costs the links only
    assert (lost.kind, lost.partial, lost.position, lost.reason) == (
        "quarantine",
        True,
        1,
        "links dropped: text_with_links is not a list",
    )
    assert (counts.records, counts.docs, counts.quarantined, counts.partial) == (1, 1, 0, 1)


def test_hotpot_anchor_entities_and_tags_are_decoded_and_external_links_dropped() -> None:
    page = {
        "id": 7,  # an integer id is read as its string
        "title": "AT&T",
        "text": ["AT&T is a company in Dallas, see the site."],
        "text_with_links": [
            '<a href="AT%26amp%3BT">AT&amp;T</a> is a company in <a href="Dallas">'
            '<b>Dallas</b></a>, see <a href="https://www.att.com">the site</a>.'
        ],
    }
    (doc,), _ = read("hotpot", jsonl(page))
    assert doc.doc_id == "7"
    assert doc.links == [Link("AT&T", "AT&T", 0), Link("Dallas", "Dallas", 0)]


def test_hotpot_links_are_dropped_when_they_do_not_align_with_the_sentences() -> None:
    page = {**ANARCHISM, "text_with_links": ANARCHISM["text_with_links"][:2]}
    whole = {**ANARCHISM, "id": "13"}
    no_links = {key: value for key, value in ANARCHISM.items() if key != "text_with_links"} | {"id": "14"}
    records, counts = read("hotpot", jsonl(whole, page, no_links))
    assert [(r.kind, r.partial if r.kind == "quarantine" else None) for r in records] == [
        ("doc", None),
        ("doc", None),
        ("quarantine", True),
        ("doc", None),
    ]
    doc, lost = records[1], records[2]
    assert doc.sentences == ANARCHISM["text"] and doc.links == [] and records[0].links
    n = len(ANARCHISM["text"])
    assert (
        lost.reason == f"links dropped: text_with_links has 2 sentences, text has {n}" and lost.group == "links dropped"
    )
    assert lost.position == 2 and json.loads(lost.raw)["id"] == ANARCHISM["id"]
    assert set(lost.row()) == set(QUARANTINE.names)  # a row of the quarantine table like any other
    assert counts.balanced and (counts.records, counts.docs, counts.quarantined, counts.partial) == (3, 3, 0, 1)


def test_hotpot_bad_records_are_quarantined_with_their_reason() -> None:
    good = {"id": "1", "title": "Good", "text": ["Fine."]}
    lines = [
        json.dumps(good).encode(),  # 1
        b'{"id": "2", "title": "Broken", "text": ["unterminated',  # 2
        b"",  # 3: blank lines are not records
        b'["a", "list"]',  # 4
        json.dumps({"id": "5", "text": ["No title."]}).encode(),  # 5
        json.dumps({"id": "6", "title": "   ", "text": ["Blank title."]}).encode(),  # 6
        json.dumps({"title": "No id", "text": ["x"]}).encode(),  # 7
        json.dumps({"id": "8", "title": "Empty", "text": []}).encode(),  # 8
        json.dumps({"id": "9", "title": "Blank", "text": ["", "  "]}).encode(),  # 9
        '{"id": "10", "title": "Latin-1", "text": ["caf\u00e9"]}'.encode("latin-1"),  # 10
        json.dumps({"id": "1", "title": "Again", "text": ["Same id."]}).encode(),  # 11
        json.dumps({"id": "12", "title": "Not a list", "text": "a string"}).encode(),  # 12
        b'{"id": "13", "title": "Surrogate", "text": ["half \\ud800 a pair"]}',  # 13
        b"   ",  # 14
        json.dumps({"id": "15", "title": "Emoji", "text": ["Fine \U0001f600."]}).encode(),  # 15
    ]
    records, counts = read("hotpot", b"\n".join(lines) + b"\n")
    assert [doc.doc_id for doc in only(records, "doc")] == ["1", "15"]
    reasons = {q.position: q.reason for q in only(records, "quarantine")}
    assert {position: reason.split(":")[0] for position, reason in reasons.items()} == {
        2: "invalid json",
        4: "invalid record",
        5: "missing title",
        6: "missing title",
        7: "missing id",
        8: "empty text",
        9: "empty text",
        10: "non-utf8 bytes",
        11: "duplicate id",
        12: "invalid record",
        13: "invalid record",
    }
    assert (counts.records, counts.skipped, counts.docs, counts.quarantined) == (13, 2, 2, 11)
    quarantined = {q.position: q for q in only(records, "quarantine")}
    assert quarantined[2].raw == lines[1].decode()
    assert "\ufffd" in quarantined[10].raw  # the undecodable byte, replaced
    assert all(set(q.row()) == set(QUARANTINE.names) and q.source == "test-file" for q in quarantined.values())
    assert quarantined[11].group == "duplicate id"


def test_quarantine_raw_is_cut_to_the_schema_limit() -> None:
    long_line = '{"id": "1", "title": "Long", "text": ["' + "x" * (3 * RAW_LIMIT)  # invalid json
    (bad,), _ = read("hotpot", long_line + "\n")
    assert bad.reason.startswith("invalid json") and len(bad.raw) == RAW_LIMIT


def hotpot_lines(n: int) -> bytes:
    text = [f"Sentence {i} of a realistic abstract, padded with some words to look real." for i in range(3)]
    pages = [{"id": str(i), "title": f"Page {i}", "text": text, "text_with_links": text} for i in range(n)]
    return jsonl(*pages).encode()


def test_hotpot_reads_bz2_including_several_concatenated_streams() -> None:
    data = hotpot_lines(300)
    plain, _ = read("hotpot", data)
    one, _ = read("hotpot", bz2.compress(data))
    two, _ = read("hotpot", bz2.compress(data[:10_000]) + bz2.compress(data[10_000:]))  # as pbzip2 writes
    assert len(plain) == 300 and plain == one == two


def test_truncated_bz2_quarantines_the_tail_and_keeps_the_docs_before_it(tmp_path: Path) -> None:
    data = hotpot_lines(4000)  # ~0.5 MB: several 100 kB bz2 blocks at level 1
    path = tmp_path / "wiki_00.bz2"
    compressed = bz2.compress(data, compresslevel=1)
    path.write_bytes(compressed[: len(compressed) * 6 // 10])

    counts = ReadCounts()
    with path.open("rb") as stream:
        records = list(read_records("hotpot", stream, str(path), counts))

    *docs, tail = records
    assert len(docs) > 1000 and all(doc.kind == "doc" for doc in docs)
    assert [doc.doc_id for doc in docs] == [str(i) for i in range(len(docs))]  # complete lines, in order
    assert isinstance(tail, Quarantine) and tail.group == "truncated bz2 stream"
    assert tail.position == len(docs) + 1
    assert tail.raw and data.decode().split("\n")[len(docs)].startswith(tail.raw)  # the cut line
    assert counts.balanced and counts.quarantined == 1


def test_corrupt_bz2_is_quarantined_too() -> None:
    compressed = bytearray(bz2.compress(hotpot_lines(50)))
    compressed[len(compressed) // 2 : len(compressed) // 2 + 8] = b"\xff" * 8
    records, _ = read("hotpot", bytes(compressed))
    assert records[-1].kind == "quarantine" and records[-1].group == "truncated bz2 stream"


def test_chunk_boundaries_do_not_change_what_is_read(monkeypatch) -> None:
    from xh.wiki import streams

    hotpot = hotpot_lines(40)
    dump = xml_dump(*(xml_page(f"Page {i}", i, f"Page {i} links [[Page {i + 1}]].") for i in range(1, 30)))
    expected = [read("hotpot", hotpot)[0], read("mediawiki", dump)[0]]
    monkeypatch.setattr(streams, "READ_SIZE", 7)  # tags, lines and bz2 blocks cut at every place
    monkeypatch.setattr(streams, "OUT_SIZE", 50)
    assert [read("hotpot", hotpot)[0], read("mediawiki", dump)[0]] == expected
    assert [read("hotpot", bz2.compress(hotpot))[0], read("mediawiki", bz2.compress(dump.encode()))[0]] == expected


def test_read_records_refuses_an_unknown_format() -> None:
    with pytest.raises(ValueError, match="unknown wiki format"):
        read_records("wikitext", io.BytesIO(b""), "x")


# --- fever ---------------------------------------------------------------------------------------


def test_fever_lines_keep_their_numbers_and_links() -> None:
    page = {
        "id": "Hello_-LRB-greeting-RRB-",
        "text": "Hello is a salutation or greeting in the English language . It is first attested ...",
        "lines": "0\tHello is a salutation or greeting in the English language .\tsalutation\tsalutation"
        "\tgreeting\tgreeting habits\tEnglish language\tEnglish language\n"
        "1\t\n"
        "2\tIt is first attested in writing from 1826 .\t1826\n"
        "4\tIts origin is -LRB- probably -RRB- hallo .\n"
        "5\t",
    }
    (doc,), _ = read("fever", jsonl(page))
    assert doc.doc_id == "Hello_-LRB-greeting-RRB-"  # as FEVER's evidence spells it
    assert doc.title == "Hello (greeting)"
    assert doc.sentences == [
        "Hello is a salutation or greeting in the English language .",
        "",  # an empty line stays, so that sentences[i] is FEVER's line i
        " It is first attested in writing from 1826 .",
        "",  # line 3 is missing: filled
        " Its origin is -LRB- probably -RRB- hallo .",
        "",
    ]
    assert [s.strip() for s in doc.sentences][4] == "Its origin is -LRB- probably -RRB- hallo ."
    assert doc.links == [
        Link("Salutation", "salutation", 0),
        Link("Greeting habits", "greeting", 0),
        Link("English language", "English language", 0),
        Link("1826", "1826", 2),  # a lone field: anchor and target at once
    ]


def test_fever_bad_records_are_quarantined() -> None:
    records, counts = read(
        "fever",
        jsonl(
            {"id": "", "text": "", "lines": ""},  # 1: the real dump's first line
            {"id": "Empty_page", "text": "", "lines": "0\t\n1\t"},  # 2
            {"id": "Bad_numbers", "lines": "zero\tA sentence ."},  # 3
            "{not json",  # 4
            {"id": "Fine", "lines": "0\tA fine sentence ."},  # 5
            {"id": "Fine", "lines": "0\tAgain ."},  # 6
            {"id": "Twice", "lines": "0\tOne .\n0\tTwo ."},  # 7
            {"id": "Not_a_string", "lines": ["0\tA ."]},  # 8
        ),
    )
    reasons = {q.position: q.group for q in only(records, "quarantine")}
    assert reasons == {
        1: "missing id",
        2: "empty text",
        3: "invalid record",
        4: "invalid json",
        6: "duplicate id",
        7: "invalid record",
        8: "invalid record",
    }
    assert [doc.title for doc in only(records, "doc")] == ["Fine"]
    assert counts.records == 8


# --- sentences and wikitext ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "sentences"),
    [
        ("One. Two! Three? Four", ["One.", " Two!", " Three?", " Four"]),
        ("He lived on St. Mark's Place. Then he left.", ["He lived on St. Mark's Place.", " Then he left."]),
        ("Dr. Smith met Mr. Jones. They talked.", ["Dr. Smith met Mr. Jones.", " They talked."]),
        ("By J. R. R. Tolkien in 1937. It sold well.", ["By J. R. R. Tolkien in 1937.", " It sold well."]),
        ("She moved to the U.S. in 1990 and stayed.", ["She moved to the U.S. in 1990 and stayed."]),
        ('He said "Stop." Then he went.', ['He said "Stop."', " Then he went."]),
        ("Born c. 1450 in Genoa. Died in 1506.", ["Born c. 1450 in Genoa.", " Died in 1506."]),
        ("The value is 3.14 exactly. Next.", ["The value is 3.14 exactly.", " Next."]),
        ("Ends with (see below). The next.", ["Ends with (see below).", " The next."]),
        ("no capital. follows here", ["no capital. follows here"]),
        ("", []),
    ],
)
def test_split_sentences(text: str, sentences: list[str]) -> None:
    assert wikitext_module.split_sentences(text) == sentences
    assert "".join(sentences) == text


def test_article_lead_strips_markup_and_places_links_in_their_sentence() -> None:
    wikitext = """{{Infobox settlement
| name = Paris
| image = [[File:Paris.jpg|thumb|The [[Eiffel Tower]]]]
}}{{Other uses}}
<!-- a comment with [[Hidden link]] -->
'''Paris''' ({{IPA-fr|paʁi}}; {{lang-fr|Paris}}) is the [[capital city|capital]] of ''[[France]]''.<ref>{{cite web|url=http://x}}</ref> It lies on the [[Seine]]s of [[:fr:Seine|the river]].<ref name="a"/>
[[File:Seine.jpg|thumb|A caption with [[Notre-Dame]].]]
It has {{convert|105|km2}} and a [[#History|long history]], see [http://paris.fr the city site] or [http://x.org].
{| class="wikitable"
| Population || [[Demographics of Paris|2.1 million]]
|}
Its mayor is [[Anne Hidalgo|]]. It is in [[Category:Capitals|the category]] [[:Category:Cities in France|a category]]. The St. Louis [[Wikipedia:Manual of Style|manual]] rules.
__NOTOC__
[[Category:Paris]]
[[de:Paris]]

== History ==
[[Clovis I]] made it his capital.
"""
    lead = wikitext_module.article_lead(wikitext)
    assert lead.sentences == [
        "Paris is the capital of France.",
        " It lies on the Seines of the river.",
        " It has 105 km2 and a long history, see the city site or.",
        " Its mayor is Anne Hidalgo.",
        " It is in a category.",
        " The St. Louis manual rules.",
    ]
    assert lead.links == [
        Link("Capital city", "capital", 0),
        Link("France", "France", 0),
        Link("Seine", "Seines", 1),  # the link trail is part of the anchor
        Link("Anne Hidalgo", "Anne Hidalgo", 3),  # the pipe trick
    ]


def test_the_mediawiki_module_docstring_example_holds() -> None:
    assert doctest.testmod(wikitext_module).failed == 0


def test_lead_wikitext_ignores_a_heading_inside_a_comment() -> None:
    wikitext = "Lead one.\n<!--\n== Not a heading ==\n-->\nLead two.\n== Real ==\nBody."
    assert wikitext_module.lead_wikitext(wikitext) == "Lead one.\n<!--\n== Not a heading ==\n-->\nLead two.\n"


# --- mediawiki: hand-written dumps ---------------------------------------------------------------

XML_HEAD = """<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.10/" version="0.10" xml:lang="en">
  <siteinfo>
    <sitename>Wikipedia</sitename>
    <namespaces>
      <namespace key="0" case="first-letter" />
      <namespace key="4" case="first-letter">Wikipedia</namespace>
      <namespace key="100" case="first-letter">Portal</namespace>
    </namespaces>
  </siteinfo>
"""


def xml_page(title: str, page_id: int, text: str, ns: int = 0, redirect: str | None = None) -> str:
    redirect_tag = f'<redirect title="{html.escape(redirect)}" />' if redirect else ""
    return f"""  <page>
    <title>{html.escape(title)}</title>
    <ns>{ns}</ns>
    <id>{page_id}</id>
    {redirect_tag}
    <revision>
      <id>{page_id * 10}</id>
      <text xml:space="preserve">{html.escape(text)}</text>
    </revision>
  </page>
"""


def xml_dump(*pages: str, end: bool = True) -> str:
    return XML_HEAD + "".join(pages) + ("</mediawiki>\n" if end else "")


def test_mediawiki_pages_redirects_skips_and_quarantine() -> None:
    dump = xml_dump(
        xml_page("Paris", 1, "'''Paris''' is the capital of [[France]].<ref>x</ref>\n== History ==\nOld."),  # 1
        xml_page("City of light", 2, "#REDIRECT [[Paris]]", redirect="Paris"),  # 2
        xml_page("Wikipedia:About", 3, "About the project. See [[Portal:Paris]].", ns=4),  # 3: skipped
        "  <page><title>Broken</title><ns>0</ns><id>4</id><revision><text>x</revison></page>\n",  # 4
        xml_page("Lyon", 5, "'''Lyon''' is a city in [[Portal:France|France]]."),  # 5
        xml_page("Paris", 1, "A second page with the same id."),  # 6
        xml_page("Stub", 7, "{{Infobox}}\n[[Category:Stubs]]"),  # 7
        xml_page("Old redirect", 8, "#redirect: [[lyon#History]]"),  # 8: no <redirect> tag (old dumps)
        xml_page("", 9, "No title."),  # 9
    )
    records, counts = read("mediawiki", dump)
    assert [(type(r).__name__, r.position if r.kind == "quarantine" else None) for r in records] == [
        ("Doc", None),
        ("Redirect", None),
        ("Quarantine", 4),
        ("Doc", None),
        ("Quarantine", 6),
        ("Quarantine", 7),
        ("Redirect", None),
        ("Quarantine", 9),
    ]
    paris, city_of_light, broken, lyon, again, stub, old_redirect, untitled = records
    assert paris.row() == {
        "doc_id": "1",
        "title": "Paris",
        "text": "Paris is the capital of France.",
        "sentences": ["Paris is the capital of France."],
        "source": "test-file",
    }
    assert paris.links == [Link("France", "France", 0)]
    assert city_of_light.row() == {"from_title": "City of light", "to_title": "Paris"}
    assert set(city_of_light.row()) <= set(REDIRECTS.names)
    assert old_redirect == Redirect("Old redirect", "Lyon", "test-file")
    assert broken.reason.startswith("invalid xml page: mismatched tag") and "<title>Broken</title>" in broken.raw
    assert lyon.sentences == ["Lyon is a city in France."] and lyon.links == []  # Portal: is a namespace
    assert (again.reason, stub.reason, untitled.reason) == ("duplicate id: 1", "empty text", "missing title")
    assert (counts.records, counts.skipped, counts.docs, counts.redirects, counts.quarantined) == (8, 1, 2, 2, 4)


def test_mediawiki_page_the_wikitext_parser_fails_on_is_quarantined(monkeypatch) -> None:
    real_lead = wikitext_module.article_lead

    def fragile_lead(wikitext, namespaces=wikitext_module.DEFAULT_NAMESPACES):
        if "deep" in wikitext:
            raise RecursionError("maximum recursion depth exceeded")
        return real_lead(wikitext, namespaces)

    monkeypatch.setattr(wikitext_module, "article_lead", fragile_lead)
    records, _ = read("mediawiki", xml_dump(xml_page("A", 1, "A deep page."), xml_page("B", 2, "B is fine.")))
    assert [r.kind for r in records] == ["quarantine", "doc"]
    assert records[0].reason == "unreadable wikitext: RecursionError: maximum recursion depth exceeded"


def test_mediawiki_unterminated_last_page_is_quarantined() -> None:
    dump = xml_dump(xml_page("Paris", 1, "Paris is a city."), end=False) + "  <page>\n    <title>Cut</title>\n"
    records, _ = read("mediawiki", dump)
    assert [r.kind for r in records] == ["doc", "quarantine"]
    assert records[1].position == 2 and records[1].group == "invalid xml page"


def test_mediawiki_non_utf8_page_is_quarantined_and_reading_goes_on() -> None:
    dump = xml_dump(
        xml_page("Paris", 1, "Paris is a city."),
        xml_page("Caf\u00e9", 2, "Latin-1."),
        xml_page("Lyon", 3, "Lyon too."),
    )
    data = dump.encode("utf-8").replace("Caf\u00e9".encode("utf-8"), "Caf\u00e9".encode("latin-1"))
    records, _ = read("mediawiki", data)
    assert [r.kind for r in records] == ["doc", "quarantine", "doc"]
    assert records[1].group == "non-utf8 bytes" and records[1].position == 2


def test_mediawiki_truncated_bz2_quarantines_the_page_being_read() -> None:
    pages = [xml_page(f"Page {i}", i, f"Page {i} is a page about the number {i}. " * 20) for i in range(1, 400)]
    compressed = bz2.compress(xml_dump(*pages).encode(), compresslevel=1)
    records, counts = read("mediawiki", compressed[: len(compressed) // 2])
    *docs, tail = records
    assert len(docs) > 50 and [d.doc_id for d in docs] == [str(i) for i in range(1, len(docs) + 1)]
    assert tail.group == "truncated bz2 stream" and tail.position == len(docs) + 1
    assert tail.raw.lstrip().startswith("<page>")


# --- mediawiki: the real samples -----------------------------------------------------------------


def decompressed(path: Path) -> str:
    return bz2.decompress(path.read_bytes()).decode("utf-8")


def independent_pages(path: Path) -> list[dict]:
    """The pages of a dump, found by plain string scanning (no XML parser, no wikitext parser)."""
    xml = decompressed(path)
    pages = []
    for page in re.findall(r"<page>.*?</page>", xml, re.DOTALL):
        text = re.search(r"<text[^>]*>(.*?)</text>", page, re.DOTALL)
        pages.append(
            {
                "title": html.unescape(re.search(r"<title>(.*?)</title>", page).group(1)),
                "ns": re.search(r"<ns>(\d+)</ns>", page).group(1),
                "redirect": "<redirect" in page,
                "text": html.unescape(text.group(1)) if text else "",
            }
        )
    return pages


def _remove_innermost(text: str, opener: str, closer: str) -> str:
    """Remove `opener ... closer` spans innermost first until none is left (templates, tables)."""
    start, end = re.escape(opener), re.escape(closer)
    inner = re.compile(f"{start}(?:(?!{start}|{end}).)*?{end}", re.DOTALL)
    while True:
        text, removed = inner.subn("", text)
        if not removed:
            return text


def _remove_links_to(text: str, prefixes: str) -> str:
    """Remove [[Prefix:...]] links with everything nested in them (an image caption's own links)."""
    start_re = re.compile(rf"\[\[\s*(?:{prefixes})\s*:", re.IGNORECASE)
    out, i = [], 0
    while match := start_re.search(text, i):
        out.append(text[i : match.start()])
        depth, j = 0, match.start()
        while j < len(text):
            if text.startswith("[[", j):
                depth, j = depth + 1, j + 2
            elif text.startswith("]]", j):
                depth, j = depth - 1, j + 2
                if depth == 0:
                    break
            else:
                j += 1
        i = j
    return "".join(out) + text[i:]


# {{small|text with [[links|shown]]}}: the one parameter may hold links, whose "|" is not a separator.
INLINE_TEMPLATE_RE = re.compile(
    r"\{\{\s*(?:nowrap|nobr|small|smaller|big|larger|abbr)\s*\|((?:[^{}|\[\]]|\[\[[^\[\]]*\]\])*)\}\}", re.IGNORECASE
)
WIKILINK_RE = re.compile(r"\[\[([^\[\]|]*)(?:\|([^\[\]]*))?\]\]")
NAMESPACE_PREFIX_RE = re.compile(
    r"^:?\s*(?:Wikipedia|WP|Portal|Help|Template|User|Talk|Special|Draft|Module|wikt|[a-z]{2,3}):", re.IGNORECASE
)


def independent_lead_link_count(wikitext: str) -> int:
    """Article links in the lead, counted with regular expressions only.

    The same definition as the reader's: the text before the first heading, without comments, refs,
    templates (except the inline-text ones the reader unwraps), tables, files/images (with their
    captions), categories and interlanguage links; then every [[target|...]] whose target is an
    article (not another namespace or wiki, not a "#section" of the page itself).
    """
    text = re.sub(r"<!--.*?-->", "", wikitext, flags=re.DOTALL)
    heading = re.search(r"^=+[^=\n].*?=+[ \t]*$", text, re.MULTILINE)
    text = text[: heading.start()] if heading else text
    text = re.sub(r"<ref[^>]*/>", "", text)
    text = re.sub(r"<ref[^>]*>.*?</ref>", "", text, flags=re.DOTALL)
    text = re.sub(r"<(gallery|math|timeline|imagemap|score)[^>]*>.*?</\1>", "", text, flags=re.DOTALL)
    text = INLINE_TEMPLATE_RE.sub(r"\1", text)
    text = _remove_innermost(text, "{{", "}}")
    text = _remove_innermost(text, "{|", "|}")
    text = _remove_links_to(text, r"File|Image|Media|Category|[a-z]{2,3}(?:-[a-z0-9]+)*")
    count = 0
    for target, _anchor in WIKILINK_RE.findall(text):
        target = target.strip()
        if target and not target.startswith("#") and not NAMESPACE_PREFIX_RE.match(target):
            count += 1
    return count


@pytest.fixture(scope="module")
def wiki_sample(shared_data: Path) -> tuple[Path, list, ReadCounts]:
    path = shared_data / WIKI_SAMPLE
    counts = ReadCounts()
    with path.open("rb") as stream:
        records = list(read_records("mediawiki", stream, WIKI_SAMPLE, counts))
    return path, records, counts


@pytest.mark.shared_data
def test_real_dump_counts_agree_with_an_independent_count(wiki_sample) -> None:
    path, records, counts = wiki_sample
    pages = independent_pages(path)
    articles = [p for p in pages if p["ns"] == "0" and not p["redirect"]]
    redirects = [p for p in pages if p["ns"] == "0" and p["redirect"]]
    others = [p for p in pages if p["ns"] != "0"]
    assert (len(pages), len(articles), len(redirects), len(others)) == (206, 106, 99, 1)
    assert decompressed(path).count("[[") == 32_641  # the data README's figure (edit summaries included)

    assert counts.balanced
    assert counts.redirects == len(redirects) and counts.skipped == len(others)
    assert counts.docs + counts.quarantined == len(articles)
    # The one article that is not a doc is a list whose lead holds only templates: no text.
    (empty,) = only(records, "quarantine")
    assert empty.reason == "empty text" and "<title>List of anthropologists</title>" in empty.raw
    assert counts.docs == 105
    assert {(r.from_title, r.to_title) for r in only(records, "redirect")} >= {
        ("AccessibleComputing", "Computer accessibility"),
        ("AfghanistanHistory", "History of Afghanistan"),
    }


@pytest.mark.shared_data
def test_real_dump_link_counts_per_page_match_an_independent_count(wiki_sample) -> None:
    path, records, _ = wiki_sample
    docs = {doc.title: doc for doc in only(records, "doc")}
    expected = {
        normalize_title(p["title"]): independent_lead_link_count(p["text"])
        for p in independent_pages(path)
        if p["ns"] == "0" and not p["redirect"]
    }
    found = {title: len(doc.links) for title, doc in docs.items()}
    assert found == {title: n for title, n in expected.items() if title in docs}
    assert sum(found.values()) > 1500
    for doc in docs.values():  # each anchor is in the sentence its link points to
        for link in doc.links:
            assert link.anchor in doc.sentences[link.sentence], (doc.title, link)


@pytest.mark.shared_data
@pytest.mark.parametrize("sample", [WIKI_SAMPLE, TABLE_SAMPLE])
def test_real_dumps_leave_no_markup_in_sentences(shared_data: Path, sample: str) -> None:
    with (shared_data / sample).open("rb") as stream:
        docs = only(list(read_records("mediawiki", stream, sample)), "doc")
    assert docs
    for doc in docs:
        assert doc.text == "".join(doc.sentences) and doc.text.strip() == doc.text
        for sentence in doc.sentences:
            assert not LEFTOVER_MARKUP.search(sentence), (doc.title, sentence)


@pytest.mark.shared_data
def test_table_heavy_pages_yield_clean_text(shared_data: Path) -> None:
    path = shared_data / TABLE_SAMPLE
    with path.open("rb") as stream:
        records = list(read_records("mediawiki", stream, TABLE_SAMPLE))
    assert [r.kind for r in records] == ["doc"] * 5
    assert records[3].title == "Economy of Estonia"
    assert records[3].sentences[0] == (
        "Estonian economy is an advanced economy and a member of the European Union and of the eurozone."
    )
    # The leads hold few tables; render each whole article (headings removed) to exercise the stripping.
    table_markup = re.compile(r"\{\||\|\}|\|\||\|-|^\s*[|!]|(?:class|style|align|colspan|rowspan)\s*=")
    sentences = 0
    for page in independent_pages(path):
        assert page["text"].count("{|") >= 1
        whole = re.sub(r"^=+[^=\n].*?=+[ \t]*$", "", page["text"], flags=re.MULTILINE)
        lead = wikitext_module.article_lead(whole)
        sentences += len(lead.sentences)
        for sentence in lead.sentences:
            assert not table_markup.search(sentence), (page["title"], sentence)
            assert not LEFTOVER_MARKUP.search(sentence), (page["title"], sentence)
    assert sentences > 500


def test_kinds_are_what_the_pipeline_dispatches_on() -> None:
    assert (Doc.kind, Redirect.kind, Quarantine.kind) == ("doc", "redirect", "quarantine")
    counts = ReadCounts(records=3)
    for record in (Doc("1", "A", ["a"], "s"), Redirect("B", "A", "s"), Quarantine("s", 3, "empty text", "")):
        counts.add(record)
    assert counts.balanced and Counter(vars(counts)) == Counter(
        {"records": 3, "skipped": 0, "docs": 1, "redirects": 1, "quarantined": 1}
    )
