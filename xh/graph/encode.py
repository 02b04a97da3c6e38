"""A `graphs` row -> `EncodedGraph` (token ids and token-level labels) for one tokenizer.

    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(path)               # a fast tokenizer (offset mappings)
    encoded = encode_graph(row, tokenizer, max_node_tokens=512)    # row: one GRAPHS row as a dict
    encoded.input_ids[0]                                           # node 0: [CLS] question [SEP] anchors [SEP] paragraph [SEP]

    with GraphEncoder(tokenizer, max_node_tokens=512, processes=4) as encoder:   # worker processes, kept
        for graphs in encoder.map(chunks_of_rows):                 # one list per chunk, in order, chunks ahead
            ...

Node layout. Side A is `[CLS] question [SEP]` followed by each anchor text and a `[SEP]` (as the
original release lays out its linking texts; a node with no anchors is `[CLS] question [SEP]
paragraph [SEP]`); side B is `paragraph [SEP]`. FEVER rows (anchors = [title], one sentence) give
`[CLS] claim [SEP] title [SEP] sentence [SEP]`. The hub and separators are the tokenizer's own
`cls_token_id` / `sep_token_id`, so RoBERTa-style tokenizers (`<s>`, `</s>`) work too.

Truncation (the original's rule): while the node is longer than `max_node_tokens`, drop one token
from the longer side (side B on a tie), always the last content token before that side's closing
separator, so [CLS] and every separator stay. On side A the last anchor shrinks first (an anchor
emptied is removed with its separator), then the question; a question keeps at least one token.
The paragraph therefore loses its end, never its beginning.

Labels. Token positions come from the tokenizer's offset mapping of the paragraph
(`return_offsets_mapping`), so a character span maps to the tokens it overlaps; a span survives when
its last character is still inside the kept paragraph. `answer_spans` rows are (node, start, end),
inclusive, every surviving occurrence kept; row 0, the training target, is the first occurrence in
the first node that holds the answer and a supporting fact (else in the first node holding the
answer). `num_sentences` counts the sentences with at least one token left (a prefix of the
paragraph's sentences); `sentence_labels` cover those. Unknown labels are -1.
"""

from __future__ import annotations

import multiprocessing
import os
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from typing import Self

import numpy as np

from xh.graph.encoded import ANSWER_TYPES, CLAIM_LABELS, QUESTION_TYPES, EncodedGraph

__all__ = ["GraphEncoder", "encode_graph", "encode_graphs", "truncate_node"]


def _index(value: str | None, choices: tuple[str, ...]) -> int:
    return choices.index(value) if value in choices else -1


def truncate_node(
    question_len: int, anchor_lens: list[int], paragraph_len: int, max_tokens: int
) -> tuple[int, list[int], int]:
    """Lengths kept of the question, of each anchor (emptied anchors removed) and of the paragraph.

    The rule drops one token at a time from the longer side; while side B (paragraph and [SEP]) is the
    longer, its whole run of drops is taken at once (a long paragraph cut to a short node is most of them)."""
    anchors = [n for n in anchor_lens if n > 0]
    q, p = question_len, paragraph_len
    a = 1 + q + 1 + sum(n + 1 for n in anchors)  # side A: [CLS] question [SEP], each anchor and its [SEP]
    while a + p + 1 > max_tokens:
        if a > p + 1:
            if anchors:
                anchors[-1] -= 1
                a -= 1
                if anchors[-1] == 0:
                    anchors.pop()
                    a -= 1
            elif q > 1:
                q -= 1
                a -= 1
            elif p > 0:
                p -= 1
            else:
                raise ValueError(f"max_node_tokens={max_tokens} leaves no room for a node of one question token")
        else:  # until the node fits or side A is the longer (a tie drops from side B)
            p -= min(a + p + 1 - max_tokens, p + 2 - a)
    return q, anchors, p


def encode_graph(row: dict, tokenizer, max_node_tokens: int) -> EncodedGraph:
    """One GRAPHS row (HotpotQA or FEVER) as token ids and token-level labels (rules in the module docstring)."""
    cls_id, sep_id = _special_ids(tokenizer)
    nodes = row["nodes"]
    paragraphs = ["".join(node["sentences"] or ()) for node in nodes]
    anchor_texts = [[a for a in node.get("anchors") or () if a and a.strip()] for node in nodes]
    flat_anchors = [a for texts in anchor_texts for a in texts]
    # one tokenizer call per graph: the question once, every anchor, every paragraph
    texts = [row["question"], *flat_anchors, *paragraphs]
    enc = tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True, verbose=False)
    ids, offs = enc["input_ids"], enc["offset_mapping"]
    question_ids = ids[0]
    anchor_ids = iter(ids[1 : 1 + len(flat_anchors)])
    first_paragraph = 1 + len(flat_anchors)

    per_node: dict[str, list] = {
        k: [] for k in ("input_ids", "token_type_ids", "paragraph_mask", "offsets", "sentence_ids")
    }
    num_sentences, sentence_labels, has_answer, relevance = [], [], [], []
    spans: list[tuple[int, int, int, int, int]] = []  # (priority, node, char start, token start, token end)
    for i, node in enumerate(nodes):
        anchors = [next(anchor_ids) for _ in anchor_texts[i]]
        p_ids, p_offs = ids[first_paragraph + i], offs[first_paragraph + i]
        q_len, a_lens, p_len = truncate_node(len(question_ids), [len(a) for a in anchors], len(p_ids), max_node_tokens)
        side_a = [cls_id, *question_ids[:q_len], sep_id]
        for a, n in zip([a for a in anchors if a], a_lens):
            side_a += [*a[:n], sep_id]
        length = len(side_a) + p_len + 1
        input_ids = np.array([*side_a, *p_ids[:p_len], sep_id], dtype=np.int64)
        token_type = np.zeros(length, np.int64)
        token_type[len(side_a) :] = 1
        mask = np.zeros(length, bool)
        mask[len(side_a) : len(side_a) + p_len] = True
        offsets = np.full((length, 2), -1, np.int64)
        kept = np.asarray(p_offs[:p_len], np.int64).reshape(-1, 2)  # the kept paragraph tokens' spans
        offsets[len(side_a) : len(side_a) + p_len] = kept
        # which sentence each paragraph token starts in
        starts = np.cumsum([0, *(len(s) for s in node["sentences"] or ())])[:-1]
        sentence_ids = np.full(length, -1, np.int64)
        sentence_ids[len(side_a) : len(side_a) + p_len] = np.searchsorted(starts, kept[:, 0], side="right") - 1
        kept_sentences = int(sentence_ids.max()) + 1 if p_len else 0
        num_sentences.append(kept_sentences)

        sentence_labels.append(_sentence_labels(node, kept_sentences))
        relevance.append(-1 if node.get("is_evidence") is None else int(node["is_evidence"]))

        found = _answer_spans(node, i, kept, len(side_a))
        spans += found
        has_answer.append(-1 if node.get("answer_spans") is None else int(bool(found)))

        per_node["input_ids"].append(input_ids)
        per_node["token_type_ids"].append(token_type)
        per_node["paragraph_mask"].append(mask)
        per_node["offsets"].append(offsets)
        per_node["sentence_ids"].append(sentence_ids)

    spans.sort()
    answer_spans = np.array([(n, s, e) for _, n, _, s, e in spans], np.int64).reshape(-1, 3)
    return EncodedGraph(
        qid=row["qid"],
        task=row["task"],
        **per_node,
        edges=np.array([(e["src"], e["dst"]) for e in row["edges"]], np.int64).reshape(-1, 2),
        node_doc_ids=[n["doc_id"] for n in nodes],
        node_titles=[n["title"] for n in nodes],
        node_paragraphs=paragraphs,
        num_sentences=np.array(num_sentences, np.int64),
        node_lines=np.array([-1 if n.get("line") is None else n["line"] for n in nodes], np.int64),
        node_relevance=np.array(relevance, np.int64),
        node_has_answer=np.array(has_answer, np.int64),
        answer_spans=answer_spans,
        answer_type=_index(row.get("answer_type"), ANSWER_TYPES),
        question_type=_index(row.get("question_type"), QUESTION_TYPES),
        claim_label=_index(row.get("claim_label"), CLAIM_LABELS),
        sentence_labels=sentence_labels,
        edge_types=_edge_type_ids(row),
    )


def _special_ids(tokenizer) -> tuple[int, int]:
    cls_id, sep_id = tokenizer.cls_token_id, tokenizer.sep_token_id
    if cls_id is None or sep_id is None:
        raise ValueError(f"tokenizer {type(tokenizer).__name__} has no cls/sep token: it cannot lay out XH nodes")
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError(f"tokenizer {type(tokenizer).__name__} is not a fast tokenizer: offset mappings need one")
    return cls_id, sep_id


def _sentence_labels(node: dict, kept_sentences: int) -> np.ndarray:
    """1 for a supporting sentence kept after truncation, 0 for the others; all -1 when the node has no labels."""
    support = node.get("supporting_sentences")
    labels = np.full(kept_sentences, -1 if support is None else 0, np.int64)
    for s in support or ():
        if s < kept_sentences:
            labels[s] = 1
    return labels


def _answer_spans(node: dict, i: int, kept: np.ndarray, first_token: int) -> list[tuple[int, int, int, int, int]]:
    """(priority, node, char start, token start, token end) of each answer span the kept paragraph tokens
    (`kept`: their character spans, the first at token `first_token`) still cover."""
    kept_end = int(kept[-1, 1]) if len(kept) else 0
    spans = []
    for span in node.get("answer_spans") or ():
        start, end = int(span["start"]), int(span["end"])
        if end > kept_end or end <= start:
            continue  # cut by truncation (or empty)
        tokens = np.flatnonzero((kept[:, 1] > start) & (kept[:, 0] < end))
        if len(tokens):
            priority = 0 if node.get("is_evidence") else 1
            spans.append((priority, i, start, first_token + int(tokens[0]), first_token + int(tokens[-1])))
    return spans


def _edge_type_ids(row: dict) -> np.ndarray | None:
    """The row's `edge_types` (edge mode typed) as indices into `xh.graph.typed.EDGE_TYPES`; None without them."""
    if row.get("edge_types") is None:
        return None
    from xh.graph.typed import EDGE_TYPES

    unknown = set(row["edge_types"]) - set(EDGE_TYPES)
    if unknown or len(row["edge_types"]) != len(row["edges"]):
        raise ValueError(f"graph {row['qid']!r}: edge_types must name one of {EDGE_TYPES} per edge")
    return np.array([EDGE_TYPES.index(t) for t in row["edge_types"]], np.int64)


def encode_graphs(rows: Iterable[dict], tokenizer, max_node_tokens: int) -> list[EncodedGraph]:
    """Rows as dicts, or a pyarrow table of them (converted here: in a worker process, off the trainer's thread)."""
    if hasattr(rows, "to_pylist"):
        rows = rows.to_pylist()
    return [encode_graph(row, tokenizer, max_node_tokens) for row in rows]


_worker_settings: tuple = ()  # (tokenizer, max_node_tokens) of a GraphEncoder worker process


def _start_worker(tokenizer, max_node_tokens: int) -> None:
    global _worker_settings
    # One tokenizer thread a process: the processes are the parallelism. Left on, each fast tokenizer
    # would split every graph's batch of texts over a thread per core, N processes x cores threads in all,
    # beside the training process's own torch threads.
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    _worker_settings = (tokenizer, max_node_tokens)


def _encode_in_worker(rows: list[dict]) -> list[EncodedGraph]:
    return encode_graphs(rows, *_worker_settings)


def own_rows(table):
    """A pyarrow table as a copy holding only its own rows. A slice of a larger table (a batch Ray Data
    cuts from a block, or `table.slice`) pickles its parent's whole buffers: sent to an encoder process
    as it is, each chunk of 16 graphs would carry every graph of the block."""
    return table.take(np.arange(table.num_rows))


class GraphEncoder:
    """`encode_graph` over chunks of rows, in `processes` worker processes that keep their tokenizer.

    Encoding is Python holding the GIL (milliseconds a graph: docs/results/retrieval.md, evidence graphs):
    in a thread beside the training step it would slow the step's own Python, so the work goes to
    other processes (spawned: a fork of a process that runs CUDA or tokenizer threads is unsafe), and
    `processes + 1` chunks are kept in flight. `processes=0` encodes in the calling thread.
    """

    def __init__(self, tokenizer, max_node_tokens: int, processes: int = 0):
        self.tokenizer, self.max_node_tokens = tokenizer, max_node_tokens
        self.processes = processes
        self._pool = None
        if processes:
            self._pool = ProcessPoolExecutor(
                processes,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_start_worker,
                initargs=(tokenizer, max_node_tokens),
            )

    def map(self, chunks: Iterable) -> Iterator[list[EncodedGraph]]:
        """The encoded graphs of each chunk of rows (a list of dicts or a pyarrow table), chunk by chunk in order."""
        if self._pool is None:
            for rows in chunks:
                yield encode_graphs(rows, self.tokenizer, self.max_node_tokens)
            return
        in_flight: deque = deque()
        for rows in chunks:
            in_flight.append(
                self._pool.submit(_encode_in_worker, own_rows(rows) if hasattr(rows, "to_pylist") else list(rows))
            )
            if len(in_flight) > self.processes:
                yield in_flight.popleft().result()
        while in_flight:
            yield in_flight.popleft().result()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
            self._pool = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
