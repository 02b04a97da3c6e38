"""Retrieval: the stage that turns a question into the documents its evidence graph is built from.

    analyzer.py        one text analyzer (NFKC, lower-case, word tokens, stop words, Snowball stems)
                       shared by the index and the queries
    bm25.py            exact BM25 (rank-bm25's Okapi scores), sharded by document range, saved as
                       arrays + a JSON manifest under any storage URI
    index.py           the sharded index on storage: doc ranges, shards, its manifest (written and read)
    entity_linking.py  commonness entity linking from Wikipedia's anchors
    expansion.py       hyperlink expansion along the links table
    candidates.py      candidate assembly: BM25 ∪ entity links ∪ expansion, per question
    evaluate.py        retrieval quality (the paper's Table 6 measures)

Import the modules you need (`from xh.retrieval.bm25 import BM25Shard`); importing this package
loads nothing else.

Everything read or written is a `xh.store.Location` (a URI and the store that reaches it); a plain URI
given instead is one of the environment's store (`located`), as a local path in a test or a notebook is.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from xh.store import Location


def located(where: Location | str) -> Location:
    """`where` as a Location: one given stays as it is; a URI (a local path, or s3:// with the S3 settings of
    the environment) becomes one of the default store."""
    from xh.store import Location, Store

    return where if isinstance(where, Location) else Store().at(where)
