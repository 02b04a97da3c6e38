"""The Arrow schemas of every table that passes between stages, written once.

Tables live as Parquet folders under the storage root (`<root>/tables/<name>/`). A stage that
writes a table casts to the schema here; a stage that reads one can rely on it.

    docs        one row per article: its lead paragraph, split into sentences
    links       one row per hyperlink in a doc: the link graph the retriever expands along
    redirects   one row per redirect page
    anchors     surface form -> doc -> count: the statistics of a commonness entity linker
    quarantine  every input record that could not be read, with where it was and why
    questions   HotpotQA questions (with answers and supporting facts when known)
    candidates  per question, the documents retrieval proposes: BM25 (ir), entity links (el), expansion (exp)
"""

from __future__ import annotations

import pyarrow as pa

DOCS = pa.schema(
    [
        pa.field("doc_id", pa.string(), nullable=False),
        pa.field("title", pa.string(), nullable=False),  # normalised (see xh.wiki.titles)
        pa.field("text", pa.string(), nullable=False),  # "".join(sentences)
        pa.field("sentences", pa.list_(pa.string()), nullable=False),
        pa.field("source", pa.string(), nullable=False),  # the file it was read from
    ]
)

LINKS = pa.schema(
    [
        pa.field("src_doc_id", pa.string(), nullable=False),
        pa.field("target_title", pa.string(), nullable=False),  # normalised, as written in the link
        pa.field("target_doc_id", pa.string()),  # after redirects; null when the page is missing
        pa.field("anchor", pa.string(), nullable=False),
        pa.field("sentence", pa.int32(), nullable=False),  # index into the source doc's sentences
        pa.field("missing", pa.bool_(), nullable=False),  # target page not in the corpus
    ]
)

REDIRECTS = pa.schema(
    [
        pa.field("from_title", pa.string(), nullable=False),
        pa.field("to_title", pa.string(), nullable=False),
        pa.field("to_doc_id", pa.string()),  # null when the target page is missing
    ]
)

ANCHORS = pa.schema(
    [
        pa.field("surface", pa.string(), nullable=False),  # lower-cased anchor text
        pa.field("doc_id", pa.string(), nullable=False),
        pa.field("count", pa.int64(), nullable=False),
    ]
)

QUARANTINE = pa.schema(
    [
        pa.field("source", pa.string(), nullable=False),  # file (or stage) the record came from
        pa.field("position", pa.int64(), nullable=False),  # line number, page number or row index
        pa.field("reason", pa.string(), nullable=False),
        pa.field("raw", pa.string(), nullable=False),  # the record, truncated to RAW_LIMIT characters
    ]
)

SUPPORTING_FACT = pa.struct([pa.field("title", pa.string()), pa.field("sent", pa.int32())])

QUESTIONS = pa.schema(
    [
        pa.field("qid", pa.string(), nullable=False),
        pa.field("question", pa.string(), nullable=False),
        pa.field("answer", pa.string()),  # null for new questions
        pa.field("type", pa.string()),  # bridge / comparison; null when unknown
        pa.field("level", pa.string()),
        pa.field("supporting_facts", pa.list_(SUPPORTING_FACT)),  # titles normalised
    ]
)

CANDIDATES = pa.schema(
    [
        pa.field("qid", pa.string(), nullable=False),
        pa.field("doc_id", pa.string(), nullable=False),
        pa.field("source", pa.string(), nullable=False),  # ir (BM25), el (entity link), exp (hyperlink expansion)
        pa.field("score", pa.float64(), nullable=False),
        pa.field("rank", pa.int32(), nullable=False),  # within its source, 0-based
        pa.field("ranker", pa.string(), nullable=False),  # what ordered it: bm25, commonness, reranker, links
        pa.field("surface", pa.string()),  # el only: the question text linked to the doc
    ]
)

RAW_LIMIT = 2000

TABLES = {"docs": DOCS, "links": LINKS, "redirects": REDIRECTS, "anchors": ANCHORS, "quarantine": QUARANTINE}
