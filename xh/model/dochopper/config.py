"""DocHopper's settings (`DocHopperConfig`), made from the project's `model` section by `config_from_model`,
and the saved folder's names."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "dochopper_config.json"
FORMAT = "dochopper"
FORMAT_VERSION = 1
MAX_TITLE_TOKENS = 32


@dataclass
class DocHopperConfig:
    backbone: str = "sentence-transformers/all-MiniLM-L6-v2"
    hops: tuple[str, ...] = ("paragraph", "sentence", "paragraph", "sentence")  # §4.2, HotpotQA
    sentence_pooling: Literal["mean", "first"] = "mean"  # a sentence's vector from its tokens' states
    include_title: bool = True  # paragraph input `[CLS] title [SEP] paragraph [SEP]` (still no question)
    max_paragraph_tokens: int = 256
    max_question_tokens: int = 64
    max_reader_tokens: int = 192
    scale_scores: bool = True  # q·c / √H (see the module docstring)
    query_update: bool = True  # Eq. 7 (False: the ablation "w/o query update")
    evidence_lambdas: tuple[float, ...] = (0.7, 0.0)  # Eq. 8 λ1 per evidence (HotpotQA-Long)
    top_k: int = 4  # sentences per evidence combined and reranked
    rerank: bool = True  # False: the best combination by Eq. 8 scores alone ("direct")
    reader_negatives: int = 3
    max_answer_tokens: int = 30
    hop_loss_weight: float = 1.0
    rerank_loss_weight: float = 1.0
    span_loss_weight: float = 1.0
    answer_type_loss_weight: float = 1.0
    attn_implementation: str = "sdpa"

    def __post_init__(self) -> None:
        self.hops = tuple(self.hops)
        self.evidence_lambdas = tuple(self.evidence_lambdas)
        if not self.hops or any(h not in ("paragraph", "sentence") for h in self.hops):
            raise ValueError(f"hops must be a non-empty sequence of 'paragraph' / 'sentence', not {self.hops}")
        if len(self.evidence_lambdas) != len(evidence_hops(self.hops)):
            raise ValueError(f"one λ per evidence: {len(evidence_hops(self.hops))} evidences, {self.evidence_lambdas}")


def config_from_model(model) -> DocHopperConfig:
    """The DocHopperConfig of the project's `model` config section (`model.architecture: dochopper`)."""
    if model.task != "hotpot":
        raise ValueError(f"model.architecture=dochopper answers HotpotQA questions, not task {model.task!r}")
    hops = tuple(model.dochopper_hops)
    lambdas = tuple(DocHopperConfig.evidence_lambdas[i] if i < 2 else 0.0 for i in range(len(evidence_hops(hops))))
    return DocHopperConfig(
        backbone=model.backbone,
        hops=hops,
        evidence_lambdas=lambdas,
        max_paragraph_tokens=model.max_node_tokens,
        max_answer_tokens=model.max_answer_tokens,
        span_loss_weight=model.span_loss_weight,
        answer_type_loss_weight=model.answer_type_loss_weight,
        attn_implementation=model.attn_implementation,
    )


def evidence_hops(hops: Sequence[str]) -> list[tuple[int | None, int]]:
    """(paragraph hop or None, sentence hop) of each evidence: every sentence hop ends one evidence."""
    out, paragraph = [], None
    for t, kind in enumerate(hops):
        if kind == "paragraph":
            paragraph = t
        else:
            out.append((paragraph, t))
            paragraph = None
    return out
