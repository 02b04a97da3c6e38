"""The Arrow schemas of every table that passes between stages, written once.

Tables live as Parquet folders under the storage root (`<root>/tables/<name>/`). A stage that
writes a table casts to the schema here; a stage that reads one can rely on it.

    docs        one row per article: its lead paragraph, split into sentences
    links       one row per hyperlink in a doc: the link graph the retriever expands along
    redirects   one row per redirect page
    anchors     surface form -> doc -> count: the statistics of a commonness entity linker
    quarantine  every input record that could not be read, with where it was and why
    questions   HotpotQA questions (with answers and supporting facts when known)
    claims      FEVER claims (with labels and gold evidence groups when known)
    candidates  per question, the documents retrieval proposes: BM25 (ir), entity links (el), expansion (exp)
    graphs      one evidence graph per question or claim: node texts, edges and character-level labels
                (text, not token ids, so that one table serves any backbone; see xh.graph.encoded)
    predictions one row per scored question: the answer, its evidence, and which model and corpus made it
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
        pa.field("ranker", pa.string(), nullable=False),  # what ordered it: bm25, commonness, reranker, paths, links
        pa.field("surface", pa.string()),  # el only: the question text linked to the doc
    ]
)

SPAN = pa.struct([pa.field("start", pa.int32()), pa.field("end", pa.int32())])  # characters, end exclusive

GRAPH_NODE = pa.struct(
    [
        pa.field("doc_id", pa.string()),
        pa.field("title", pa.string()),
        # HotpotQA: the paragraph's sentences (paragraph = "".join(sentences));
        # FEVER: one sentence, the evidence candidate.
        pa.field("sentences", pa.list_(pa.string())),
        # HotpotQA: texts of the links into this node from other nodes of the graph, in a fixed order;
        # FEVER: [page title].
        pa.field("anchors", pa.list_(pa.string())),
        pa.field("source", pa.string()),  # ir / el / exp / context (distractor setting) / evidence / retrieved
        pa.field("score", pa.float64()),  # the retrieval score that put the node here
        pa.field("line", pa.int32()),  # FEVER: the sentence's line in its page; -1 for HotpotQA
        # Labels, null or empty when unknown:
        pa.field("answer_spans", pa.list_(SPAN)),  # every occurrence of the answer in the paragraph
        pa.field("supporting_sentences", pa.list_(pa.int32())),  # indices into sentences
        pa.field("is_evidence", pa.bool_()),  # holds a supporting fact (HotpotQA) / gold evidence (FEVER)
    ]
)

# FEVER: one gold evidence sentence, as FEVER's evidence names it (page id, e.g. "Soul_Food_-LRB-film-RRB-",
# and line number); the page id is the `doc_id` of a docs table read from FEVER's wiki-pages.
EVIDENCE_SENTENCE = pa.struct([pa.field("page", pa.string()), pa.field("line", pa.int32())])

GRAPH_EDGE = pa.struct([pa.field("src", pa.int32()), pa.field("dst", pa.int32())])  # dst's hub attends to src's

GRAPHS = pa.schema(
    [
        pa.field("qid", pa.string(), nullable=False),
        pa.field("task", pa.string(), nullable=False),  # hotpot / fever
        pa.field("question", pa.string(), nullable=False),  # the question or the claim
        pa.field("question_type", pa.string()),  # bridge / comparison (HotpotQA)
        pa.field("question_type_source", pa.string()),  # data / classifier
        pa.field("answer", pa.string()),  # HotpotQA gold answer, null when unknown
        pa.field("answer_type", pa.string()),  # span / yes / no
        pa.field("claim_label", pa.string()),  # FEVER: SUPPORTS / REFUTES / NOT ENOUGH INFO
        pa.field("supporting_facts", pa.list_(SUPPORTING_FACT)),  # gold, for evaluation
        pa.field("nodes", pa.list_(GRAPH_NODE), nullable=False),
        pa.field("edges", pa.list_(GRAPH_EDGE), nullable=False),
        pa.field("edge_mode", pa.string(), nullable=False),  # hyperlink / bidirectional / full / sequence / typed
        # edge mode typed: each edge's type (xh.graph.typed.EDGE_TYPES), parallel to `edges`; null otherwise
        # (last and nullable: tables written before it read as null)
        pa.field("edge_types", pa.list_(pa.string())),
        # FEVER: the claim's gold evidence groups as in CLAIMS (page ids), for the official FEVER score
        pa.field("evidence", pa.list_(pa.list_(EVIDENCE_SENTENCE))),
    ]
)

CLAIMS = pa.schema(
    [
        pa.field("qid", pa.string(), nullable=False),  # FEVER's claim id, as a string
        pa.field("claim", pa.string(), nullable=False),
        pa.field("label", pa.string()),  # SUPPORTS / REFUTES / NOT ENOUGH INFO; null for new claims
        # Gold evidence groups: the claim is verified by ALL sentences of ANY one group (FEVER score).
        # [] for NOT ENOUGH INFO; null when unknown (new claims).
        pa.field("evidence", pa.list_(pa.list_(EVIDENCE_SENTENCE))),
    ]
)

PREDICTIONS = pa.schema(
    [
        pa.field("qid", pa.string(), nullable=False),
        pa.field("question", pa.string(), nullable=False),
        pa.field("answer", pa.string()),  # HotpotQA answer text; FEVER: the label
        pa.field("answer_doc_id", pa.string()),  # the node the answer came from (FEVER: null)
        pa.field("answer_title", pa.string()),
        pa.field("answer_type", pa.string()),  # span / yes / no (FEVER: null)
        pa.field("supporting_facts", pa.list_(SUPPORTING_FACT)),  # FEVER: the evidence {title: page id, sent: line}
        pa.field("score", pa.float64()),  # the chosen node's score (FEVER: the label's probability)
        # what the graph was built as, and from what: data / classifier / default (no classifier: bridge)
        pa.field("question_type", pa.string()),
        pa.field("question_type_source", pa.string()),
        pa.field("model_name", pa.string(), nullable=False),
        pa.field("model_version", pa.string(), nullable=False),
        pa.field("run_id", pa.string(), nullable=False),  # the MLflow run that produced the model
        pa.field("corpus_snapshot", pa.string(), nullable=False),  # the index manifest's fingerprint
        pa.field("scored_at", pa.timestamp("s", tz="UTC"), nullable=False),
        # JSON {setting: {version, used}} of the settings scored unlike the model version's (score.allow_drift)
        pa.field("pipeline_drift", pa.string()),
    ]
)

RAW_LIMIT = 2000

TABLES = {"docs": DOCS, "links": LINKS, "redirects": REDIRECTS, "anchors": ANCHORS, "quarantine": QUARANTINE}
