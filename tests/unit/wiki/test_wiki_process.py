"""The corpus-wide half of Wikipedia processing, in one process: dedup, redirects, links, anchors."""

import bz2
import json

import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest

from xh import schemas
from xh.stages import wiki
from xh.storage.store import Store
from xh.wiki import process


def hotpot_line(doc_id, title, sentences_with_links):
    import re

    plain = [re.sub(r"<[^>]*>", "", s) for s in sentences_with_links]
    return json.dumps({"id": doc_id, "title": title, "text": plain, "text_with_links": sentences_with_links})


def mediawiki_page(page_id, title, text=None, redirect=None):
    body = f'<redirect title="{redirect}" />' if redirect else ""
    text = f"#REDIRECT [[{redirect}]]" if redirect else text
    return (
        f"<page><title>{title}</title><ns>0</ns><id>{page_id}</id>{body}"
        f'<revision><id>1</id><text xml:space="preserve">{text}</text></revision></page>'
    )


def mediawiki_dump(pages):
    return (
        '<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.10/"><siteinfo><namespaces>'
        '<namespace key="0" /></namespaces></siteinfo>' + "".join(pages) + "</mediawiki>"
    )


def _tables(out: str, dump, fmt: str, **settings) -> dict:
    """The wiki stage's one sequence, every step in this process; the summary without its timings."""
    summary = wiki.write_tables(Store().at(out), [Store().at(str(dump))], fmt, local=True, **settings)
    assert all(summary.pop(key) >= 0 for key in wiki.TIMINGS)
    return summary


def table(root, name):
    return pads.dataset(f"{root}/{name}", format="parquet").to_table().to_pylist()


@pytest.fixture
def hotpot_dump(tmp_path):
    a = [
        hotpot_line(
            "1", "Alpha", ['Alpha is near <a href="Beta">the Beta</a>.', ' It faces <a href="Gamma%20Town">Gamma</a>.']
        ),
        '{"id": "9", "title": ',  # invalid JSON
        hotpot_line("2", "Beta", ['Beta links <a href="Nowhere">nowhere</a> and <a href="alpha">Alpha</a>.']),
    ]
    b = [
        hotpot_line("2", "Beta again", ['A second copy <a href="Alpha">links Alpha</a>.']),  # id 2 seen in file a
        hotpot_line("3", "Gamma Town", ['Gamma Town is <a href="Beta">the Beta</a> of <a href="Alpha">Alpha</a>.']),
    ]
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.bz2").write_bytes(bz2.compress("\n".join(a).encode()))
    (tmp_path / "in" / "b.bz2").write_bytes(bz2.compress("\n".join(b).encode()))
    return tmp_path


def test_hotpot_dump_resolves_links_dedups_ids_and_counts_anchors(hotpot_dump):
    out = str(hotpot_dump / "out")
    summary = _tables(out, hotpot_dump / "in", "hotpot", partitions=3, rows_per_file=2)

    assert summary == {
        "format": "hotpot",
        "files": 2,
        "records": 5,
        "skipped": 0,
        "docs": 3,
        "redirects": 0,
        "links": 6,
        "missing_links": 1,
        "redirects_unresolved": 0,
        "quarantined": 2,
        "duplicate_ids": 1,
        "output": out,
    }
    assert summary["records"] == summary["docs"] + summary["redirects"] + summary["quarantined"]
    docs = {d["doc_id"]: d for d in table(out, "docs")}
    assert {d: docs[d]["title"] for d in docs} == {"1": "Alpha", "2": "Beta", "3": "Gamma Town"}  # first copy kept
    assert docs["1"]["text"] == "Alpha is near the Beta. It faces Gamma."

    links = {(r["src_doc_id"], r["anchor"]): r for r in table(out, "links")}
    assert len(links) == 6 and ("2", "links Alpha") not in links  # the dropped copy's links went with it
    assert links[("1", "Gamma")]["target_doc_id"] == "3" and links[("1", "Gamma")]["sentence"] == 1
    assert links[("2", "Alpha")]["target_doc_id"] == "1"  # "alpha" -> "Alpha": first-letter case
    assert links[("2", "nowhere")]["missing"] and links[("2", "nowhere")]["target_doc_id"] is None

    anchors = {(r["surface"], r["doc_id"]): r["count"] for r in table(out, "anchors")}
    assert anchors == {("the beta", "2"): 2, ("gamma", "3"): 1, ("alpha", "1"): 2}

    reasons = sorted(r["reason"].split(":")[0] for r in table(out, "quarantine"))
    assert reasons == ["duplicate id", "invalid json"]
    assert all(pq.read_metadata(f).num_rows <= 2 for f in (hotpot_dump / "out").rglob("*.parquet"))
    assert not (hotpot_dump / "out" / process.STAGING).exists()
    for name, schema in schemas.TABLES.items():
        assert pads.dataset(f"{out}/{name}", format="parquet").schema.equals(schema, check_metadata=False)


def test_mediawiki_redirects_resolve_and_links_follow_them(tmp_path):
    pages = [
        mediawiki_page(10, "United States", "The '''United States''' is a country in [[North America]]."),
        mediawiki_page(11, "USA", redirect="United States"),
        mediawiki_page(12, "Lost", redirect="Page that is not there"),
        mediawiki_page(13, "Ohio", "Ohio is a state of the [[USA|U.S.]] next to [[United States|America]]."),
    ]
    (tmp_path / "dump.xml").write_text(mediawiki_dump(pages))
    out = str(tmp_path / "out")
    summary = _tables(out, tmp_path / "dump.xml", "mediawiki", partitions=4)
    assert (summary["docs"], summary["redirects"], summary["redirects_unresolved"]) == (2, 2, 1)

    redirects = {r["from_title"]: r["to_doc_id"] for r in table(out, "redirects")}
    assert redirects == {"USA": "10", "Lost": None}
    links = {r["anchor"]: r for r in table(out, "links")}
    assert links["U.S."]["target_title"] == "USA" and links["U.S."]["target_doc_id"] == "10"
    assert links["America"]["target_doc_id"] == "10"
    assert links["North America"]["missing"]
    anchors = {(r["surface"], r["doc_id"]): r["count"] for r in table(out, "anchors")}
    assert anchors == {("u.s.", "10"): 1, ("america", "10"): 1}


def test_a_rerun_replaces_its_tables(hotpot_dump):
    out = str(hotpot_dump / "out")
    first = _tables(out, hotpot_dump / "in", "hotpot", partitions=2)
    second = _tables(out, hotpot_dump / "in", "hotpot", partitions=5)
    assert first == second and len(table(out, "docs")) == 3


def test_missing_input_is_one_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such file or folder"):
        process.input_files([Store().at(str(tmp_path / "nope"))], "hotpot")
    with pytest.raises(FileNotFoundError, match="no input given"):
        process.input_files([], "hotpot")
