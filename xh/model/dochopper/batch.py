"""DocHopper's examples (one question and its candidate paragraphs, tokenised) and batches of them
(`collate`): the paragraphs' tokens, or their precomputed sentence embeddings."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields

import numpy as np
import torch

from xh.model.dochopper.config import DocHopperConfig


@dataclass
class DocHopperExample:
    """One question and its candidate paragraphs, tokenised; labels -1 / empty where unknown."""

    qid: str
    question: str
    question_type: int  # index into QUESTION_TYPES, -1 unknown
    doc_ids: list[str]
    titles: list[str]
    sentences: list[list[str]]  # per paragraph, its sentence texts
    query_ids: np.ndarray  # int64 [Lq]: [CLS] question [SEP] [MASK]^(T-1) [SEP]
    hop_positions: np.ndarray  # int64 [T]: where q_0 .. q_{T-1} are read
    paragraph_ids: list[np.ndarray]  # per paragraph int64 [L_i]: [CLS] title [SEP] paragraph [SEP]
    sentence_ids: list[np.ndarray]  # per paragraph int64 [L_i]: sentence of each token, -1 elsewhere
    num_sentences: np.ndarray  # int64 [P]: sentences with at least one token kept
    hop_targets: list[tuple[int, list[int]]] = field(default_factory=list)  # per hop (paragraph, sentences)
    answer: str | None = None
    answer_type: int = -1  # index into ANSWER_TYPES


@dataclass
class DocHopperBatch:
    examples: list[DocHopperExample]
    query_ids: torch.Tensor  # int64 [B, Lq]
    query_mask: torch.Tensor  # int64 [B, Lq]
    hop_positions: torch.Tensor  # int64 [B, T]
    sentence_mask: torch.Tensor  # bool [B, P, S]
    paragraph_valid: torch.Tensor  # bool [B, P]
    targets: torch.Tensor  # bool [B, T, P, 1 + S]: positives per hop (entry 0 = the paragraph, 1 + j = sentence j)
    has_target: torch.Tensor  # bool [B, T]
    # Either the paragraphs' tokens (encoded inline) ...
    paragraph_ids: torch.Tensor | None = None  # int64 [R, L], one row per real paragraph
    paragraph_mask: torch.Tensor | None = None  # int64 [R, L]
    paragraph_sentence_ids: torch.Tensor | None = None  # int64 [R, L]
    paragraph_slot: torch.Tensor | None = None  # int64 [R]: b * P + p
    # ... or their precomputed sentence embeddings
    sentence_embeddings: torch.Tensor | None = None  # float [B, P, S, H]

    @property
    def num_graphs(self) -> int:
        return len(self.examples)

    @property
    def num_real_tokens(self) -> int:
        """Query and paragraph tokens of the batch (the reader's are in `DocHopperOutput.tokens`)."""
        paragraphs = int(self.paragraph_mask.sum()) if self.paragraph_mask is not None else 0
        return int(self.query_mask.sum()) + paragraphs

    def to(self, device: torch.device | str, non_blocking: bool = False) -> DocHopperBatch:
        moved = {f.name: getattr(self, f.name) for f in fields(self)}
        for name, value in moved.items():
            if isinstance(value, torch.Tensor):
                moved[name] = value.to(device, non_blocking=non_blocking)
        return DocHopperBatch(**moved)

    def pin_memory(self) -> DocHopperBatch:
        """Page-locked tensors (the training prefetcher's, on CUDA)."""
        pinned = {f.name: getattr(self, f.name) for f in fields(self)}
        return DocHopperBatch(**{k: v.pin_memory() if isinstance(v, torch.Tensor) else v for k, v in pinned.items()})


def collate(
    cfg: DocHopperConfig,
    examples: Sequence[DocHopperExample],
    hidden_size: int,
    corpus: dict[str, torch.Tensor] | None = None,
) -> DocHopperBatch:
    """Stack examples. With `corpus` (doc_id -> [S_i, H] from `encode_corpus`) the batch carries the
    precomputed sentence embeddings; without, the paragraphs' tokens (encoded in `forward`)."""
    b, t = len(examples), len(cfg.hops)
    p = max(len(e.doc_ids) for e in examples)
    s = max(1, max(int(n) for e in examples for n in e.num_sentences))
    lq = max(len(e.query_ids) for e in examples)
    query_ids, query_mask = torch.zeros(b, lq, dtype=torch.long), torch.zeros(b, lq, dtype=torch.long)
    sentence_mask = torch.zeros(b, p, s, dtype=torch.bool)
    paragraph_valid = torch.zeros(b, p, dtype=torch.bool)
    targets = torch.zeros(b, t, p, 1 + s, dtype=torch.bool)
    for i, e in enumerate(examples):
        query_ids[i, : len(e.query_ids)] = torch.from_numpy(e.query_ids)
        query_mask[i, : len(e.query_ids)] = 1
        for j, count in enumerate(e.num_sentences.tolist()):
            sentence_mask[i, j, :count] = True
            paragraph_valid[i, j] = count > 0
        for hop, (node, sentences) in enumerate(e.hop_targets):
            if node < 0:
                continue
            if cfg.hops[hop] == "paragraph":
                targets[i, hop, node, 0] = True
            else:
                for j in sentences:
                    if j < e.num_sentences[node]:  # a supporting sentence cut by truncation is no target
                        targets[i, hop, node, 1 + j] = True
    batch = DocHopperBatch(
        examples=list(examples),
        query_ids=query_ids,
        query_mask=query_mask,
        hop_positions=torch.from_numpy(np.stack([e.hop_positions for e in examples])),
        sentence_mask=sentence_mask,
        paragraph_valid=paragraph_valid,
        targets=targets,
        has_target=targets.flatten(2).any(-1),
    )
    if corpus is not None:
        embeddings = torch.zeros(b, p, s, hidden_size)
        for i, e in enumerate(examples):
            for j, doc_id in enumerate(e.doc_ids):
                stored = corpus[doc_id]
                if stored.shape[0] != e.num_sentences[j]:
                    raise ValueError(
                        f"corpus entry {doc_id!r} has {stored.shape[0]} sentences, expected {e.num_sentences[j]}"
                    )
                embeddings[i, j, : stored.shape[0]] = stored
        batch.sentence_embeddings = embeddings
        return batch
    rows = [
        (i * p + j, ids, sids)
        for i, e in enumerate(examples)
        for j, (ids, sids) in enumerate(zip(e.paragraph_ids, e.sentence_ids))
    ]
    length = max(len(ids) for _, ids, _ in rows)
    batch.paragraph_ids = torch.zeros(len(rows), length, dtype=torch.long)
    batch.paragraph_mask = torch.zeros(len(rows), length, dtype=torch.long)
    batch.paragraph_sentence_ids = torch.full((len(rows), length), -1, dtype=torch.long)
    for r, (_, ids, sids) in enumerate(rows):
        batch.paragraph_ids[r, : len(ids)] = torch.from_numpy(ids)
        batch.paragraph_mask[r, : len(ids)] = 1
        batch.paragraph_sentence_ids[r, : len(ids)] = torch.from_numpy(sids)
    batch.paragraph_slot = torch.tensor([slot for slot, _, _ in rows], dtype=torch.long)
    return batch
