"""`EncodedGraph`: one evidence graph as token ids, the contract between graph building and the model.

The `graphs` table stores text (question, node paragraphs, anchors, character-level labels), so one
table serves any backbone; `xh.graph.encode` turns a row into an `EncodedGraph` with a given
tokenizer, and `xh.model.batch.collate` stacks several of them into one padded batch.

Node layout (HotpotQA): `[CLS] question [SEP] anchor text(s) [SEP] paragraph [SEP]`;
FEVER: `[CLS] claim [SEP] title [SEP] sentence [SEP]` (the sentence plays the paragraph's part).
Labels that are unknown (new questions) are -1, or arrays of -1.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

TASKS = ("hotpot", "fever")
ANSWER_TYPES = ("span", "yes", "no")  # index = answer_type label
QUESTION_TYPES = ("bridge", "comparison")  # index = question_type label
CLAIM_LABELS = ("SUPPORTS", "REFUTES", "NOT ENOUGH INFO")  # index = claim_label


@dataclass
class EncodedGraph:
    qid: str
    task: str  # one of TASKS
    # Per node i (n nodes), arrays of the node's length L_i:
    input_ids: list[np.ndarray]  # int64 [L_i]; position 0 is the hub ([CLS] or the tokenizer's bos)
    token_type_ids: list[np.ndarray]  # int64 [L_i]; 0 for question and anchors, 1 for the paragraph
    paragraph_mask: list[np.ndarray]  # bool [L_i]; True on paragraph tokens, the only places a span may start or end
    offsets: list[np.ndarray]  # int64 [L_i, 2]; a token's character span in node_paragraphs[i], (-1, -1) elsewhere
    sentence_ids: list[np.ndarray]  # int64 [L_i]; which paragraph sentence a token belongs to, -1 elsewhere
    # Graph structure: the hub of dst attends to the hub of src (messages flow src -> dst).
    edges: np.ndarray  # int64 [E, 2] of (src, dst), local node indices
    # What decoding needs to turn token positions back into text and supporting facts:
    node_doc_ids: list[str]
    node_titles: list[str]
    node_paragraphs: list[str]  # the paragraph text the offsets index into
    num_sentences: np.ndarray  # int64 [n]; sentences of the paragraph that survived truncation
    node_lines: np.ndarray  # int64 [n]; FEVER: the node sentence's line in its page (for evidence); -1 otherwise
    # Labels (-1 when unknown):
    node_relevance: np.ndarray  # int64 [n]; HotpotQA: node holds a supporting fact; FEVER: node is gold evidence
    node_has_answer: np.ndarray  # int64 [n]; HotpotQA: the answer string occurs in the node's paragraph tokens
    answer_spans: np.ndarray  # int64 [m, 3] of (node, start_token, end_token), inclusive; row 0 is the training target
    answer_type: int = -1  # index into ANSWER_TYPES
    question_type: int = -1  # index into QUESTION_TYPES
    claim_label: int = -1  # index into CLAIM_LABELS
    sentence_labels: list[np.ndarray] = field(default_factory=list)  # per node int64 [num_sentences[i]]; 1 = supporting
    # Edge mode typed: each edge's type, an index into xh.graph.typed.EDGE_TYPES; None for other edge modes.
    edge_types: np.ndarray | None = None  # int64 [E]

    @property
    def num_nodes(self) -> int:
        return len(self.input_ids)

    @property
    def num_tokens(self) -> int:
        return int(sum(len(ids) for ids in self.input_ids))
