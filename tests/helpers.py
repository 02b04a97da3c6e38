"""What several test files share: a retriever without an index on disk."""

from __future__ import annotations


def tables_retriever(tables, settings):
    """A `xh.retrieval.candidates.Retriever` with `settings` (a `RetrieveConfig`) over a tables folder: one
    BM25 shard of its docs' "Title. text", built in memory, its entity linker and its link graph."""
    import pyarrow.parquet as pq

    from xh.retrieval.analyzer import Analyzer
    from xh.retrieval.bm25 import BM25Shard, CorpusStats
    from xh.retrieval.candidates import Retriever
    from xh.retrieval.entity_linking import EntityLinker
    from xh.retrieval.expansion import LinkGraph

    docs = pq.read_table(f"{tables}/docs", columns=["doc_id", "title", "text"])
    tokens = Analyzer().analyze_batch(
        [f"{t}. {x}" for t, x in zip(docs["title"].to_pylist(), docs["text"].to_pylist())]
    )
    shard = BM25Shard.build(docs["doc_id"].to_pylist(), tokens, CorpusStats.from_token_lists(tokens))
    return Retriever([shard], EntityLinker.load(str(tables)), LinkGraph.load(str(tables)), settings)
