"""DocHopper's hop equations (pure functions of tensors): Eq. 3-7 of one hop, the table's softmax and
loss, all T hops (`attend`) and Eq. 8's evidence scores."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from xh.model.heads import MASKED


def paragraph_embeddings(
    query: torch.Tensor, sentences: torch.Tensor, mask: torch.Tensor, scale: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. 3: p_i = Σ_j α_ij s^i_j, α_ij = softmax_j(q · s^i_j). query [B, H], sentences [B, P, S, H],
    mask bool [B, P, S] -> (p [B, P, H], α [B, P, S]; 0 where masked, a paragraph without sentences is 0)."""
    scores = torch.einsum("bh,bpsh->bps", query, sentences) * scale
    alpha = torch.softmax(scores.masked_fill(~mask, MASKED), dim=-1) * mask
    return torch.einsum("bps,bpsh->bph", alpha, sentences), alpha


def mix_sentences(mix: nn.Linear, query: torch.Tensor, sentences: torch.Tensor) -> torch.Tensor:
    """Eq. 4 for every sentence: W_q [q ; s]. query [B, H], sentences [B, P, S, H] -> [B, P, S, H]."""
    q = query[:, None, None, :].expand_as(sentences)
    return mix(torch.cat([q, sentences], dim=-1))


def mix_paragraphs(
    mix: nn.Linear,
    v: torch.Tensor,
    query: torch.Tensor,
    sentences: torch.Tensor,
    alpha: torch.Tensor,
    mask: torch.Tensor,
) -> torch.Tensor:
    """Eq. 5-6 for every paragraph: k_j = W_q [α_j q ; s_j], Σ_j β_j k_j with β = softmax_j(v · k_j).
    The α are Eq. 3's (re-used, as the paper does). -> [B, P, H]."""
    q = alpha.unsqueeze(-1) * query[:, None, None, :]
    k = mix(torch.cat([q, sentences], dim=-1))  # [B, P, S, H]
    beta = torch.softmax((k @ v).masked_fill(~mask, MASKED), dim=-1) * mask
    return torch.einsum("bps,bpsh->bph", beta, k)


def table_log_probs(scores: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """log softmax over one question's whole table: scores, valid [B, P, 1 + S] -> [B, P, 1 + S]."""
    flat = scores.masked_fill(~valid, MASKED).flatten(1)
    return flat.log_softmax(-1).view_as(scores)


def hop_loss(log_probs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Cross-entropy against the positives of a hop: -Σ_m (I_m / Σ I) log p_m, averaged over questions.
    log_probs, targets [B, P, 1 + S]; every question given must have a positive."""
    weights = targets.flatten(1).float()
    weights = weights / weights.sum(-1, keepdim=True)
    return -(weights * log_probs.flatten(1)).sum(-1).mean()


def attend(
    queries: torch.Tensor,
    sentences: torch.Tensor,
    sentence_mask: torch.Tensor,
    paragraph_valid: torch.Tensor,
    mix: nn.Linear,
    mix_vector: torch.Tensor,
    scale: float,
    query_update: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The T hops: returns (table scores [B, T, P, 1 + S], the queries used [B, T, H])."""
    valid = torch.cat([paragraph_valid.unsqueeze(-1), sentence_mask], dim=-1)
    residual = None
    all_scores, used = [], []
    for t in range(queries.shape[1]):
        q = queries[:, t] if residual is None else queries[:, t] + residual  # Eq. 7
        paragraphs, alpha = paragraph_embeddings(q, sentences, sentence_mask, scale)  # Eq. 3
        paragraph_scores = torch.einsum("bh,bph->bp", q, paragraphs) * scale
        sentence_scores = torch.einsum("bh,bpsh->bps", q, sentences) * scale
        scores = torch.cat([paragraph_scores.unsqueeze(-1), sentence_scores], dim=-1).masked_fill(~valid, MASKED)
        all_scores.append(scores)
        used.append(q)
        if query_update and t + 1 < queries.shape[1]:
            a = table_log_probs(scores, valid).exp()  # soft attention over the whole table
            paragraph_mix = mix_paragraphs(mix, mix_vector, q, sentences, alpha, sentence_mask)
            sentence_mix = mix_sentences(mix, q, sentences)
            residual = torch.einsum("bp,bph->bh", a[..., 0], paragraph_mix) + torch.einsum(
                "bps,bpsh->bh", a[..., 1:], sentence_mix
            )  # q̃_t
    return torch.stack(all_scores, dim=1), torch.stack(used, dim=1)


def evidence_scores(
    table_scores: torch.Tensor,
    sentence_mask: torch.Tensor,
    evidences: Sequence[tuple[int | None, int]],
    lambdas: Sequence[float],
) -> torch.Tensor:
    """Eq. 8 per evidence: q_sent · s^i_j + λ_e q_par · p_i -> [B, E, P, S] (masked)."""
    out = []
    for (paragraph_hop, sentence_hop), lam in zip(evidences, lambdas):
        score = table_scores[:, sentence_hop, :, 1:]
        if paragraph_hop is not None and lam:
            score = score + lam * table_scores[:, paragraph_hop, :, :1]
        out.append(score.masked_fill(~sentence_mask, MASKED))
    return torch.stack(out, dim=1)
