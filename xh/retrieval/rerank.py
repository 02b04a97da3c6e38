"""A cross-encoder re-ranker: `[CLS] question [SEP] paragraph [SEP]` -> one relevance logit.

The paper re-ranks BM25's top 100 with a BERT cross-encoder and keeps the top 2 (D_ir), keeps the
top entity per linked surface (D_el) and the top 15 hyperlink neighbours (D_exp). This module holds
the model, its training examples and its files; `xh.train.rerank` trains it on Ray Train (the
stage is `xh.stages.rerank`) and `xh.retrieval.candidates.Retriever` uses it.

    encoder = CrossEncoder.from_backbone("bert-base-uncased", max_length=256)   # or a local folder
    encoder.score("Where was the director of Arden Works born?", ["Arden Works. ...", "..."])  # logits
    encoder.save("s3://bucket/xh/models/reranker")        # local path or s3://
    encoder = CrossEncoder.load("s3://bucket/xh/models/reranker")

    examples = examples_from_hotpot(records, negatives_per_positive=3, seed=13)  # distractor format
    examples = training_examples(cfg.rerank, tables)       # from rerank.questions or rerank.retrieval

A paragraph is `passage_text(title, text)`: the title, then the paragraph, as the BM25 index reads
it (a paragraph often names its subject only in the title). Pairs are encoded with truncation
"only_second" (the paragraph is cut, never the question); a question longer than half of
`max_length` is cut first, so that "only_second" always has room.

Training examples are (question, paragraph, label) with label 1 for a paragraph holding a supporting
fact. Negatives are the question's other context paragraphs, or (`negatives="bm25"`) the best BM25
paragraphs of the file's whole corpus that are not gold: what the re-ranker meets at retrieval time.
Two losses, ranking is by the logit either way:

    listwise   (default) each positive against its own question's negatives: the mean over positives p
               of -log(e^s_p / (e^s_p + sum_n e^s_n)) (`group_softmax_loss`); a batch holds whole questions
    pointwise  binary cross-entropy on each pair's logit (`pair_loss`)

The head reads the [CLS] hidden state (`pooling="cls"`) or the mean over the pair's tokens
(`pooling="mean"`, how all-MiniLM-L6-v2 was pretrained to summarise a text).

A saved re-ranker is the saved-model folder of `xh.model.saved` (no pickle, reloadable offline):

    reranker.json       format, version, max_length, the backbone it started from, hidden size, pooling
                        (absent in earlier files: "cls")
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
from xh.inputs.questions import load_json
from xh.model.saved import load_encoder_model, load_tokenizer, pretrained_backbone, save_encoder_model
from xh.storage.store import Location, located
from xh.wiki.titles import normalize_title

FORMAT = "xh-cross-encoder"
VERSION = 1
CONFIG_FILE = "reranker.json"
POOLINGS = ("cls", "mean")


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


def examples_from_hotpot(
    records: Iterable[dict],
    negatives_per_positive: int = 3,
    seed: int = 13,
    negatives: str = "context",
    bm25_pool: int = 20,
) -> list[Example]:
    """Pairs from HotpotQA records in the distractor format (`question`, `supporting_facts`, `context`).

    Positives: the context paragraphs whose title holds a supporting fact. Negatives, up to
    `negatives_per_positive` per positive, drawn at random (seeded) from the other context paragraphs
    (`negatives="context"`) or from BM25's top `bm25_pool` over every record's context paragraphs,
    gold left out (`"bm25"`: hard negatives, as retrieval ranks them). Questions without a positive in
    their context (or without context) give no pairs.
    """
    records = list(records)
    rng = random.Random(seed)
    hard = _bm25_negatives(records, bm25_pool) if negatives == "bm25" else None
    examples = []
    for i, record in enumerate(records):
        gold = {normalize_title(str(fact[0])) for fact in record.get("supporting_facts") or []}
        context = [(title, "".join(sentences)) for title, sentences in record.get("context") or [] if sentences]
        positives = [(t, x) for t, x in context if normalize_title(t) in gold]
        if hard is None:
            pool = [(t, x) for t, x in context if normalize_title(t) not in gold]
        else:
            pool = [(t, x) for t, x in hard[i] if normalize_title(t) not in gold]
        examples += _pairs(str(record.get("_id")), record["question"], positives, pool, negatives_per_positive, rng)
    return examples


def _bm25_negatives(records: list[dict], k: int) -> list[list[tuple[str, str]]]:
    """Each record's question's BM25 top k (title, text) over the records' context paragraphs (one per title)."""
    from xh.retrieval.analyzer import Analyzer
    from xh.retrieval.bm25 import BM25Shard, CorpusStats

    corpus: dict[str, str] = {}
    for record in records:
        for title, sentences in record.get("context") or []:
            if sentences:
                corpus.setdefault(title, "".join(sentences))
    if not corpus:
        return [[] for _ in records]
    titles = list(corpus)
    analyzer = Analyzer()
    tokens = analyzer.analyze_batch([passage_text(t, corpus[t]) for t in titles])
    shard = BM25Shard.build(list(map(str, range(len(titles)))), tokens, CorpusStats.from_token_lists(tokens))
    hits = shard.search(analyzer.analyze_batch([r["question"] for r in records]), k=k)
    return [[(titles[int(d)], corpus[titles[int(d)]]) for d in hit.doc_ids] for hit in hits]


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


def pair_text(first: str, second: str) -> str:
    """The paragraph side of a path pair: two paragraphs (each a `passage_text`) joined by BERT's [SEP] token."""
    return f"{first} [SEP] {second}"


def path_examples_from_hotpot(
    records: Iterable[dict], negatives_per_question: int = 12, seed: int = 13, bm25_pool: int = 20
) -> list[Example]:
    """Path pairs (question, `pair_text(a, b)`, label) from HotpotQA records in the distractor format.

    A single-paragraph re-ranker scores the second paragraph of a bridge question without the first,
    which names the bridge entity; a path re-ranker reads both. Positives: the two supporting
    paragraphs, in both orders. Negatives (`negatives_per_question`, seeded): half a supporting
    paragraph with one of BM25's best `bm25_pool` others, half two of those others, each in a random
    order. Questions without exactly two supporting paragraphs in their context, or without another
    paragraph in BM25's pool, give no pairs.
    """
    records = list(records)
    rng = random.Random(seed)
    hard = _bm25_negatives(records, bm25_pool)
    examples = []
    for record, pool in zip(records, hard):
        gold_titles = {normalize_title(str(fact[0])) for fact in record.get("supporting_facts") or []}
        context = [(title, "".join(sentences)) for title, sentences in record.get("context") or [] if sentences]
        gold = [(t, x) for t, x in context if normalize_title(t) in gold_titles]
        others = [(t, x) for t, x in pool if normalize_title(t) not in gold_titles]
        if len(gold) != 2 or not others:
            continue
        qid, question = str(record.get("_id")), record["question"]
        half = negatives_per_question // 2
        mixed = [(g, o) for g in gold for o in others]
        wrong = [(a, b) for i, a in enumerate(others) for b in others[i + 1 :]]
        chosen = rng.sample(mixed, min(half, len(mixed))) + rng.sample(
            wrong, min(negatives_per_question - half, len(wrong))
        )
        a, b = (passage_text(*g) for g in gold)
        examples += [Example(qid, question, pair_text(a, b), 1.0), Example(qid, question, pair_text(b, a), 1.0)]
        for pair in chosen:
            first, second = pair if rng.random() < 0.5 else pair[::-1]
            examples.append(Example(qid, question, pair_text(passage_text(*first), passage_text(*second)), 0.0))
    return examples


def best_path_first(
    encoder: CrossEncoder,
    question: str,
    passages: Sequence[str],
    top: int = 10,
    batch_size: int = 32,
    single_scores: Sequence[float] | None = None,
) -> list[int]:
    """The order of `passages` (`passage_text`s, ranked best first) with the path re-ranker's best pair
    among the first `top` moved to the front: indices, the pair (in ranked order) first, then the others
    as they were. With `single_scores` (the passages' own re-ranker logits), a pair scores its path
    logit plus both passages' logits: the two models' log-odds added."""
    head = list(range(min(top, len(passages))))
    pairs = [(i, j) for n, i in enumerate(head) for j in head[n + 1 :]]
    if not pairs:
        return list(range(len(passages)))
    scores = encoder.score(question, [pair_text(passages[i], passages[j]) for i, j in pairs], batch_size)
    if single_scores is not None:
        scores = scores + np.array([single_scores[i] + single_scores[j] for i, j in pairs])
    best = pairs[int(np.argmax(scores))]  # argmax takes the first of equal scores: the better-ranked pair
    return [*best, *(i for i in range(len(passages)) if i not in best)]


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


def training_examples(r: RerankConfig, tables: Location | str) -> list[Example]:
    """The training pairs of `rerank.questions` (distractor format; path pairs with `rerank.paths`) or
    `rerank.retrieval` (retrieval outputs; their documents from the docs table under `tables`); the files
    the settings name are reached through the tables' store."""
    tables = located(tables)
    if r.questions:
        records = load_json(tables.store.at(r.questions))
        if not isinstance(records, list):
            raise ConfigError(f"{r.questions} is not a HotpotQA question file (a JSON array of questions)")
        records = [rec for rec in records[: r.max_questions] if isinstance(rec, dict) and rec.get("question")]
        if r.paths:
            examples = path_examples_from_hotpot(records, r.path_negatives, r.seed, r.bm25_pool)
        else:
            examples = examples_from_hotpot(records, r.negatives_per_positive, r.seed, r.negatives, r.bm25_pool)
        source = r.questions
    elif r.paths:
        raise ConfigError("rerank.paths=true learns from a HotpotQA file: set rerank.questions")
    elif r.retrieval:
        fs, out = tables.store.at(r.retrieval).fs_path()
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
        tables_fs, tables_path = tables.fs_path()
        docs = pads.dataset(f"{tables_path}/docs", filesystem=tables_fs, format="parquet").to_table(
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
    """A BERT-family backbone and a linear head on the [CLS] (position 0) hidden state, or on the mean of
    the pair's token states (`pooling="mean"`)."""

    def __init__(self, backbone, tokenizer, max_length: int = 256, source: str = "", pooling: str = "cls"):
        super().__init__()
        if pooling not in POOLINGS:
            raise ValueError(f"pooling {pooling!r}: one of {POOLINGS}")
        if getattr(backbone, "pooler", None) is not None:
            # BERT's pooler is not used (the last hidden states feed the head): parameters without a
            # gradient would stall DDP's all-reduce
            backbone.pooler = None
        self.backbone, self.tokenizer, self.max_length, self.source = backbone, tokenizer, max_length, source
        self.pooling = pooling
        self.head = nn.Linear(backbone.config.hidden_size, 1)

    # --- building, saving, loading ---------------------------------------------------------

    @classmethod
    def from_backbone(cls, name_or_path: str, max_length: int = 256, seed: int | None = None, pooling: str = "cls"):
        """A new re-ranker on a pretrained backbone (a hub name or a local folder); the head is random."""
        if seed is not None:
            torch.manual_seed(seed)
        backbone = pretrained_backbone(name_or_path)
        return cls(backbone, load_tokenizer(name_or_path), max_length, source=str(name_or_path), pooling=pooling)

    def save(self, where: Location | str) -> None:
        """Write the re-ranker's files under `where` (a local folder or s3://...)."""
        where = located(where)
        config = {
            "format": FORMAT,
            "version": VERSION,
            "max_length": self.max_length,
            "hidden_size": self.backbone.config.hidden_size,
            "started_from": self.source,
            "pooling": self.pooling,
        }
        save_encoder_model(
            where, CONFIG_FILE, config, self.state_dict(), backbone=self.backbone, tokenizer=self.tokenizer
        )

    @classmethod
    def load(cls, where: Location | str):
        """A saved re-ranker from a local folder or s3:// (downloaded to a temporary folder first)."""
        saved = load_encoder_model(located(where), CONFIG_FILE, FORMAT, VERSION, what="re-ranker")
        config = saved.config
        model = cls(
            saved.new_backbone(),
            saved.tokenizer,
            int(config["max_length"]),
            config.get("started_from", ""),
            config.get("pooling", "cls"),
        )
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
        if self.pooling == "mean":
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
            return self.head((hidden * mask).sum(1) / mask.sum(1).clamp(min=1)).squeeze(-1)
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


def group_softmax_loss(logits: torch.Tensor, labels: torch.Tensor, sizes: Sequence[int]) -> torch.Tensor:
    """Listwise loss over consecutive groups (one per question) of `sizes` pairs: for each positive p of a
    group, -log(e^s_p / (e^s_p + sum of e^s_n over the group's negatives)); the mean over all positives.

    Each positive competes only with negatives (not with the other supporting paragraph of a bridge
    question, which is just as relevant); a group without negatives adds 0.
    """
    losses = []
    for scores, marks in zip(logits.split(list(sizes)), labels.split(list(sizes))):
        positive, negative = scores[marks > 0.5], scores[marks <= 0.5]
        table = torch.cat([positive[:, None], negative[None, :].expand(len(positive), -1)], dim=1)
        losses.append(-torch.log_softmax(table, dim=1)[:, 0])
    return torch.cat(losses).mean()


def question_groups(examples: Sequence[Example]) -> list[list[Example]]:
    """The pairs grouped by question (first-seen order): the units of the listwise loss."""
    groups: dict[str, list[Example]] = {}
    for e in examples:
        groups.setdefault(e.qid, []).append(e)
    return [g for g in groups.values() if any(e.label > 0.5 for e in g)]


def listwise_loss(model: nn.Module, encoder: CrossEncoder, groups: Sequence[Sequence[Example]]) -> torch.Tensor:
    """`group_softmax_loss` of a batch of whole questions' pairs (one forward pass over all of them)."""
    batch = [e for group in groups for e in group]
    inputs = encoder.encode([e.question for e in batch], [e.passage for e in batch])
    device = next(encoder.parameters()).device
    logits = model(**{k: v.to(device) for k, v in inputs.items()})
    labels = torch.tensor([e.label for e in batch], dtype=logits.dtype, device=device)
    return group_softmax_loss(logits, labels, [len(g) for g in groups])


def epoch_batches(examples: Sequence, batch_size: int, seed: int, epoch: int) -> list[list]:
    """The examples (pairs, or question groups) shuffled (seeded per epoch) and cut into full batches
    (a last partial batch is dropped)."""
    order = list(range(len(examples)))
    random.Random(seed * 1_000_003 + epoch).shuffle(order)
    return [[examples[i] for i in order[k : k + batch_size]] for k in range(0, len(order) - batch_size + 1, batch_size)]
