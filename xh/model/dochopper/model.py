"""`DocHopper`, the module: its parameters (the shared backbone, Eq. 4-6's W_q and v, the reader's head),
saving and loading, and the steps of a forward pass, each a short call into the package's modules."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from xh.graph.encoded import ANSWER_TYPES
from xh.model.dochopper import corpus, equations, inference, reader
from xh.model.dochopper.batch import DocHopperBatch, DocHopperExample, collate
from xh.model.dochopper.config import CONFIG_FILE, FORMAT, FORMAT_VERSION, WEIGHTS_FILE, DocHopperConfig, evidence_hops
from xh.model.dochopper.corpus import CorpusCache
from xh.model.dochopper.examples import paragraph_tokens, prepare, query_tokens
from xh.model.dochopper.reader import ReaderOutput, reader_losses


@dataclass
class DocHopperOutput:
    table_scores: torch.Tensor  # [B, T, P, 1 + S] q_t · c_m (masked), entry 0 the paragraph
    evidence_scores: torch.Tensor  # [B, E, P, S] Eq. 8 per evidence (masked)
    queries: torch.Tensor  # [B, T, H] the queries each hop used (after Eq. 7)
    loss: torch.Tensor | None = None
    losses: dict[str, torch.Tensor] = field(default_factory=dict)
    tokens: int = 0  # real tokens the backbone read (queries, paragraphs unless precomputed, reader)


class DocHopper(nn.Module):
    architecture = "dochopper"  # xh.model.variants

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

    # --- tokenisation and batches (.examples, .batch) -------------------------------

    def paragraph_tokens(self, title: str, sentences: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        return paragraph_tokens(self.tokenizer, self.cfg, title, sentences)

    def query_tokens(self, question: str) -> tuple[np.ndarray, np.ndarray]:
        return query_tokens(self.tokenizer, self.cfg, question)

    def prepare(self, rows: Sequence[dict]) -> list[DocHopperExample]:
        """`graphs` table rows (HotpotQA) -> examples; the edges are not used."""
        return prepare(self.tokenizer, self.cfg, rows)

    def collate(
        self, examples: Sequence[DocHopperExample], corpus: dict[str, torch.Tensor] | None = None
    ) -> DocHopperBatch:
        """Stack examples. With `corpus` (doc_id -> [S_i, H] from `encode_corpus`) the batch carries the
        precomputed sentence embeddings; without, the paragraphs' tokens (encoded in `forward`)."""
        return collate(self.cfg, examples, self.backbone.config.hidden_size, corpus)

    # --- encoders (xh.model.dochopper.corpus) ---------------------------------------------------------

    def encode_paragraphs(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, sentence_ids: torch.Tensor, slots: int
    ) -> torch.Tensor:
        """Backbone over paragraphs alone; [R, L] -> sentence embeddings [R, slots, H] (0 for absent ones)."""
        hidden = self.backbone(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        return corpus.pool_sentences(hidden, sentence_ids, slots, self.cfg.sentence_pooling)

    def encode_sentences(self, batch: DocHopperBatch) -> torch.Tensor:
        """[B, P, S, H]: precomputed when the batch has them, else the backbone over each paragraph alone."""
        if batch.sentence_embeddings is not None:
            return batch.sentence_embeddings
        b, p, s = batch.sentence_mask.shape
        pooled = self.encode_paragraphs(batch.paragraph_ids, batch.paragraph_mask, batch.paragraph_sentence_ids, s)
        out = pooled.new_zeros(b * p, s, pooled.shape[-1]).index_copy(0, batch.paragraph_slot, pooled)
        return out.view(b, p, s, -1)

    def encode_corpus(
        self, paragraphs: Sequence[tuple[str, Sequence[str]]], batch_size: int = 16
    ) -> list[torch.Tensor]:
        """The precomputable part: (title, sentences) -> [S_i, H] sentence embeddings each (CPU, float32)."""
        return corpus.encode_corpus(self, paragraphs, batch_size)

    def encode_queries(self, batch: DocHopperBatch) -> torch.Tensor:
        """[B, T, H]: q_0 .. q_{T-1} (Eq. 2)."""
        hidden = self.backbone(input_ids=batch.query_ids, attention_mask=batch.query_mask).last_hidden_state
        return hidden.gather(1, batch.hop_positions.unsqueeze(-1).expand(-1, -1, hidden.shape[-1]))

    # --- the hops (xh.model.dochopper.equations) ------------------------------------------------------

    def attend(
        self, queries: torch.Tensor, sentences: torch.Tensor, sentence_mask: torch.Tensor, paragraph_valid: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The T hops: returns (table scores [B, T, P, 1 + S], the queries used [B, T, H])."""
        return equations.attend(
            queries,
            sentences,
            sentence_mask,
            paragraph_valid,
            self.mix,
            self.mix_vector,
            self.scale,
            self.cfg.query_update,
        )

    def evidence_scores(self, table_scores: torch.Tensor, sentence_mask: torch.Tensor) -> torch.Tensor:
        """Eq. 8 per evidence: q_sent · s^i_j + λ_e q_par · p_i -> [B, E, P, S] (masked)."""
        return equations.evidence_scores(table_scores, sentence_mask, self.evidences, self.cfg.evidence_lambdas)

    def retrieve(self, batch: DocHopperBatch) -> DocHopperOutput:
        sentences = self.encode_sentences(batch)
        queries = self.encode_queries(batch)
        table, used = self.attend(queries, sentences.to(queries.dtype), batch.sentence_mask, batch.paragraph_valid)
        tokens = int(batch.query_mask.sum()) + (
            int(batch.paragraph_mask.sum()) if batch.paragraph_mask is not None else 0
        )
        evidence = self.evidence_scores(table, batch.sentence_mask)
        return DocHopperOutput(table_scores=table, evidence_scores=evidence, queries=used, tokens=tokens)

    # --- combinations and the reader (xh.model.dochopper.reader) --------------------------------------

    def combinations(self, evidence_scores: torch.Tensor, b: int) -> list[tuple[float, tuple]]:
        return reader.combinations(evidence_scores, b, self.cfg.top_k)

    def gold_combination(self, example: DocHopperExample) -> tuple | None:
        return reader.gold_combination(example, self.evidences)

    def read(self, items: list[tuple[DocHopperExample, tuple]]) -> ReaderOutput:
        return reader.read(self, items)

    # --- forward and predict --------------------------------------------------------------------------

    def forward(self, batch: DocHopperBatch) -> DocHopperOutput:
        """Hops, hop losses (Σ_t l_t over the hops with targets) and the reader's losses."""
        out = self.retrieve(batch)
        valid = torch.cat([batch.paragraph_valid.unsqueeze(-1), batch.sentence_mask], dim=-1)
        losses: dict[str, torch.Tensor] = {}
        hop_terms = []
        for t in range(out.table_scores.shape[1]):
            rows = batch.has_target[:, t]
            if rows.any():
                log_probs = equations.table_log_probs(out.table_scores[rows, t], valid[rows])
                hop_terms.append(equations.hop_loss(log_probs, batch.targets[rows, t]))
        if hop_terms:
            losses["hop"] = torch.stack(hop_terms).sum()
        from_reader, read = reader_losses(self, batch, out.evidence_scores)
        losses.update(from_reader)
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

    def predict(
        self, examples: Sequence[DocHopperExample], corpus: dict[str, torch.Tensor] | None = None, batch_size: int = 8
    ) -> list[dict]:
        """One dict per example, in order (`xh.model.dochopper.inference.predict`)."""
        return inference.predict(self, examples, corpus, batch_size)

    def train(self, mode: bool = True) -> DocHopper:
        if mode:  # the weights are about to change: cached corpus embeddings would be stale
            self.corpus_cache.clear()
        return super().train(mode)

    def predict_rows(self, rows: Sequence[dict], batch_size: int = 8) -> list[dict]:
        """`graphs` rows -> predictions with XH's keys, in order (`xh.model.dochopper.inference.predict_rows`)."""
        return inference.predict_rows(self, rows, batch_size)
