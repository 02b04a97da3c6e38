"""DocHopper's precomputable half: sentence embeddings of paragraphs read alone (`encode_corpus`), and
`CorpusCache`, which keeps them by content for one model's weights."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from xh.storage.store import Location


def pool_sentences(hidden: torch.Tensor, sentence_ids: torch.Tensor, slots: int, pooling: str = "mean") -> torch.Tensor:
    """Token states of paragraphs [R, L, H] -> sentence embeddings [R, slots, H] (0 for absent ones):
    the mean of each sentence's tokens, or (`first`) its first token."""
    r = hidden.shape[0]
    in_sentence = sentence_ids >= 0
    index = (torch.arange(r, device=hidden.device).unsqueeze(1) * slots + sentence_ids)[in_sentence]
    if pooling == "mean":
        sums = hidden.new_zeros(r * slots, hidden.shape[-1]).index_add_(0, index, hidden[in_sentence])
        counts = torch.bincount(index, minlength=r * slots).clamp(min=1).unsqueeze(-1)
        return (sums / counts).view(r, slots, -1)
    # first token of each sentence: the lowest position whose sentence id is that sentence
    positions = torch.arange(hidden.shape[1], device=hidden.device).expand_as(sentence_ids)[in_sentence]
    first = torch.full((r * slots,), hidden.shape[1], device=hidden.device).scatter_reduce(0, index, positions, "amin")
    rows = torch.arange(r * slots, device=hidden.device) // slots
    picked = hidden[rows, first.clamp(max=hidden.shape[1] - 1)]
    return torch.where((first < hidden.shape[1]).unsqueeze(-1), picked, 0.0).view(r, slots, -1)


@torch.no_grad()
def encode_corpus(model, paragraphs: Sequence[tuple[str, Sequence[str]]], batch_size: int = 16) -> list[torch.Tensor]:
    """The precomputable part: (title, sentences) -> [S_i, H] sentence embeddings each (CPU, float32)."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    out: list[torch.Tensor] = []
    try:
        for start in range(0, len(paragraphs), batch_size):
            tokens = [
                model.paragraph_tokens(title, sentences) for title, sentences in paragraphs[start : start + batch_size]
            ]
            counts = [int(sids.max()) + 1 if (sids >= 0).any() else 0 for _, sids in tokens]
            length, slots = max(len(ids) for ids, _ in tokens), max(1, max(counts))
            ids = torch.zeros(len(tokens), length, dtype=torch.long)
            mask = torch.zeros_like(ids)
            sids = torch.full_like(ids, -1)
            for r, (i, s) in enumerate(tokens):
                ids[r, : len(i)], mask[r, : len(i)], sids[r, : len(s)] = torch.from_numpy(i), 1, torch.from_numpy(s)
            pooled = model.encode_paragraphs(ids.to(device), mask.to(device), sids.to(device), slots).float().cpu()
            out.extend(pooled[r, :count].clone() for r, count in enumerate(counts))
    finally:
        model.train(was_training)
    return out


class CorpusCache:
    """Sentence embeddings of paragraphs, by content (a hash of title and sentences), for one model's weights.

    In memory by default (`DocHopper.corpus_cache`; emptied when the model goes back to training);
    with `folder` (a Location, or a local path or s3:// URI) also on storage: every `flush` writes the entries added since as one
    more safetensors file there, and a new cache on the same folder starts with all of them. Batch
    scoring gives each model version and corpus snapshot a folder of its own (`workflows.score`), so a
    paragraph is encoded once per snapshot, whichever actor or run meets it first.

        cache = CorpusCache("runs/x/_cache/xh-dochopper-v3/<snapshot>")
        model.corpus_cache = cache
        model.predict_rows(rows)            # encodes what the cache lacks, then writes it (flush)
    """

    def __init__(self, folder: str | Location | None = None):
        from xh.storage.store import located

        self.folder = located(folder) if folder is not None else None
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

    def lookup(self, model, paragraphs: Sequence[tuple[str, Sequence[str]]]) -> list[torch.Tensor]:
        """[S_i, H] per (title, sentences): stored ones as they are, the others encoded by `model` and stored."""
        keys = [self.key(title, sentences) for title, sentences in paragraphs]
        missing = {k: p for k, p in zip(keys, paragraphs) if k not in self.entries}
        if missing:
            for k, embedding in zip(missing, encode_corpus(model, list(missing.values()))):
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

        self.folder.join(f"part-{uuid.uuid4().hex}.safetensors").write_bytes(
            save({k: t.contiguous() for k, t in self.new.items()})
        )
        self.new.clear()

    def _load(self) -> None:
        from safetensors.torch import load

        try:
            files = self.folder.files(suffix=".safetensors")
        except FileNotFoundError:  # nothing cached for this snapshot yet
            return
        for uri in files:
            self.entries.update(load(self.folder.store.at(uri).read_bytes()))
