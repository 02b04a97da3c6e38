"""DocHopper (Sun, Cohen, Salakhutdinov): iterative attention over precomputed paragraph and sentence embeddings.

DocHopper never reads the question and the context together while it hops. The context encoder reads
each paragraph alone, so its sentence embeddings can be computed once per corpus; the query encoder
reads the question alone; each hop is a few vector operations:

    s^i_j            = Enc_c(paragraph i)[tokens of sentence j]            mean (or first token)   §3.3
    q_0 .. q_{T-1}   = Enc_q([CLS] question [SEP] [MASK]^(T-1) [SEP])      at [CLS] and each mask    Eq. 2
    for t in 0 .. T-1:
        p_i   = Σ_j α_ij s^i_j,   α_ij = softmax_j(q_t · s^i_j)                                     Eq. 3
        a     = softmax over the table C = {p_0, s^0_0, s^0_1, .., p_1, s^1_0, ..} of q_t · c_m     §3.4
        sentence entry s:   mix = W_q [q_t ; s]                                                     Eq. 4
        paragraph entry i:  k_j = W_q [α_ij q_t ; s^i_j],  mix = Σ_j β_j k_j,  β = softmax_j(v · k_j)  Eq. 5-6
        q̃_t   = Σ_m a_m mix_m        (soft attention: the argmax entry ĉ is "not directly used", §3.4)
        q_t+1 ← q_t+1 + q̃_t                                                                        Eq. 7
    loss_t = cross-entropy(softmax_m(q_t · c_m), positives of hop t)                                §3.4

All inner products are scaled by 1/√H (`scale_scores`, as in attention; the paper's ETC scores are raw:
BERT-family hidden states are far longer, and raw products saturate the softmax at step 0).

HotpotQA (§4.2): four hops (paragraph, sentence, paragraph, sentence); hops 1-2 are supervised by the
first supporting paragraph and its supporting sentences, hops 3-4 by the second (`hop_targets`: the
supporting paragraphs in the order of the data's supporting facts, the one whose supporting sentences
hold the answer last). Evidence e is scored as in Eq. 8 without sparse features:

    score_e(s^i_j) = q_{sentence hop} · s^i_j + λ_e · q_{paragraph hop} · p_i      λ = (0.7, 0.0)

The top 4 sentences of each evidence give 16 combinations (pairs in one paragraph are skipped); a
reader reads each `[CLS] question [SEP] title_a: sentence_a title_b: sentence_b [SEP]` and reranks the
combinations (Xiong et al. 2021's rerank, here: retrieval score + the reader's pair logit on [CLS]).
The reader is a small head of its own on the shared backbone (the project's `HotpotHeads` expect a
graph batch): start/end logits over context tokens, answer type (span / yes / no) and the pair logit on
[CLS]; spans are decoded with `xh.model.decode.best_span` and sliced from the context text. Training
reads the gold combination and `reader_negatives` of the model's own best wrong ones.

    cfg = DocHopperConfig(backbone="path/or/name")
    model = DocHopper.from_backbone(cfg)
    examples = model.prepare(rows)                                 # `graphs` table rows (HotpotQA)
    out = model(model.collate(examples))                           # out.loss, out.losses, out.table_scores
    corpus = dict(zip(doc_ids, model.encode_corpus([(title, sentences), ...])))   # precomputable
    predictions = model.predict(examples, corpus)                  # [{"qid", "answer", "supporting_facts", ..}]
    model.save_pretrained("out/dochopper"); DocHopper.from_pretrained("out/dochopper")

Faithfulness: ETC (global sentence tokens, pretrained with CPC) becomes the project's BERT-family
backbone with pooled sentence spans, one backbone shared by query encoder, context encoder and reader;
the dummy questions q_null become [MASK] tokens after the question.
"""

from __future__ import annotations

import bisect
import itertools
import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

from xh.graph.encoded import ANSWER_TYPES, QUESTION_TYPES
from xh.graph.hotpot import answer_char_spans
from xh.model.decode import best_span
from xh.model.heads import MASKED
from xh.wiki.titles import normalize_title

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


# --- the hop equations (pure functions of tensors) --------------------------------------------------


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


# --- examples and batches -------------------------------------------------------------------------


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


def _reader_context(picks: Sequence[tuple[str, str]]) -> str:
    return " ".join(f"{title}: {sentence.strip()}" for title, sentence in picks)


# --- the model --------------------------------------------------------------------------------------


@dataclass
class DocHopperOutput:
    table_scores: torch.Tensor  # [B, T, P, 1 + S] q_t · c_m (masked), entry 0 the paragraph
    evidence_scores: torch.Tensor  # [B, E, P, S] Eq. 8 per evidence (masked)
    queries: torch.Tensor  # [B, T, H] the queries each hop used (after Eq. 7)
    loss: torch.Tensor | None = None
    losses: dict[str, torch.Tensor] = field(default_factory=dict)
    tokens: int = 0  # real tokens the backbone read (queries, paragraphs unless precomputed, reader)


@dataclass
class ReaderOutput:
    start_logits: torch.Tensor  # [C, L] float32, MASKED outside the context
    end_logits: torch.Tensor  # [C, L]
    answer_type_logits: torch.Tensor  # [C, 3] over ANSWER_TYPES
    pair_logits: torch.Tensor  # [C] the reranker's score of each combination
    contexts: list[str]  # the context text each offset indexes into
    offsets: torch.Tensor  # int64 [C, L, 2] character spans in the context (question tokens: in the question)
    context_mask: torch.Tensor  # bool [C, L]
    tokens: int  # real tokens read


class DocHopper(nn.Module):
    def __init__(self, cfg: DocHopperConfig, backbone: nn.Module, tokenizer=None):
        super().__init__()
        self.cfg = cfg
        self.backbone = backbone
        self.tokenizer = tokenizer
        if getattr(backbone, "pooler", None) is not None:
            backbone.pooler = None  # unused: DDP refuses parameters without gradients
        config = backbone.config
        hidden, init_range = config.hidden_size, getattr(config, "initializer_range", 0.02)
        self.scale = 1 / math.sqrt(hidden) if cfg.scale_scores else 1.0
        self.mix = nn.Linear(2 * hidden, hidden)  # W_q of Eq. 4-5
        self.mix_vector = nn.Parameter(torch.empty(hidden))  # v of Eq. 6
        self.reader_span = nn.Linear(hidden, 2)
        self.reader_type = nn.Linear(hidden, len(ANSWER_TYPES))
        self.reader_pair = nn.Linear(hidden, 1)
        for layer in (self.mix, self.reader_span, self.reader_type, self.reader_pair):
            nn.init.normal_(layer.weight, std=init_range)
            nn.init.zeros_(layer.bias)
        nn.init.normal_(self.mix_vector, std=init_range)
        self._use_token_types = getattr(config, "type_vocab_size", 0) > 1
        self.evidences = evidence_hops(cfg.hops)
        self.corpus_cache = CorpusCache()  # paragraph embeddings for these weights (`predict_rows`)

    # --- construction and persistence ---------------------------------------------------------------

    @classmethod
    def from_backbone(cls, cfg: DocHopperConfig) -> DocHopper:
        """Pretrained backbone and tokenizer from `cfg.backbone`; the hop and reader parameters random."""
        from transformers import AutoModel

        from xh.model.xh import load_tokenizer

        try:
            backbone = AutoModel.from_pretrained(
                cfg.backbone, attn_implementation=cfg.attn_implementation, dtype=torch.float32
            )
        except OSError as e:
            raise ValueError(f"backbone {cfg.backbone!r} could not be loaded: {str(e).splitlines()[0]}") from None
        return cls(cfg, backbone, load_tokenizer(cfg.backbone))

    def save_pretrained(self, directory: str | Path) -> Path:
        """model.safetensors, dochopper_config.json, the backbone's config.json and the tokenizer."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        state = {name: t.detach().to("cpu", copy=True).contiguous() for name, t in self.state_dict().items()}
        save_file(state, str(directory / WEIGHTS_FILE), metadata={"format": FORMAT})
        self.backbone.config.save_pretrained(directory)
        if self.tokenizer is not None:
            self.tokenizer.save_pretrained(directory)
        meta = {"format": FORMAT, "version": FORMAT_VERSION, "model": asdict(self.cfg)}
        (directory / CONFIG_FILE).write_text(json.dumps(meta, indent=2) + "\n")
        return directory

    @classmethod
    def from_pretrained(cls, directory: str | Path, device: str | torch.device = "cpu") -> DocHopper:
        """Load what `save_pretrained` wrote, in eval mode; only JSON and safetensors are read."""
        from transformers import AutoConfig, AutoModel

        from xh.model.xh import load_tokenizer

        directory = Path(directory)
        meta_path = directory / CONFIG_FILE
        if not meta_path.is_file():
            raise ValueError(f"{directory} is not a saved DocHopper model (no {CONFIG_FILE})")
        meta = json.loads(meta_path.read_text())
        if meta.get("format") != FORMAT or meta.get("version") != FORMAT_VERSION:
            raise ValueError(f"{meta_path}: unsupported format {meta.get('format')!r} version {meta.get('version')!r}")
        cfg = DocHopperConfig(**meta["model"])
        backbone = AutoModel.from_config(
            AutoConfig.from_pretrained(directory), attn_implementation=cfg.attn_implementation
        )
        tokenizer = load_tokenizer(directory) if (directory / "tokenizer_config.json").is_file() else None
        model = cls(cfg, backbone, tokenizer)
        model.load_state_dict(load_file(str(directory / WEIGHTS_FILE)), strict=True)
        return model.to(device).eval()

    # --- tokenisation -------------------------------------------------------------------------------

    def paragraph_tokens(self, title: str, sentences: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """`[CLS] title [SEP] paragraph [SEP]` (no question) and each token's sentence (-1 elsewhere);
        the paragraph loses its end when it is longer than max_paragraph_tokens."""
        tok = self.tokenizer
        paragraph = "".join(sentences)
        enc = tok(paragraph, add_special_tokens=False, return_offsets_mapping=True, verbose=False)
        head = [tok.cls_token_id]
        if self.cfg.include_title:
            head += tok(title, add_special_tokens=False)["input_ids"][:MAX_TITLE_TOKENS] + [tok.sep_token_id]
        room = max(0, self.cfg.max_paragraph_tokens - len(head) - 1)
        ids, offsets = enc["input_ids"][:room], enc["offset_mapping"][:room]
        starts = list(np.cumsum([0, *(len(s) for s in sentences)])[:-1])
        sentence_of = [bisect.bisect_right(starts, start) - 1 for start, _ in offsets]
        input_ids = np.array([*head, *ids, tok.sep_token_id], np.int64)
        sentence_ids = np.array([-1] * len(head) + sentence_of + [-1], np.int64)
        return input_ids, sentence_ids

    def query_tokens(self, question: str) -> tuple[np.ndarray, np.ndarray]:
        """Eq. 2's question paragraph {q_0, q_null, ..}: `[CLS] question [SEP] [MASK]^(T-1) [SEP]`;
        q_0 is read at [CLS], q_t at the t-th mask (each attends to the whole question)."""
        tok = self.tokenizer
        ids = tok(question, add_special_tokens=False)["input_ids"][: self.cfg.max_question_tokens]
        dummies = len(self.cfg.hops) - 1
        mask_id = tok.mask_token_id if tok.mask_token_id is not None else tok.unk_token_id
        query = [tok.cls_token_id, *ids, tok.sep_token_id, *[mask_id] * dummies, tok.sep_token_id]
        positions = [0, *range(len(ids) + 2, len(ids) + 2 + dummies)]
        return np.array(query, np.int64), np.array(positions, np.int64)

    def prepare(self, rows: Sequence[dict]) -> list[DocHopperExample]:
        """`graphs` table rows (HotpotQA) -> examples; the edges are not used."""
        examples = []
        for row in rows:
            nodes = row["nodes"]
            if not nodes:
                raise ValueError(f"graph {row['qid']!r} has no nodes")
            tokens = [self.paragraph_tokens(n["title"], n["sentences"] or []) for n in nodes]
            query_ids, positions = self.query_tokens(row["question"])
            has_facts = row.get("supporting_facts") is not None
            targets = hop_targets(row, self.cfg.hops) if has_facts else [(-1, [])] * len(self.cfg.hops)
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

    def collate(
        self, examples: Sequence[DocHopperExample], corpus: dict[str, torch.Tensor] | None = None
    ) -> DocHopperBatch:
        """Stack examples. With `corpus` (doc_id -> [S_i, H] from `encode_corpus`) the batch carries the
        precomputed sentence embeddings; without, the paragraphs' tokens (encoded in `forward`)."""
        b, t = len(examples), len(self.cfg.hops)
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
                if self.cfg.hops[hop] == "paragraph":
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
            hidden = self.backbone.config.hidden_size
            embeddings = torch.zeros(b, p, s, hidden)
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

    # --- encoders -----------------------------------------------------------------------------------

    def _pool_sentences(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, sentence_ids: torch.Tensor, slots: int
    ) -> torch.Tensor:
        """Backbone over paragraphs alone; [R, L] -> sentence embeddings [R, slots, H] (0 for absent ones)."""
        hidden = self.backbone(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        r = hidden.shape[0]
        in_sentence = sentence_ids >= 0
        index = (torch.arange(r, device=hidden.device).unsqueeze(1) * slots + sentence_ids)[in_sentence]
        if self.cfg.sentence_pooling == "mean":
            sums = hidden.new_zeros(r * slots, hidden.shape[-1]).index_add_(0, index, hidden[in_sentence])
            counts = torch.bincount(index, minlength=r * slots).clamp(min=1).unsqueeze(-1)
            return (sums / counts).view(r, slots, -1)
        # first token of each sentence: the lowest position whose sentence id is that sentence
        positions = torch.arange(hidden.shape[1], device=hidden.device).expand_as(sentence_ids)[in_sentence]
        first = torch.full((r * slots,), hidden.shape[1], device=hidden.device).scatter_reduce(
            0, index, positions, "amin"
        )
        rows = torch.arange(r * slots, device=hidden.device) // slots
        picked = hidden[rows, first.clamp(max=hidden.shape[1] - 1)]
        return torch.where((first < hidden.shape[1]).unsqueeze(-1), picked, 0.0).view(r, slots, -1)

    def encode_sentences(self, batch: DocHopperBatch) -> torch.Tensor:
        """[B, P, S, H]: precomputed when the batch has them, else the backbone over each paragraph alone."""
        if batch.sentence_embeddings is not None:
            return batch.sentence_embeddings
        b, p, s = batch.sentence_mask.shape
        pooled = self._pool_sentences(batch.paragraph_ids, batch.paragraph_mask, batch.paragraph_sentence_ids, s)
        out = pooled.new_zeros(b * p, s, pooled.shape[-1]).index_copy(0, batch.paragraph_slot, pooled)
        return out.view(b, p, s, -1)

    @torch.no_grad()
    def encode_corpus(
        self, paragraphs: Sequence[tuple[str, Sequence[str]]], batch_size: int = 16
    ) -> list[torch.Tensor]:
        """The precomputable part: (title, sentences) -> [S_i, H] sentence embeddings each (CPU, float32)."""
        was_training = self.training
        self.eval()
        device = next(self.parameters()).device
        out: list[torch.Tensor] = []
        try:
            for start in range(0, len(paragraphs), batch_size):
                tokens = [
                    self.paragraph_tokens(title, sentences)
                    for title, sentences in paragraphs[start : start + batch_size]
                ]
                counts = [int(sids.max()) + 1 if (sids >= 0).any() else 0 for _, sids in tokens]
                length, slots = max(len(ids) for ids, _ in tokens), max(1, max(counts))
                ids = torch.zeros(len(tokens), length, dtype=torch.long)
                mask = torch.zeros_like(ids)
                sids = torch.full_like(ids, -1)
                for r, (i, s) in enumerate(tokens):
                    ids[r, : len(i)], mask[r, : len(i)], sids[r, : len(s)] = torch.from_numpy(i), 1, torch.from_numpy(s)
                pooled = self._pool_sentences(ids.to(device), mask.to(device), sids.to(device), slots).float().cpu()
                out.extend(pooled[r, :count].clone() for r, count in enumerate(counts))
        finally:
            self.train(was_training)
        return out

    def encode_queries(self, batch: DocHopperBatch) -> torch.Tensor:
        """[B, T, H]: q_0 .. q_{T-1} (Eq. 2)."""
        hidden = self.backbone(input_ids=batch.query_ids, attention_mask=batch.query_mask).last_hidden_state
        return hidden.gather(1, batch.hop_positions.unsqueeze(-1).expand(-1, -1, hidden.shape[-1]))

    # --- iterative attention ------------------------------------------------------------------------

    def attend(
        self, queries: torch.Tensor, sentences: torch.Tensor, sentence_mask: torch.Tensor, paragraph_valid: torch.Tensor
    ):
        """The T hops: returns (table scores [B, T, P, 1 + S], the queries used [B, T, H])."""
        valid = torch.cat([paragraph_valid.unsqueeze(-1), sentence_mask], dim=-1)
        residual = None
        all_scores, used = [], []
        for t in range(queries.shape[1]):
            q = queries[:, t] if residual is None else queries[:, t] + residual  # Eq. 7
            paragraphs, alpha = paragraph_embeddings(q, sentences, sentence_mask, self.scale)  # Eq. 3
            paragraph_scores = torch.einsum("bh,bph->bp", q, paragraphs) * self.scale
            sentence_scores = torch.einsum("bh,bpsh->bps", q, sentences) * self.scale
            scores = torch.cat([paragraph_scores.unsqueeze(-1), sentence_scores], dim=-1).masked_fill(~valid, MASKED)
            all_scores.append(scores)
            used.append(q)
            if self.cfg.query_update and t + 1 < queries.shape[1]:
                a = table_log_probs(scores, valid).exp()  # soft attention over the whole table
                paragraph_mix = mix_paragraphs(self.mix, self.mix_vector, q, sentences, alpha, sentence_mask)
                sentence_mix = mix_sentences(self.mix, q, sentences)
                residual = torch.einsum("bp,bph->bh", a[..., 0], paragraph_mix) + torch.einsum(
                    "bps,bpsh->bh", a[..., 1:], sentence_mix
                )  # q̃_t
        return torch.stack(all_scores, dim=1), torch.stack(used, dim=1)

    def evidence_scores(self, table_scores: torch.Tensor, sentence_mask: torch.Tensor) -> torch.Tensor:
        """Eq. 8 per evidence: q_sent · s^i_j + λ_e q_par · p_i -> [B, E, P, S] (masked)."""
        out = []
        for (paragraph_hop, sentence_hop), lam in zip(self.evidences, self.cfg.evidence_lambdas):
            score = table_scores[:, sentence_hop, :, 1:]
            if paragraph_hop is not None and lam:
                score = score + lam * table_scores[:, paragraph_hop, :, :1]
            out.append(score.masked_fill(~sentence_mask, MASKED))
        return torch.stack(out, dim=1)

    def retrieve(self, batch: DocHopperBatch) -> DocHopperOutput:
        sentences = self.encode_sentences(batch)
        queries = self.encode_queries(batch)
        table, used = self.attend(queries, sentences.to(queries.dtype), batch.sentence_mask, batch.paragraph_valid)
        tokens = int(batch.query_mask.sum()) + (
            int(batch.paragraph_mask.sum()) if batch.paragraph_mask is not None else 0
        )
        evidence = self.evidence_scores(table, batch.sentence_mask)
        return DocHopperOutput(table_scores=table, evidence_scores=evidence, queries=used, tokens=tokens)

    # --- combinations and the reader ----------------------------------------------------------------

    def combinations(self, evidence_scores: torch.Tensor, b: int) -> list[tuple[float, tuple]]:
        """(Eq. 8 score sum, ((paragraph, sentence) per evidence)) of the top_k x top_k combinations, best first;
        combinations with two sentences of one paragraph are skipped unless nothing else is left."""
        per_evidence = []
        for e in range(evidence_scores.shape[1]):
            scores = evidence_scores[b, e].detach().float().cpu()
            s = scores.shape[1]
            k = min(self.cfg.top_k, int((scores > MASKED / 2).sum()))
            top = torch.topk(scores.flatten(), max(k, 1))
            per_evidence.append([(float(v), (int(i) // s, int(i) % s)) for v, i in zip(top.values, top.indices)])
        combos = [(sum(v for v, _ in pick), tuple(c for _, c in pick)) for pick in itertools.product(*per_evidence)]
        distinct = [c for c in combos if len({p for p, _ in c[1]}) == len(c[1])]
        return sorted(distinct or combos, key=lambda c: -c[0])

    def gold_combination(self, example: DocHopperExample) -> tuple | None:
        """Per evidence, the supporting sentence that holds the answer, else the first; None when unknown."""
        picks = []
        for _, sentence_hop in self.evidences:
            node, sentences = example.hop_targets[sentence_hop]
            sentences = [j for j in sentences if node >= 0 and j < example.num_sentences[node]]
            if not sentences:
                return None
            with_answer = [
                j for j in sentences if example.answer and answer_char_spans(example.sentences[node][j], example.answer)
            ]
            picks.append((node, (with_answer or sentences)[0]))
        return tuple(picks)

    def read(self, items: list[tuple[DocHopperExample, tuple]]) -> ReaderOutput:
        """The reader over (example, combination) pairs: `[CLS] question [SEP] title: sentence ... [SEP]`."""
        questions = [e.question for e, _ in items]
        contexts = [_reader_context([(e.titles[p], e.sentences[p][j]) for p, j in combo]) for e, combo in items]
        device = next(self.parameters()).device
        enc = self.tokenizer(
            questions,
            contexts,
            truncation="only_second",
            max_length=self.cfg.max_reader_tokens,
            padding=True,
            return_offsets_mapping=True,
            return_token_type_ids=True,
            return_tensors="pt",
        )
        in_context = torch.tensor([[s == 1 for s in enc.sequence_ids(i)] for i in range(len(items))], dtype=torch.bool)
        hidden = self.backbone(
            input_ids=enc["input_ids"].to(device),
            attention_mask=enc["attention_mask"].to(device),
            token_type_ids=enc["token_type_ids"].to(device) if self._use_token_types else None,
        ).last_hidden_state
        context_mask = in_context.to(device)
        start, end = self.reader_span(hidden).float().unbind(-1)
        cls = hidden[:, 0]
        return ReaderOutput(
            start_logits=start.masked_fill(~context_mask, MASKED),
            end_logits=end.masked_fill(~context_mask, MASKED),
            answer_type_logits=self.reader_type(cls).float(),
            pair_logits=self.reader_pair(cls).squeeze(-1).float(),
            contexts=contexts,
            offsets=enc["offset_mapping"],
            context_mask=context_mask,
            tokens=int(enc["attention_mask"].sum()),
        )

    def _reader_losses(
        self, batch: DocHopperBatch, out: DocHopperOutput
    ) -> tuple[dict[str, torch.Tensor], ReaderOutput | None]:
        """The reader reads each question's gold combination and its `reader_negatives` best wrong ones:
        rerank = cross-entropy of the gold among them; span and answer type on the gold one."""
        items, groups, types = [], [], []  # groups: (first row, rows) per question
        for b, example in enumerate(batch.examples):
            gold = self.gold_combination(example)
            if gold is None:
                continue
            negatives = [c for _, c in self.combinations(out.evidence_scores, b) if c != gold]
            group = [gold, *negatives[: self.cfg.reader_negatives]]
            groups.append((len(items), len(group)))
            items.extend((example, combo) for combo in group)
            types.append(example.answer_type)
        if not items:
            return {}, None
        read = self.read(items)
        device = read.pair_logits.device
        losses: dict[str, torch.Tensor] = {}
        rerank = [
            F.cross_entropy(read.pair_logits[i : i + n].unsqueeze(0), torch.zeros(1, dtype=torch.long, device=device))
            for i, n in groups
            if n > 1
        ]
        if rerank:
            losses["rerank"] = torch.stack(rerank).mean()
        gold_rows = torch.tensor([i for i, _ in groups], device=device)
        answer_types = torch.tensor(types, device=device)
        if (answer_types >= 0).any():
            known = answer_types >= 0
            losses["answer_type"] = F.cross_entropy(read.answer_type_logits[gold_rows[known]], answer_types[known])
        span_rows, starts, ends = [], [], []
        for (i, _), answer_type in zip(groups, types):
            answer = items[i][0].answer
            found = (
                answer_char_spans(read.contexts[i], answer)
                if answer_type == ANSWER_TYPES.index("span") and answer
                else []
            )
            if not found:
                continue  # the answer is not in the gold sentences (or was truncated away)
            first = found[0]
            tokens = [
                t
                for t in range(read.offsets.shape[1])
                if read.context_mask[i, t]
                and read.offsets[i, t, 1] > first["start"]
                and read.offsets[i, t, 0] < first["end"]
            ]
            if tokens:
                span_rows.append(i)
                starts.append(tokens[0])
                ends.append(tokens[-1])
        if span_rows:
            rows = torch.tensor(span_rows, device=device)
            losses["span"] = (
                F.cross_entropy(read.start_logits[rows], torch.tensor(starts, device=device))
                + F.cross_entropy(read.end_logits[rows], torch.tensor(ends, device=device))
            ) / 2
        return losses, read

    # --- forward and predict ------------------------------------------------------------------------

    def forward(self, batch: DocHopperBatch) -> DocHopperOutput:
        """Hops, hop losses (Σ_t l_t over the hops with targets) and the reader's losses."""
        out = self.retrieve(batch)
        valid = torch.cat([batch.paragraph_valid.unsqueeze(-1), batch.sentence_mask], dim=-1)
        losses: dict[str, torch.Tensor] = {}
        hop_terms = []
        for t in range(out.table_scores.shape[1]):
            rows = batch.has_target[:, t]
            if rows.any():
                log_probs = table_log_probs(out.table_scores[rows, t], valid[rows])
                hop_terms.append(hop_loss(log_probs, batch.targets[rows, t]))
        if hop_terms:
            losses["hop"] = torch.stack(hop_terms).sum()
        reader_losses, read = self._reader_losses(batch, out)
        losses.update(reader_losses)
        if read is not None:
            out.tokens += read.tokens
        if losses:
            weights = {
                "hop": self.cfg.hop_loss_weight,
                "rerank": self.cfg.rerank_loss_weight,
                "span": self.cfg.span_loss_weight,
                "answer_type": self.cfg.answer_type_loss_weight,
            }
            out.loss = sum(weights[name] * value for name, value in losses.items())
            if read is not None:  # zero-weighted: every reader parameter stays in the autograd graph (DDP)
                out.loss = out.loss + 0.0 * sum(
                    t.sum() for t in (read.start_logits, read.end_logits, read.answer_type_logits, read.pair_logits)
                )
        out.losses = losses
        return out

    @torch.no_grad()
    def predict(
        self, examples: Sequence[DocHopperExample], corpus: dict[str, torch.Tensor] | None = None, batch_size: int = 8
    ) -> list[dict]:
        """One dict per example, in order: {"qid", "answer", "answer_type", "supporting_facts": [[title,
        sentence]], "evidence": [[doc_id, sentence]], "score"}. With `corpus` (doc_id -> `encode_corpus`
        output) no paragraph is encoded here."""
        was_training = self.training
        self.eval()
        device = next(self.parameters()).device
        predictions = []
        try:
            for first in range(0, len(examples), batch_size):
                chunk = examples[first : first + batch_size]
                out = self.retrieve(self.collate(chunk, corpus).to(device))
                candidates = [self.combinations(out.evidence_scores, b) for b in range(len(chunk))]
                if not self.cfg.rerank:
                    candidates = [c[:1] for c in candidates]  # "direct": the best Eq. 8 combination
                read = self.read([(e, combo) for e, combos in zip(chunk, candidates) for _, combo in combos])
                row = 0
                for example, combos in zip(chunk, candidates):
                    scores = torch.tensor([score for score, _ in combos])
                    if self.cfg.rerank:
                        scores = scores + read.pair_logits[row : row + len(combos)].cpu()
                    best = int(scores.argmax())
                    predictions.append(self._answer(example, combos[best][1], float(scores[best]), read, row + best))
                    row += len(combos)
        finally:
            self.train(was_training)
        return predictions

    def _answer(self, example: DocHopperExample, combo: tuple, score: float, read: ReaderOutput, row: int) -> dict:
        answer_type = ANSWER_TYPES[int(read.answer_type_logits[row].argmax())]
        if answer_type != "span" and example.question_type == QUESTION_TYPES.index("bridge"):
            answer_type = "span"  # a bridge question's answer is never yes / no (as XH's decoding)
        piece = len(combo) - 1  # the evidence the answer comes from: the last (§4.2) unless the span says otherwise
        if answer_type == "span":
            mask = read.context_mask[row].cpu()
            span = best_span(read.start_logits[row].cpu(), read.end_logits[row].cpu(), mask, self.cfg.max_answer_tokens)
            offsets = read.offsets[row]
            answer = "" if span is None else read.contexts[row][int(offsets[span[0], 0]) : int(offsets[span[1], 1])]
            if span is not None:
                piece = _context_piece(
                    [(example.titles[p], example.sentences[p][j]) for p, j in combo], int(offsets[span[0], 0])
                )
        else:
            answer = answer_type
        node = combo[piece][0]
        return {
            "qid": example.qid,
            "answer": answer,
            "answer_doc_id": example.doc_ids[node],
            "answer_title": example.titles[node],
            "answer_node": node,
            "node_score": score,
            "answer_type": answer_type,
            "supporting_facts": [[example.titles[p], j] for p, j in combo],
            "evidence": [[example.doc_ids[p], j] for p, j in combo],
            "score": score,
        }

    # --- the project's graph rows in, its predictions out (`xh.inference.predict_graphs`) -------------

    def train(self, mode: bool = True) -> DocHopper:
        if mode:  # the weights are about to change: cached corpus embeddings would be stale
            self.corpus_cache.clear()
        return super().train(mode)

    def predict_rows(self, rows: Sequence[dict], batch_size: int = 8) -> list[dict]:
        """`graphs` rows -> predictions with XH's keys (`xh.model.decode`), in order. Paragraph embeddings
        come from `corpus_cache`; the paragraphs it does not hold are encoded (once) and added to it."""
        was_training = self.training
        self.eval()  # from here to the end: the cache must outlive the encoders' train/eval switches
        try:
            examples = self.prepare(rows)
            paragraphs = {
                (d, title, tuple(sentences)): None
                for e in examples
                for d, title, sentences in zip(e.doc_ids, e.titles, e.sentences)
            }
            stored = self.corpus_cache.lookup(self, [(title, list(sentences)) for _, title, sentences in paragraphs])
            corpus = {d: embedding for (d, _, _), embedding in zip(paragraphs, stored)}
            self.corpus_cache.flush()
            predictions = self.predict(examples, corpus, batch_size)
        finally:
            self.train(was_training)  # back to training empties the cache: the weights change next
        return [{k: p[k] for k in PREDICTION_KEYS} for p in predictions]


PREDICTION_KEYS = (
    "qid",
    "answer",
    "answer_doc_id",
    "answer_title",
    "answer_node",
    "node_score",
    "answer_type",
    "supporting_facts",
)


def _context_piece(picks: Sequence[tuple[str, str]], char: int) -> int:
    """Which (title, sentence) of `_reader_context(picks)` holds character `char`."""
    starts = list(itertools.accumulate(len(f"{title}: {sentence.strip()}") + 1 for title, sentence in picks))
    return min(bisect.bisect_right(starts, char), len(picks) - 1)


# --- precomputed corpus embeddings --------------------------------------------------------------------


class CorpusCache:
    """Sentence embeddings of paragraphs, by content (a hash of title and sentences), for one model's weights.

    In memory by default (`DocHopper.corpus_cache`; emptied when the model goes back to training);
    with `folder` (local or s3://) also on storage: every `flush` writes the entries added since as one
    more safetensors file there, and a new cache on the same folder starts with all of them. Batch
    scoring gives each model version and corpus snapshot a folder of its own (`workflows.score`), so a
    paragraph is encoded once per snapshot, whichever actor or run meets it first.

        cache = CorpusCache("runs/x/_cache/xh-dochopper-v3/<snapshot>")
        model.corpus_cache = cache
        model.predict_rows(rows)            # encodes what the cache lacks, then writes it (flush)
    """

    def __init__(self, folder: str | None = None, s3=None):
        self.folder, self.s3 = folder, s3
        self.entries: dict[str, torch.Tensor] = {}
        self.new: dict[str, torch.Tensor] = {}
        self.hits = self.encoded = 0
        if folder is not None:
            self._load()

    @staticmethod
    def key(title: str, sentences: Sequence[str]) -> str:
        import hashlib

        return hashlib.sha256(json.dumps([title, list(sentences)]).encode()).hexdigest()

    def __len__(self) -> int:
        return len(self.entries)

    def clear(self) -> None:
        self.entries.clear()
        self.new.clear()

    def lookup(self, model: DocHopper, paragraphs: Sequence[tuple[str, Sequence[str]]]) -> list[torch.Tensor]:
        """[S_i, H] per (title, sentences): stored ones as they are, the others encoded by `model` and stored."""
        keys = [self.key(title, sentences) for title, sentences in paragraphs]
        missing = {k: p for k, p in zip(keys, paragraphs) if k not in self.entries}
        if missing:
            for k, embedding in zip(missing, model.encode_corpus(list(missing.values()))):
                self.entries[k] = self.new[k] = embedding
        self.hits += len(keys) - len(missing)
        self.encoded += len(missing)
        return [self.entries[k] for k in keys]

    def flush(self) -> None:
        """Write the entries added since the last flush as one more file of the folder (none: nothing)."""
        if self.folder is None or not self.new:
            self.new.clear()
            return
        import uuid

        from safetensors.torch import save

        from xh.storage import join, open_output

        with open_output(join(self.folder, f"part-{uuid.uuid4().hex}.safetensors"), self.s3) as out:
            out.write(save({k: t.contiguous() for k, t in self.new.items()}))
        self.new.clear()

    def _load(self) -> None:
        from safetensors.torch import load

        from xh.storage import list_files, open_input

        try:
            files = list_files(self.folder, self.s3, suffix=".safetensors")
        except FileNotFoundError:  # nothing cached for this snapshot yet
            return
        for uri in files:
            with open_input(uri, self.s3) as f:
                self.entries.update(load(f.read()))
