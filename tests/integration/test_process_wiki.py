"""Wikipedia processing on the real Ray cluster: generated dump via S3, real XML sample, same tables as one process."""

import bz2
import json
import re

import pyarrow.dataset as pads
import pytest

from tests.conftest import TEST_BUCKET
from workflows import wiki
from xh import synth
from xh.config import load_config
from xh.stages import wiki as wiki_stage
from xh.storage.store import Store


def read_table(fs, path, name):
    return pads.dataset(f"{path}/{name}", filesystem=fs, format="parquet").to_table()


def test_generated_dump_on_s3_round_trips_every_true_link(ray_cluster, s3_endpoint):
    spec = synth.WorldSpec(num_docs=600, seed=5)
    world = f"s3://{TEST_BUCKET}/wiki-world"
    written = synth.write_world(
        spec, synth.output_under(Store(s3=s3_endpoint).at(world)), docs_per_shard=150, num_questions=5, num_claims=5
    )
    cfg = load_config(
        None,
        [
            f"wiki.inputs=['{world}/wiki']",
            f"wiki.output=s3://{TEST_BUCKET}/wiki-tables",
            "wiki.partitions=4",
            "wiki.rows_per_file=1000",
        ],
    )
    summary = wiki.run(cfg)
    assert (summary["files"], summary["records"], summary["docs"], summary["quarantined"]) == (4, 600, 600, 0)
    assert summary["links"] == written.num_links and summary["missing_links"] == 0

    fs = s3_endpoint.pyarrow_fs()
    docs = read_table(fs, f"{TEST_BUCKET}/wiki-tables", "docs")
    title_of = dict(zip(docs["doc_id"].to_pylist(), docs["title"].to_pylist()))
    links = read_table(fs, f"{TEST_BUCKET}/wiki-tables", "links").to_pylist()
    found = {(title_of[r["src_doc_id"]], title_of[r["target_doc_id"]], r["anchor"], r["sentence"]) for r in links}
    truth = set()
    for k in range(written.num_shards):
        with fs.open_input_stream(f"{TEST_BUCKET}/wiki-world/{synth.links_shard_path(k)}", compression=None) as f:
            for line in bz2.decompress(f.read()).splitlines():
                row = json.loads(line)
                truth.add((row["source"], row["target"], row["anchor"], row["sentence"]))
    assert found == truth

    anchors = read_table(fs, f"{TEST_BUCKET}/wiki-tables", "anchors")
    assert sum(anchors["count"].to_pylist()) == sum(1 for r in links if r["anchor"].strip())


@pytest.mark.shared_data
def test_real_xml_sample_matches_an_independent_count_and_one_process(ray_cluster, shared_data, tmp_path):
    sample = shared_data / "wiki"
    xml = bz2.decompress((sample / "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2").read_bytes())
    pages = re.findall(rb"<page>.*?</page>", xml, re.S)
    main_ns = [p for p in pages if b"<ns>0</ns>" in p]
    redirects = sum(1 for p in main_ns if b"<redirect" in p)

    cfg = load_config(None, ["wiki.format=mediawiki", f"wiki.inputs=['{sample}']", f"wiki.output={tmp_path / 'ray'}"])
    summary = wiki.run(cfg)
    # two files: the 206-page sample and the 5 table-heavy pages (one of which repeats an id of the first)
    assert (len(pages), len(main_ns), redirects) == (206, 205, 99)  # one Wikipedia: page, one redirect among them
    assert summary["redirects"] == redirects
    assert summary["records"] == summary["docs"] + summary["redirects"] + summary["quarantined"]
    assert summary["records"] + summary["skipped"] == len(pages) + 5
    # articles: every main-namespace page that is not a redirect, in both files, less the quarantined
    # ones (an article whose lead is empty, and the table-heavy file's copy of an id of the first file)
    assert summary["docs"] == len(main_ns) - redirects + 5 - summary["quarantined"]
    assert summary["duplicate_ids"] == 1

    one_process = wiki_stage.write_tables(
        Store().at(str(tmp_path / "loop")), [Store().at(str(sample))], "mediawiki", partitions=8, local=True
    )
    counts = [k for k in one_process if k not in (*wiki_stage.TIMINGS, "output")]
    assert {k: summary[k] for k in counts} == {k: one_process[k] for k in counts}
    for name in ("docs", "links", "redirects", "anchors", "quarantine"):
        ray_rows = read_table(None, tmp_path / "ray", name).to_pylist()
        loop_rows = read_table(None, tmp_path / "loop", name).to_pylist()
        key = lambda r: json.dumps(r, sort_keys=True, default=str)  # noqa: E731
        assert sorted(ray_rows, key=key) == sorted(loop_rows, key=key), name


def test_bad_input_lands_in_quarantine_with_its_reason(ray_cluster, tmp_path):
    def good(i, title):
        return json.dumps(
            {"id": str(i), "title": title, "text": [f"{title} is a page."], "text_with_links": [f"{title} is a page."]}
        )

    lines = [
        good(1, "One").encode(),
        b'{"id": "2", "title": "Two", "text": ["unterminated',  # invalid json
        json.dumps({"id": "3", "text": ["No title."], "text_with_links": ["No title."]}).encode(),  # missing title
        json.dumps({"id": "4", "title": "Empty", "text": ["  "], "text_with_links": ["  "]}).encode(),  # empty text
        b'{"id": "5", "title": "Caf\xe9", "text": ["x"], "text_with_links": ["x"]}',  # latin-1 byte, not UTF-8
        good(1, "One again").encode(),  # duplicate id within the file
    ]
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.bz2").write_bytes(bz2.compress(b"\n".join(lines)))
    # level 1 = 100 kB blocks, so the first blocks survive the cut and their docs come out
    whole = bz2.compress("\n".join(good(i, f"Page {i}") for i in range(10, 4000)).encode(), 1)
    (tmp_path / "in" / "b.bz2").write_bytes(whole[: len(whole) // 2])  # truncated mid-stream
    (tmp_path / "in" / "c.bz2").write_bytes(bz2.compress(good(1, "One, third file").encode()))  # id 1 again

    cfg = load_config(None, [f"wiki.inputs=['{tmp_path / 'in'}']", f"wiki.output={tmp_path / 'out'}"])
    summary = wiki.run(cfg)
    assert summary["records"] == summary["docs"] + summary["redirects"] + summary["quarantined"]
    quarantine = read_table(None, tmp_path / "out", "quarantine").to_pylist()
    reasons = {q["reason"].split(":")[0] for q in quarantine}
    assert reasons == {
        "invalid json",
        "missing title",
        "empty text",
        "non-utf8 bytes",
        "duplicate id",
        "truncated bz2 stream",
    }
    assert sum(q["reason"].startswith("duplicate id") for q in quarantine) == 2  # within a file, across files
    truncated = [q for q in quarantine if q["reason"].startswith("truncated")][0]
    assert truncated["source"].endswith("b.bz2") and truncated["position"] > 1
    docs = read_table(None, tmp_path / "out", "docs").to_pylist()
    assert [d["title"] for d in docs if d["doc_id"] == "1"] == ["One"]
    assert summary["docs"] == len(docs) == 1 + truncated["position"] - 1
