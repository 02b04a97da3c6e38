"""Segment reductions in plain torch: softmax, log-sum-exp and max over groups of rows.

A *segment* is a group of rows that share an index: the in-edges of one destination node (hop
attention) or the nodes of one graph (FEVER node importance). Rows are not sorted by segment.

    alpha = segment_softmax(scores, dst, num_segments=n)        # scores [E, H] -> weights summing to 1 per dst
    log_p = segment_logsumexp(log_terms, node_graph, num_segments=g)   # [N, C] -> [G, C]

Every reduction subtracts the segment's maximum first, so large scores never overflow. A segment
that no row belongs to comes out as zeros (softmax weights do not exist for it, sums are empty).
"""

from __future__ import annotations

import torch


def _expand(index: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """index [R] -> [R, *like.shape[1:]] so that it can drive scatter_reduce on `like`."""
    return index.view(-1, *([1] * (like.dim() - 1))).expand_as(like)


def segment_max(values: torch.Tensor, index: torch.Tensor, num_segments: int) -> torch.Tensor:
    """[R, ...] -> [num_segments, ...]: the maximum of each segment's rows (0 for an empty segment)."""
    out = values.new_full((num_segments, *values.shape[1:]), float("-inf"))
    out = out.scatter_reduce(0, _expand(index, values), values, reduce="amax", include_self=True)
    return torch.where(torch.isinf(out) & (out < 0), torch.zeros_like(out), out)


def segment_sum(values: torch.Tensor, index: torch.Tensor, num_segments: int) -> torch.Tensor:
    """[R, ...] -> [num_segments, ...]."""
    return values.new_zeros((num_segments, *values.shape[1:])).index_add_(0, index, values)


def segment_softmax(scores: torch.Tensor, index: torch.Tensor, num_segments: int) -> torch.Tensor:
    """Softmax over the rows of each segment; same shape as `scores`."""
    # The max is a constant shift: no gradient needs to flow through it.
    shifted = scores - segment_max(scores.detach(), index, num_segments)[index]
    exp = shifted.exp()
    return exp / segment_sum(exp, index, num_segments)[index]


def segment_logsumexp(values: torch.Tensor, index: torch.Tensor, num_segments: int) -> torch.Tensor:
    """log Σ exp(values) over each segment's rows: [R, ...] -> [num_segments, ...]."""
    peak = segment_max(values.detach(), index, num_segments)
    return segment_sum((values - peak[index]).exp(), index, num_segments).log() + peak
