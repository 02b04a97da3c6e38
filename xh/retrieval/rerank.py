"""A cross-encoder re-ranker: `[CLS] question [SEP] paragraph [SEP]` -> one relevance logit.

The paper re-ranks BM25's top 100 with a BERT cross-encoder and keeps the top 2 (D_ir), keeps the
top entity per linked surface (D_el) and the top 15 hyperlink neighbours (D_exp). This module holds
the model, its training examples and its files; `xh.train.rerank` trains it on Ray Train (the
driver is `workflows/rerank.py`) and `xh.retrieval.candidates.Retriever` uses it.

    encoder = CrossEncoder.from_backbone("bert-base-uncased", max_length=256)   # or a local folder
    encoder.score("Where was the director of Arden Works born?", ["Arden Works. ...", "..."])  # logits
    encoder.save("s3://bucket/xh/models/reranker")        # local path or s3://
    encoder = CrossEncoder.load("s3://bucket/xh/models/reranker")

    examples = examples_from_hotpot(records, negatives_per_positive=3, seed=13)  # distractor format
    examples = training_examples(cfg.rerank, tables_uri)   # from rerank.questions or rerank.retrieval

A paragraph is `passage_text(title, text)`: the title, then the paragraph, as the BM25 index reads
it (a paragraph often names its subject only in the title). Pairs are encoded with truncation
"only_second" (the paragraph is cut, never the question); a question longer than half of
`max_length` is cut first, so that "only_second" always has room.

Training examples are (question, paragraph, label) with label 1 for a paragraph holding a supporting
fact. Loss: binary cross-entropy on each pair's logit (pointwise), which admits any number of
positives per question (bridge questions have two, and the distractor setting a fixed pool of
negatives); ranking is by the logit.

A saved re-ranker is the saved-model folder of `xh.model.saved` (no pickle, reloadable offline):

    reranker.json       format, version, max_length, the backbone it started from, hidden size
    model.safetensors   the fine-tuned backbone (backbone.*) and the linear head (head.weight [1, hidden], head.bias [1])
    config.json, tokenizer files    the backbone's
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.dataset as pads
import torch
from torch import nn

from xh.config import ConfigError, RerankConfig
from xh.model.saved import load_encoder_model, load_tokenizer, pretrained_backbone, save_encoder_model
from xh.questions import load_json
from xh.storage import S3Settings, resolve
from xh.wiki.titles import normalize_title

FORMAT = "xh-cross-encoder"
VERSION = 1
CONFIG_FILE = "reranker.json"


def passage_text(title: str, text: str) -> str:
    """The paragraph side of a pair: "Title. paragraph" (as the BM25 index reads documents)."""
    text = text.strip()
    return f"{title}. {text}" if title else text


@dataclass(frozen=True)
class Example:
    """One training pair."""

    qid: str
    question: str
    passage: str
    label: float  # 1.0: holds a supporting fact; 0.0: does not


def examples_from_hotpot(records: Iterable[dict], negatives_per_positive: int = 3, seed: int = 13) -> list[Example]:
    """Pairs from HotpotQA records in the distractor format (`question`, `supporting_facts`, `context`).

    Positives: the context paragraphs whose title holds a supporting fact. Negatives: the other
    context paragraphs, up to `negatives_per_positive` per positive, drawn at random (seeded).
    Questions without a positive in their context (or without context) give no pairs.
    """
    rng = random.Random(seed)
    examples = []
    for record in records:
        gold = {normalize_title(str(fact[0])) for fact in record.get("supporting_facts") or []}
        context = [(title, "".join(sentences)) for title, sentences in record.get("context") or [] if sentences]
        positives = [(t, x) for t, x in context if normalize_title(t) in gold]
        negatives = [(t, x) for t, x in context if normalize_title(t) not in gold]
        examples += _pairs(
            str(record.get("_id")), record["question"], positives, negatives, negatives_per_positive, rng
        )
    return examples


def examples_from_candidates(
    questions: Iterable[dict],
    candidates: Iterable[dict],
    docs: dict[str, tuple[str, str]],
    negatives_per_positive: int = 3,
    seed: int = 13,
) -> list[Example]:
    """Pairs from retrieval outputs: QUESTIONS rows with supporting facts, their CANDIDATES rows, docs.

    `docs` maps doc_id -> (title, text) and must hold the gold documents too (found by title).
    Positives: the documents titled like a supporting fact. Negatives: the BM25 (`ir`) candidates
    that are not, hardest (best BM25 rank) first, `negatives_per_positive` per positive.
    """
    rng = random.Random(seed)
    by_title = {title: (title, text) for title, text in docs.values()}
    ir: dict[str, list[dict]] = {}
    for row in candidates:
        if row["source"] == "ir":
            ir.setdefault(row["qid"], []).append(row)
    examples = []
    for q in questions:
        gold = {fact["title"] for fact in q.get("supporting_facts") or []}
        positives = [by_title[t] for t in sorted(gold) if t in by_title]
        ranked = sorted(ir.get(q["qid"], []), key=lambda r: r["rank"])
        negatives = [docs[r["doc_id"]] for r in ranked if r["doc_id"] in docs and docs[r["doc_id"]][0] not in gold]
        examples += _pairs(
            q["qid"],
            q["question"],
            positives,
            negatives[: negatives_per_positive * len(positives)],
            negatives_per_positive,
            rng,
            shuffle=False,
        )
    return examples


def _pairs(qid, question, positives, negatives, per_positive, rng, shuffle=True) -> list[Example]:
    if not positives:
        return []
    negatives = list(negatives)
    if shuffle:
        rng.shuffle(negatives)
    chosen = negatives[: per_positive * len(positives)]
    return [Example(qid, question, passage_text(t, x), 1.0) for t, x in positives] + [
        Example(qid, question, passage_text(t, x), 0.0) for t, x in chosen
    ]


def training_examples(r: RerankConfig, tables_uri: str, s3: S3Settings | None = None) -> list[Example]:
    """The training pairs of `rerank.questions` (distractor format) or `rerank.retrieval` (retrieval outputs;
    their documents from the docs table under `tables_uri`)."""
    if r.questions:
        records = load_json(r.questions, s3)
        if not isinstance(records, list):
            raise ConfigError(f"{r.questions} is not a HotpotQA question file (a JSON array of questions)")
        records = [rec for rec in records[: r.max_questions] if isinstance(rec, dict) and rec.get("question")]
        examples, source = examples_from_hotpot(records, r.negatives_per_positive, r.seed), r.questions
    elif r.retrieval:
        fs, out = resolve(r.retrieval, s3)
        questions = pads.dataset(f"{out}/questions", filesystem=fs, format="parquet").to_table().to_pylist()
        questions = questions[: r.max_questions]
        qids = pa.array([q["qid"] for q in questions], pa.string())
        candidates = (
            pads.dataset(f"{out}/candidates", filesystem=fs, format="parquet")
            .to_table(filter=pads.field("qid").isin(qids))
            .to_pylist()
        )
        gold = pa.array(sorted({f["title"] for q in questions for f in q.get("supporting_facts") or []}), pa.string())
        wanted = pa.array(sorted({c["doc_id"] for c in candidates if c["source"] == "ir"}), pa.string())
        tables_fs, tables = resolve(tables_uri, s3)
        docs = pads.dataset(f"{tables}/docs", filesystem=tables_fs, format="parquet").to_table(
            columns=["doc_id", "title", "text"],
            filter=pads.field("doc_id").isin(wanted) | pads.field("title").isin(gold),
        )
        by_id = {d: (t, x) for d, t, x in zip(*(docs[c].to_pylist() for c in ("doc_id", "title", "text")))}
        examples = examples_from_candidates(questions, candidates, by_id, r.negatives_per_positive, r.seed)
        source = r.retrieval
    else:
        raise ConfigError("no training data: set rerank.questions (a HotpotQA file) or rerank.retrieval")
    if not examples:
        raise ConfigError(f"{source} gives no training pairs: no question has a supporting paragraph to learn from")
    return examples


class CrossEncoder(nn.Module):
    """A BERT-family backbone and a linear head on the [CLS] (position 0) hidden state."""

    def __init__(self, backbone, tokenizer, max_length: int = 256, source: str = ""):
        super().__init__()
        if getattr(backbone, "pooler", None) is not None:
            # BERT's pooler is not used ([CLS]'s hidden state feeds the head): parameters without a
            # gradient would stall DDP's all-reduce
            backbone.pooler = None
        self.backbone, self.tokenizer, self.max_length, self.source = backbone, tokenizer, max_length, source
        self.head = nn.Linear(backbone.config.hidden_size, 1)

    # --- building, saving, loading ---------------------------------------------------------

    @classmethod
    def from_backbone(cls, name_or_path: str, max_length: int = 256, seed: int | None = None):
        """A new re-ranker on a pretrained backbone (a hub name or a local folder); the head is random."""
        if seed is not None:
            torch.manual_seed(seed)
        backbone = pretrained_backbone(name_or_path)
        return cls(backbone, load_tokenizer(name_or_path), max_length, source=str(name_or_path))

    def save(self, uri: str, s3: S3Settings | None = None) -> None:
        """Write the re-ranker's files under `uri` (a local folder or s3://...)."""
        config = {
            "format": FORMAT,
            "version": VERSION,
            "max_length": self.max_length,
            "hidden_size": self.backbone.config.hidden_size,
            "started_from": self.source,
        }
        save_encoder_model(
            uri, CONFIG_FILE, config, self.state_dict(), backbone=self.backbone, tokenizer=self.tokenizer, s3=s3
        )

    @classmethod
    def load(cls, uri: str, s3: S3Settings | None = None):
        """A saved re-ranker from a local folder or s3:// (downloaded to a temporary folder first)."""
        saved = load_encoder_model(uri, CONFIG_FILE, FORMAT, VERSION, what="re-ranker", s3=s3)
        config = saved.config
        model = cls(saved.new_backbone(), saved.tokenizer, int(config["max_length"]), config.get("started_from", ""))
        model.load_state_dict(saved.weights, strict=True)
        return model.eval()

    # --- encoding and scoring --------------------------------------------------------------

    def encode(self, questions: Sequence[str], passages: Sequence[str]) -> dict:
        """Tokenized pairs as tensors (padded to the longest pair of the batch)."""
        cut = {q: self._cut_question(q) for q in set(questions)}
        questions = [cut[q] for q in questions]
        return self.tokenizer(
            list(questions),
            list(passages),
            truncation="only_second",
            max_length=self.max_length,
            padding=True,
            return_tensors="pt",
        )

    def _cut_question(self, question: str) -> str:
        # "only_second" refuses a question that leaves the paragraph no room: cut it at a token boundary
        limit = self.max_length // 2
        offsets = self.tokenizer(question, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
        return question if len(offsets) <= limit else question[: offsets[limit - 1][1]]

    def forward(self, input_ids, attention_mask, token_type_ids=None):
        """One logit per pair: [B]."""
        hidden = self.backbone(
            input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
        ).last_hidden_state
        return self.head(hidden[:, 0]).squeeze(-1)

    def score(self, question: str, passages: Sequence[str], batch_size: int = 32) -> np.ndarray:
        """Relevance logits of the passages for one question (higher is more relevant)."""
        return self.score_pairs([question] * len(passages), passages, batch_size)

    def score_pairs(self, questions: Sequence[str], passages: Sequence[str], batch_size: int = 32) -> np.ndarray:
        out = np.empty(len(passages), dtype=np.float64)
        was_training = self.training
        self.eval()
        device = next(self.parameters()).device
        with torch.inference_mode():
            for start in range(0, len(passages), batch_size):
                batch = self.encode(questions[start : start + batch_size], passages[start : start + batch_size])
                logits = self(**{k: v.to(device) for k, v in batch.items()})
                out[start : start + len(logits)] = logits.float().cpu().numpy()
        self.train(was_training)
        return out


# --- training ------------------------------------------------------------------------------------


def pair_loss(model: nn.Module, encoder: CrossEncoder, batch: Sequence[Example]) -> torch.Tensor:
    """Mean binary cross-entropy of the batch's logits against its labels.

    `model` is what runs the forward pass (the encoder itself, or its DDP wrapper); `encoder` tokenizes.
    """
    inputs = encoder.encode([e.question for e in batch], [e.passage for e in batch])
    device = next(encoder.parameters()).device
    logits = model(**{k: v.to(device) for k, v in inputs.items()})
    labels = torch.tensor([e.label for e in batch], dtype=logits.dtype, device=device)
    return nn.functional.binary_cross_entropy_with_logits(logits, labels)


def epoch_batches(examples: Sequence[Example], batch_size: int, seed: int, epoch: int) -> list[list[Example]]:
    """The examples shuffled (seeded per epoch) and cut into full batches (a last partial batch is dropped)."""
    order = list(range(len(examples)))
    random.Random(seed * 1_000_003 + epoch).shuffle(order)
    return [[examples[i] for i in order[k : k + batch_size]] for k in range(0, len(order) - batch_size + 1, batch_size)]
