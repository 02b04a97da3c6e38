"""HotpotQA evidence graphs: one `graphs` row (`xh.schemas.GRAPHS`) per question, as text and character labels.

Two settings, one set of rules for edges and labels:

    # retrieval: nodes from the candidates table, texts and hyperlinks from the docs and links tables
    builder = HotpotGraphBuilder.load("runs/demo/tables", needed_doc_ids, GraphsConfig(), RetrieveConfig())
    outcome = builder.build(question_row, candidate_rows)      # Outcome(graph=dict | None, reason=str | None, ...)

    # distractor: a HotpotQA record's own 10 context paragraphs, no Wikipedia needed
    items, quarantined = read_distractor_questions("hotpot_train_sample500.json")
    (outcome,) = distractor_graphs(items[:1], GraphsConfig())

The settings are the `graphs` section of the config (`xh.config.GraphsConfig`, defaults as in the paper),
and the node choice of the `retrieve` section (`xh.config.RetrieveConfig`), which also proposed the candidates.

Nodes (paper §4, A.1). Bridge questions: the first `ir_keep` (2) BM25 documents, the first
`el_per_surface` (1) entity-linked document per surface form, the first `expansion_keep` (15)
hyperlink-expanded documents, in that order; a document proposed twice keeps its first source.
Comparison questions: BM25 and entity-linked documents only, no expansion. Distractor setting: the
context paragraphs, in the record's order (a node's `doc_id` is then its normalised title).

Edges. An edge `{src, dst}` means dst's hub attends to src's: information flows from src to dst. A
hyperlink from page A to page B becomes the edge A -> B, so the page a link points to reads the page
that points to it (as in the original release, where the linked node also receives the linking
text); for a bridge question the entity named in the question's page passes on to the page that
holds the answer. Edge modes (the paper's Table 4), `graphs.edge_mode`:

    hyperlink       directed hyperlinks between nodes (the default)
    bidirectional   each hyperlink in both directions
    full            every ordered pair of distinct nodes
    sequence        the nodes in a random order (seeded by `seed` and the qid), chained both ways
    typed           GESA's typed edges (`xh.graph.typed.typed_edges`): hyperlink, reverse_hyperlink,
                    co_retrieved, comparison and self, each edge's type in the row's `edge_types`

Comparison graphs are fully connected whatever the mode while `comparison_full` holds (the paper's
rule); the row's `edge_mode` says what the graph got. No self-loops: a hub keeps its own state
through the in-sequence attention. In the distractor setting, "A links to B" means A's paragraph
mentions B: B's title, or B's title without a trailing "(disambiguation)", occurs in A's text as
whole words, matched case-sensitively (titles are capitalised names; matching "Party Never Ends"
against "party" would link unrelated pages).

Anchors of a node: the texts of the links into it from other nodes of the graph (the mention text
in the distractor setting), distinct, ordered by the linking node's position, then sentence, then text.

Labels, all from the original text:

- `answer_spans`: every occurrence of the answer in the paragraph, matched case-insensitively on
  word boundaries (the character before and after is not a letter or digit; whitespace inside the
  answer matches any whitespace). Word boundaries keep "art" from matching inside "party", so a
  labelled span decodes back to the answer. Yes/no answers have no spans.
- `supporting_sentences` / `is_evidence`: the node's title (normalised, `xh.wiki.titles`) is a
  supporting fact's title; sentence indices past the paragraph's end are dropped and counted
  (`flags`). Unknown (no supporting facts given): null.
- `answer_type`: yes / no when the answer is that word (case-insensitive), span otherwise.
- `question_type`: from the data (`question_type_source` "data"); otherwise from a classifier
  (`classify(questions) -> types`, source "classifier"); with neither, "bridge" (source "default",
  counted): bridge graphs hold every node a comparison graph would, so no answer node is lost.

A span-answer question whose graph has no node holding the answer is quarantined with the reason
"no node contains the answer" (while `require_answer`); evaluation still scores it, as a miss.
"""

from __future__ import annotations

import itertools
import json
import random
import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from typing import NamedTuple

import pyarrow.compute as pc
import pyarrow.dataset as pads

from xh.config import GraphsConfig, RetrieveConfig
from xh.graph.encoded import QUESTION_TYPES
from xh.inputs.questions import load_json, question_rows, record_id
from xh.schemas import RAW_LIMIT
from xh.storage.jsonfiles import InputFileError
from xh.storage.store import Location, located
from xh.wiki.titles import normalize_title

EDGE_MODES = ("hyperlink", "bidirectional", "full", "sequence", "typed")
NO_ANSWER = "no node contains the answer"
NO_NODES = "no nodes: retrieval proposed no documents"

# Questions -> their types, one per question, each in QUESTION_TYPES.
QuestionClassifier = Callable[[list[str]], Sequence[str]]


class Outcome(NamedTuple):
    """One question's result: a graph row, or the reason it was quarantined; `flags` are counted."""

    graph: dict | None
    reason: str | None
    flags: tuple[str, ...] = ()


class NodeLink(NamedTuple):
    """A hyperlink between two nodes of one graph, by their positions in the graph (in the distractor
    setting, a title mention)."""

    src: int
    dst: int
    anchor: str
    sentence: int


# --- edges -----------------------------------------------------------------------------------


def make_edges(
    num_nodes: int, links: Iterable[tuple[int, int]], mode: str, order_key: str = "", seed: int = 13
) -> list[dict]:
    """Edge rows `{src, dst}` (sorted, no self-loops, no repeats) for one graph in an edge mode."""
    if mode == "hyperlink":
        pairs = {(s, d) for s, d in links if s != d}
    elif mode == "bidirectional":
        pairs = {p for s, d in links if s != d for p in ((s, d), (d, s))}
    elif mode == "full":
        pairs = set(itertools.permutations(range(num_nodes), 2))
    elif mode == "sequence":
        # a string seed is hashed with SHA-512 by `random`, so the order does not depend on PYTHONHASHSEED
        order = random.Random(f"{seed}:{order_key}").sample(range(num_nodes), num_nodes)
        pairs = {p for a, b in zip(order, order[1:]) for p in ((a, b), (b, a))}
    else:
        raise ValueError(f"unknown edge mode {mode!r}; one of {', '.join(EDGE_MODES)}")
    return [{"src": s, "dst": d} for s, d in sorted(pairs)]


def typed_graph_edges(links: Iterable[NodeLink], sources: list[str], question_type: str) -> tuple[list, list]:
    """Edge mode `typed`: (edges `{src, dst}`, their types) from the hyperlinks, `xh.graph.typed.typed_edges`."""
    from xh.graph.typed import typed_edges

    typed = typed_edges(((link.src, link.dst) for link in links), sources, question_type)
    return [{"src": e["src"], "dst": e["dst"]} for e in typed], [e["type"] for e in typed]


def node_anchors(num_nodes: int, links: Iterable[NodeLink]) -> list[list[str]]:
    """Per node, the distinct texts of the links into it from other nodes, in (source, sentence, text) order."""
    into: list[set[tuple[int, int, str]]] = [set() for _ in range(num_nodes)]
    for link in links:
        if link.src != link.dst and link.anchor.strip():
            into[link.dst].add((link.src, link.sentence, link.anchor))
    return [list(dict.fromkeys(anchor for _, _, anchor in sorted(found))) for found in into]


# --- labels ----------------------------------------------------------------------------------


def answer_type_of(answer: str | None) -> str | None:
    if answer is None:
        return None
    word = answer.strip().lower()
    return word if word in ("yes", "no") else "span"


def answer_char_spans(paragraph: str, answer: str) -> list[dict]:
    """Every occurrence of `answer` in `paragraph` as `{start, end}` characters (end exclusive); rule above."""
    words = answer.split()
    if not words:
        return []
    pattern = r"(?<![^\W_])" + r"\s+".join(map(re.escape, words)) + r"(?![^\W_])"
    return [{"start": m.start(), "end": m.end()} for m in re.finditer(pattern, paragraph, re.IGNORECASE)]


def resolve_question_types(questions: list[dict], classifier: QuestionClassifier | None) -> list[tuple[str, str]]:
    """(question_type, question_type_source) per QUESTIONS row: data, else the classifier, else the default."""
    known = [q.get("type") if q.get("type") in QUESTION_TYPES else None for q in questions]
    missing = [i for i, t in enumerate(known) if t is None]
    predicted: dict[int, str] = {}
    if missing and classifier is not None:
        answers = list(classifier([questions[i]["question"] for i in missing]))
        if len(answers) != len(missing) or any(a not in QUESTION_TYPES for a in answers):
            raise ValueError(f"the question classifier must return one of {QUESTION_TYPES} per question")
        predicted = dict(zip(missing, answers))
    out = []
    for i, t in enumerate(known):
        if t is not None:
            out.append((t, "data"))
        elif i in predicted:
            out.append((predicted[i], "classifier"))
        else:
            out.append(("bridge", "default"))
    return out


# --- one graph -------------------------------------------------------------------------------


def assemble_graph(
    question: dict,
    nodes: list[dict],
    links: list[NodeLink],
    question_type: tuple[str, str],
    settings: GraphsConfig,
) -> Outcome:
    """A GRAPHS row from a QUESTIONS row, its nodes (`doc_id, title, sentences, source, score`) and the
    hyperlinks between them; or the reason to quarantine the question."""
    if not nodes:
        return Outcome(None, NO_NODES)
    qtype, qtype_source = question_type
    flags = ["question_type_" + qtype_source] if qtype_source != "data" else []
    mode = "full" if qtype == "comparison" and settings.comparison_full else settings.edge_mode
    edge_types = None
    if settings.edge_mode == "typed":  # the types say which pairs are a comparison's: no "full" needed
        mode, (edges, edge_types) = "typed", typed_graph_edges(links, [n["source"] for n in nodes], qtype)
    else:
        edges = make_edges(len(nodes), ((link.src, link.dst) for link in links), mode, question["qid"], settings.seed)
    anchors = node_anchors(len(nodes), links)

    answer = question.get("answer")
    answer_type = answer_type_of(answer)
    facts = question.get("supporting_facts")
    gold: dict[str, list[int]] | None = None
    if facts is not None:
        gold = defaultdict(list)
        for fact in facts:
            gold[normalize_title(fact["title"])].append(int(fact["sent"]))

    out_nodes = []
    for node, node_anchor_texts in zip(nodes, anchors):
        paragraph = "".join(node["sentences"])
        spans = None if answer_type is None else answer_char_spans(paragraph, answer) if answer_type == "span" else []
        support = is_evidence = None
        if gold is not None:
            sents = gold.get(normalize_title(node["title"]))
            is_evidence = sents is not None
            support = sorted({s for s in sents or () if 0 <= s < len(node["sentences"])})
            if sents and len(support) < len(set(sents)):
                flags.append("supporting_fact_out_of_range")
        out_nodes.append(
            {
                "doc_id": node["doc_id"],
                "title": node["title"],
                "sentences": list(node["sentences"]),
                "anchors": node_anchor_texts,
                "source": node["source"],
                "score": float(node["score"]),
                "line": -1,
                "answer_spans": spans,
                "supporting_sentences": support,
                "is_evidence": is_evidence,
            }
        )
    if answer_type == "span" and settings.require_answer and not any(n["answer_spans"] for n in out_nodes):
        return Outcome(None, NO_ANSWER, tuple(flags))
    graph = {
        "qid": question["qid"],
        "task": "hotpot",
        "question": question["question"],
        "question_type": qtype,
        "question_type_source": qtype_source,
        "answer": answer,
        "answer_type": answer_type,
        "claim_label": None,
        "supporting_facts": facts,
        "nodes": out_nodes,
        "edges": edges,
        "edge_mode": mode,
        "edge_types": edge_types,
    }
    return Outcome(graph, None, tuple(flags))


def graph_stats(graph: dict) -> dict:
    """What a summary counts about one graph: nodes, edges, answer recall and supporting-paragraph recall."""
    nodes = graph["nodes"]
    gold = {normalize_title(f["title"]) for f in graph.get("supporting_facts") or []}
    titles = {normalize_title(n["title"]) for n in nodes}
    return {
        "nodes": len(nodes),
        "edges": len(graph["edges"]),
        "has_answer": any(n["answer_spans"] for n in nodes) if graph.get("answer_type") == "span" else None,
        "supp_complete": gold <= titles if gold else None,
    }


# --- retrieval setting -----------------------------------------------------------------------


def select_nodes(candidates: list[dict], question_type: str, settings: RetrieveConfig) -> list[dict]:
    """CANDIDATES rows of one question -> the graph's `{doc_id, source, score}` in node order (rules above);
    `settings`: the retrieve section, whose `ir_keep`, `el_per_surface` and `expansion_keep` proposed them."""
    by_source: dict[str, list[dict]] = defaultdict(list)
    for row in candidates:
        by_source[row["source"]].append(row)
    for rows in by_source.values():
        rows.sort(key=lambda r: (r["rank"], r["doc_id"]))
    picked = by_source["ir"][: settings.ir_keep]
    per_surface: dict[str, int] = defaultdict(int)
    for row in by_source["el"]:
        key = (row.get("surface") or "").lower()
        if per_surface[key] < settings.el_per_surface:
            per_surface[key] += 1
            picked.append(row)
    if question_type != "comparison":
        picked += by_source["exp"][: settings.expansion_keep]
    nodes: dict[str, dict] = {}
    for row in picked:
        nodes.setdefault(row["doc_id"], {"doc_id": row["doc_id"], "source": row["source"], "score": row["score"]})
    return list(nodes.values())


class HotpotGraphBuilder:
    """Graphs of the retrieval setting; holds the docs and links of the documents its questions need.

    `docs`: doc_id -> (title, sentences); `links`: src doc_id -> [(target doc_id, anchor, sentence)];
    `retrieval`: the retrieve section, whose node choice a graph keeps (`select_nodes`).
    """

    def __init__(
        self,
        docs: dict[str, tuple[str, list[str]]],
        links: dict[str, list[tuple[str, str, int]]],
        settings: GraphsConfig,
        retrieval: RetrieveConfig,
        classifier: QuestionClassifier | None = None,
    ) -> None:
        self.docs, self.links, self.settings, self.classifier = docs, links, settings, classifier
        self.retrieval = retrieval

    @classmethod
    def load(
        cls,
        tables: str | Location,
        doc_ids: Iterable[str],
        settings: GraphsConfig,
        retrieval: RetrieveConfig,
        classifier: QuestionClassifier | None = None,
    ) -> HotpotGraphBuilder:
        """Read only the given documents from `<tables>/docs` and the links among them from `<tables>/links`."""
        import pyarrow as pa

        fs, root = located(tables).fs_path()
        wanted = pa.array(sorted(set(doc_ids)), pa.string())
        docs = pads.dataset(f"{root}/docs", filesystem=fs, format="parquet").to_table(
            columns=["doc_id", "title", "sentences"], filter=pads.field("doc_id").isin(wanted)
        )
        links = pads.dataset(f"{root}/links", filesystem=fs, format="parquet").to_table(
            columns=["src_doc_id", "target_doc_id", "anchor", "sentence"],
            filter=pads.field("src_doc_id").isin(wanted) & pads.field("target_doc_id").isin(wanted),
        )
        links = links.filter(pc.not_equal(links["src_doc_id"], links["target_doc_id"]))
        by_id = {d: (t, s) for d, t, s in zip(*(docs[c].to_pylist() for c in ("doc_id", "title", "sentences")))}
        out: dict[str, list[tuple[str, str, int]]] = defaultdict(list)
        for src, dst, anchor, sentence in zip(*(links[c].to_pylist() for c in links.column_names)):
            out[src].append((dst, anchor, sentence))
        return cls(by_id, dict(out), settings, retrieval, classifier)

    @staticmethod
    def build_from_store(
        store,
        questions: list[dict],
        candidates: dict[str, list[dict]],
        settings: GraphsConfig,
        retrieval: RetrieveConfig,
        classifier: QuestionClassifier | None = None,
    ) -> list[Outcome]:
        """`build_many` with the docs and links looked up by id in a `xh.graph.docstore.DocStore`: only
        those of the documents that become nodes (a question's candidates are several times its nodes)."""
        types = resolve_question_types(questions, classifier)
        picked = [select_nodes(candidates.get(q["qid"], []), t[0], retrieval) for q, t in zip(questions, types)]
        docs, links = store.lookup(node["doc_id"] for nodes in picked for node in nodes)
        builder = HotpotGraphBuilder(docs, links, settings, retrieval)
        return [builder._build(q, candidates.get(q["qid"], []), t) for q, t in zip(questions, types)]

    def build_many(self, questions: list[dict], candidates: dict[str, list[dict]]) -> list[Outcome]:
        """One outcome per QUESTIONS row; `candidates`: qid -> its CANDIDATES rows."""
        types = resolve_question_types(questions, self.classifier)
        return [self._build(q, candidates.get(q["qid"], []), t) for q, t in zip(questions, types)]

    def build(self, question: dict, candidates: list[dict]) -> Outcome:
        return self.build_many([question], {question["qid"]: candidates})[0]

    def _build(self, question: dict, candidates: list[dict], qtype: tuple[str, str]) -> Outcome:
        picked = select_nodes(candidates, qtype[0], self.retrieval)
        missing = [n["doc_id"] for n in picked if n["doc_id"] not in self.docs]
        nodes = [
            {**n, "title": self.docs[n["doc_id"]][0], "sentences": self.docs[n["doc_id"]][1]}
            for n in picked
            if n["doc_id"] in self.docs
        ]
        index = {n["doc_id"]: i for i, n in enumerate(nodes)}
        links = [
            NodeLink(i, index[dst], anchor, sentence)
            for i, n in enumerate(nodes)
            for dst, anchor, sentence in self.links.get(n["doc_id"], ())
            if dst in index
        ]
        outcome = assemble_graph(question, nodes, links, qtype, self.settings)
        return outcome._replace(flags=outcome.flags + ("candidate_doc_missing",) * len(missing))


# --- distractor setting ----------------------------------------------------------------------


class DistractorItem(NamedTuple):
    question: dict  # a QUESTIONS row
    context: list[tuple[str, list[str]]]  # (title as written, sentences)
    position: int = 0  # the record's 1-based position in its file


def _context_of(record: dict) -> list[tuple[str, list[str]]]:
    context = record.get("context")
    if not isinstance(context, list) or not context:
        raise ValueError("no context paragraphs")
    out = []
    for para in context:
        if not (
            isinstance(para, (list, tuple))
            and len(para) == 2
            and isinstance(para[0], str)
            and isinstance(para[1], list)
            and all(isinstance(s, str) for s in para[1])
        ):
            raise ValueError(f"context paragraph {str(para)[:80]!r} is not [title, [sentences]]")
        if para[1]:
            out.append((para[0], list(para[1])))
    if not out:
        raise ValueError("no context paragraphs with text")
    return out


def distractor_items(records: list, source: str) -> tuple[list[DistractorItem], list[dict]]:
    """HotpotQA records (with `context`) -> (items, QUARANTINE rows); every record lands in exactly one.

    `xh.inputs.questions.question_rows` checks the question itself; the context is checked here.
    """
    rows, quarantined = question_rows(records, source)
    first: dict[str, tuple[int, dict]] = {}  # question_rows keeps the first record of a repeated id
    for position, record in enumerate(records, start=1):
        if isinstance(record, dict) and record_id(record):
            first.setdefault(str(record_id(record)), (position, record))
    items = []
    for row in rows:
        position, record = first[row["qid"]]
        if row.get("supporting_facts") is not None:  # the gold as written: see `distractor_graphs`
            row = row | {"supporting_facts": [{"title": str(t), "sent": s} for t, s in record["supporting_facts"]]}
        try:
            items.append(DistractorItem(row, _context_of(record), position))
        except ValueError as e:
            raw = json.dumps(record)[:RAW_LIMIT]
            quarantined.append({"source": source, "position": position, "reason": f"invalid context: {e}", "raw": raw})
    return items, quarantined


def read_distractor_questions(file: str | Location) -> tuple[list[DistractorItem], list[dict]]:
    records = load_json(file)
    if not isinstance(records, list):
        raise InputFileError(f"{file} is not a HotpotQA question file (a JSON array of questions)")
    return distractor_items(records, str(file))


def _title_pattern(title: str) -> re.Pattern:
    base = re.sub(r"\s*\([^()]*\)$", "", title).strip() or title
    names = sorted({title, base}, key=len, reverse=True)  # the longer name wins where both match
    return re.compile(r"(?<![^\W_])(?:" + "|".join(re.escape(n) for n in names) + r")(?![^\W_])")


def mention_links(context: list[tuple[str, list[str]]]) -> list[NodeLink]:
    """Distractor setting: A -> B when A's paragraph mentions B's title (the rule in the module docstring)."""
    patterns = [_title_pattern(title) for title, _ in context]
    links = []
    for a, (_, sentences) in enumerate(context):
        for b, pattern in enumerate(patterns):
            if a == b:
                continue
            for k, sentence in enumerate(sentences):
                found = pattern.search(sentence)
                if found:
                    links.append(NodeLink(a, b, found.group(), k))
                    break
    return links


def distractor_graphs(
    items: list[DistractorItem], settings: GraphsConfig, classifier: QuestionClassifier | None = None
) -> list[Outcome]:
    """One outcome per item: a graph over the record's own context paragraphs.

    Titles stay as the record writes them, in the nodes and in the gold supporting facts (HotpotQA
    keeps HTML entities: "Ben &amp; Jerry's"), so predicted facts meet the gold as the official script
    compares them, exactly; `doc_id` is the normalised title, and labels match titles normalised."""
    types = resolve_question_types([item.question for item in items], classifier)
    outcomes = []
    for (question, context, _), qtype in zip(items, types):
        nodes = [
            {
                "doc_id": normalize_title(title),
                "title": title,
                "sentences": sentences,
                "source": "context",
                "score": 0.0,
            }
            for title, sentences in context
        ]
        outcomes.append(assemble_graph(question, nodes, mention_links(context), qtype, settings))
    return outcomes
