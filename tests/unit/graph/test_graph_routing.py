"""Routing the docs and links each graph shard needs to its folder: one read per table file, nothing else kept."""

import pyarrow as pa
import pyarrow.parquet as pq

from xh import schemas
from xh.config import GraphsConfig
from xh.graph.build import route_file, shard_docs, shard_key
from xh.graph.hotpot import HotpotGraphBuilder
from xh.store import Store


def _item(position, doc_ids):
    return {"position": position, "candidates": [{"doc_id": d} for d in doc_ids]}


def _docs(ids):
    rows = [{"doc_id": d, "title": f"T{d}", "text": f"t{d}", "sentences": [f"s{d}.", "x."], "source": "f"} for d in ids]
    return pa.Table.from_pylist(rows, schema=schemas.DOCS)


def _links(pairs):
    rows = [
        {
            "src_doc_id": s,
            "target_title": f"T{t}",
            "target_doc_id": t,
            "anchor": f"a{s}{t}",
            "sentence": 0,
            "missing": False,
        }
        for s, t in pairs
    ]
    return pa.Table.from_pylist(rows, schema=schemas.LINKS)


def test_each_shard_gets_its_docs_and_the_links_among_them_from_files_read_row_group_by_row_group(tmp_path):
    shards = [[_item(1, ["1", "2"]), _item(2, ["2", "9"])], [_item(3, ["3", "1"])]]  # "9" is in no file
    wanted = shard_docs(shards)
    assert sorted(zip(wanted["doc_id"].to_pylist(), wanted["shard"].to_pylist())) == [
        ("1", shard_key(shards[0])),
        ("1", shard_key(shards[1])),
        ("2", shard_key(shards[0])),
        ("3", shard_key(shards[1])),
        ("9", shard_key(shards[0])),
    ]
    tables = tmp_path / "tables"
    (tables / "docs").mkdir(parents=True)
    (tables / "links").mkdir()
    pq.write_table(_docs(["1", "2", "3", "4"]), tables / "docs" / "a.parquet", row_group_size=2)
    pq.write_table(_docs(["5"]), tables / "docs" / "b.parquet")
    # 1->2 inside shard 0; 3->1 inside shard 1; 2->3 crosses shards; 1->1 a self-link; 4->1 from an unwanted doc
    pq.write_table(_links([("1", "2"), ("3", "1"), ("2", "3"), ("1", "1"), ("4", "1")]), tables / "links" / "l.parquet")
    routed = tmp_path / "routed"
    written = [
        route_file("docs", Store().at(str(tables / "docs" / "a.parquet")), wanted, Store().at(str(routed))),
        route_file("docs", Store().at(str(tables / "docs" / "b.parquet")), wanted, Store().at(str(routed))),
        route_file("links", Store().at(str(tables / "links" / "l.parquet")), wanted, Store().at(str(routed))),
    ]
    assert written == [4, 0, 2]
    first, second = (routed / shard_key(s) for s in shards)
    assert sorted(pq.read_table(first / "docs")["doc_id"].to_pylist()) == ["1", "2"]
    assert sorted(pq.read_table(second / "docs")["doc_id"].to_pylist()) == ["1", "3"]
    assert pq.read_table(first / "links").select(["src_doc_id", "target_doc_id"]).to_pylist() == [
        {"src_doc_id": "1", "target_doc_id": "2"}
    ]
    # a shard's builder reads its folder as it reads the tables: the texts and the link come back whole
    builder = HotpotGraphBuilder.load(str(second), ["1", "3"], GraphsConfig())
    assert builder.docs["3"] == ("T3", ["s3.", "x."])
    assert builder.links == {"3": [("1", "a31", 0)]}
