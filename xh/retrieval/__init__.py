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

Everything read or written is a `xh.storage.store.Location` (a URI and the store that reaches it); a plain URI
given instead is one of the environment's store (`xh.storage.store.located`), as a local path in a test or a notebook is.
"""
