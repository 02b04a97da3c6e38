"""DocHopper's input from `graphs` rows (HotpotQA): each paragraph tokenised alone, the question with
a [MASK] per later hop (Eq. 2), and per hop the supervision (`hop_targets`)."""

from __future__ import annotations

import bisect
from collections.abc import Sequence

import numpy as np

from xh.graph.encoded import ANSWER_TYPES, QUESTION_TYPES
from xh.graph.hotpot import answer_char_spans
from xh.model.dochopper.batch import DocHopperExample
from xh.model.dochopper.config import MAX_TITLE_TOKENS, DocHopperConfig
from xh.wiki.titles import normalize_title


def supporting_evidence(row: dict) -> list[tuple[int, list[int]]]:
    """(node index, supporting sentence indices) of a graph row's supporting paragraphs, in hop order:
    the order of the data's supporting facts, except that a paragraph whose supporting sentences hold
    the (span) answer goes after one whose do not (the last hop reads the answer)."""
    facts = row.get("supporting_facts") or []
    by_title = {normalize_title(n["title"]): i for i, n in enumerate(row["nodes"])}
    order: list[int] = []
    for fact in facts:
        node = by_title.get(normalize_title(fact["title"]))
        if node is not None and node not in order and row["nodes"][node].get("supporting_sentences"):
            order.append(node)
    evidence = [(i, list(row["nodes"][i]["supporting_sentences"])) for i in order]
    answer = row.get("answer")
    if answer and row.get("answer_type", "span") == "span":

        def holds_answer(item: tuple[int, list[int]]) -> bool:
            sentences = row["nodes"][item[0]]["sentences"]
            return any(answer_char_spans(sentences[j], answer) for j in item[1])

        evidence.sort(key=holds_answer)  # stable: the data's order otherwise
    return evidence


def hop_targets(row: dict, hops: Sequence[str]) -> list[tuple[int, list[int]]]:
    """Per hop, (paragraph, positive sentences): a paragraph hop's positive is the paragraph of its
    evidence, a sentence hop's are that paragraph's supporting sentences; (-1, []) where unknown."""
    evidence = supporting_evidence(row)
    out, e = [], 0
    for kind in hops:
        node, sentences = evidence[e] if e < len(evidence) else (-1, [])
        out.append((node, [] if kind == "paragraph" else sentences))
        if kind == "sentence":
            e += 1
    return out


def _index(value: str | None, choices: tuple[str, ...]) -> int:
    return choices.index(value) if value in choices else -1


def paragraph_tokens(
    tokenizer, cfg: DocHopperConfig, title: str, sentences: Sequence[str]
) -> tuple[np.ndarray, np.ndarray]:
    """`[CLS] title [SEP] paragraph [SEP]` (no question) and each token's sentence (-1 elsewhere);
    the paragraph loses its end when it is longer than max_paragraph_tokens."""
    tok = tokenizer
    paragraph = "".join(sentences)
    enc = tok(paragraph, add_special_tokens=False, return_offsets_mapping=True, verbose=False)
    head = [tok.cls_token_id]
    if cfg.include_title:
        head += tok(title, add_special_tokens=False)["input_ids"][:MAX_TITLE_TOKENS] + [tok.sep_token_id]
    room = max(0, cfg.max_paragraph_tokens - len(head) - 1)
    ids, offsets = enc["input_ids"][:room], enc["offset_mapping"][:room]
    starts = list(np.cumsum([0, *(len(s) for s in sentences)])[:-1])
    sentence_of = [bisect.bisect_right(starts, start) - 1 for start, _ in offsets]
    input_ids = np.array([*head, *ids, tok.sep_token_id], np.int64)
    sentence_ids = np.array([-1] * len(head) + sentence_of + [-1], np.int64)
    return input_ids, sentence_ids


def query_tokens(tokenizer, cfg: DocHopperConfig, question: str) -> tuple[np.ndarray, np.ndarray]:
    """Eq. 2's question paragraph {q_0, q_null, ..}: `[CLS] question [SEP] [MASK]^(T-1) [SEP]`;
    q_0 is read at [CLS], q_t at the t-th mask (each attends to the whole question)."""
    tok = tokenizer
    ids = tok(question, add_special_tokens=False)["input_ids"][: cfg.max_question_tokens]
    dummies = len(cfg.hops) - 1
    mask_id = tok.mask_token_id if tok.mask_token_id is not None else tok.unk_token_id
    query = [tok.cls_token_id, *ids, tok.sep_token_id, *[mask_id] * dummies, tok.sep_token_id]
    positions = [0, *range(len(ids) + 2, len(ids) + 2 + dummies)]
    return np.array(query, np.int64), np.array(positions, np.int64)


def prepare(tokenizer, cfg: DocHopperConfig, rows: Sequence[dict]) -> list[DocHopperExample]:
    """`graphs` table rows (HotpotQA) -> examples; the edges are not used."""
    examples = []
    for row in rows:
        nodes = row["nodes"]
        if not nodes:
            raise ValueError(f"graph {row['qid']!r} has no nodes")
        tokens = [paragraph_tokens(tokenizer, cfg, n["title"], n["sentences"] or []) for n in nodes]
        query_ids, positions = query_tokens(tokenizer, cfg, row["question"])
        has_facts = row.get("supporting_facts") is not None
        targets = hop_targets(row, cfg.hops) if has_facts else [(-1, [])] * len(cfg.hops)
        examples.append(
            DocHopperExample(
                qid=row["qid"],
                question=row["question"],
                question_type=_index(row.get("question_type"), QUESTION_TYPES),
                doc_ids=[n["doc_id"] for n in nodes],
                titles=[n["title"] for n in nodes],
                sentences=[list(n["sentences"] or []) for n in nodes],
                query_ids=query_ids,
                hop_positions=positions,
                paragraph_ids=[ids for ids, _ in tokens],
                sentence_ids=[sids for _, sids in tokens],
                num_sentences=np.array([int(sids.max()) + 1 if (sids >= 0).any() else 0 for _, sids in tokens]),
                hop_targets=targets,
                answer=row.get("answer"),
                answer_type=_index(row.get("answer_type"), ANSWER_TYPES),
            )
        )
    return examples
