"""Retrieval: the first stage that turns a question into candidate documents.

    analyzer.py   one text analyzer (NFKC, lower-case, word tokens, stop words, Snowball stems)
                  shared by the index and the queries
    bm25.py       exact BM25 (rank-bm25's Okapi scores), sharded by document range, saved as
                  arrays + a JSON manifest under any storage URI

Import the modules you need (`from xh.retrieval.bm25 import BM25Shard`); importing this package
loads nothing else.
"""
