"""DocHopper's reader (§4.2 with Xiong et al. 2021's rerank): the evidence combinations, the gold one, and
a small head of its own on the shared backbone reading `[CLS] question [SEP] title: sentence ... [SEP]`
(start / end logits over the context, answer type and a pair logit on [CLS]); training reads the gold
combination and the model's own best wrong ones (`reader_losses`)."""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from xh.graph.encoded import ANSWER_TYPES
from xh.graph.hotpot import answer_char_spans
from xh.model.dochopper.batch import DocHopperBatch, DocHopperExample
from xh.model.heads import MASKED


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


def reader_context(picks: Sequence[tuple[str, str]]) -> str:
    return " ".join(f"{title}: {sentence.strip()}" for title, sentence in picks)


def context_piece(picks: Sequence[tuple[str, str]], char: int) -> int:
    """Which (title, sentence) of `reader_context(picks)` holds character `char`."""
    starts = list(itertools.accumulate(len(f"{title}: {sentence.strip()}") + 1 for title, sentence in picks))
    return min(bisect.bisect_right(starts, char), len(picks) - 1)


def combinations(evidence_scores: torch.Tensor, b: int, top_k: int) -> list[tuple[float, tuple]]:
    """(Eq. 8 score sum, ((paragraph, sentence) per evidence)) of the top_k x top_k combinations, best first;
    combinations with two sentences of one paragraph are skipped unless nothing else is left."""
    per_evidence = []
    for e in range(evidence_scores.shape[1]):
        scores = evidence_scores[b, e].detach().float().cpu()
        s = scores.shape[1]
        k = min(top_k, int((scores > MASKED / 2).sum()))
        top = torch.topk(scores.flatten(), max(k, 1))
        per_evidence.append([(float(v), (int(i) // s, int(i) % s)) for v, i in zip(top.values, top.indices)])
    combos = [(sum(v for v, _ in pick), tuple(c for _, c in pick)) for pick in itertools.product(*per_evidence)]
    distinct = [c for c in combos if len({p for p, _ in c[1]}) == len(c[1])]
    return sorted(distinct or combos, key=lambda c: -c[0])


def gold_combination(example: DocHopperExample, evidences: Sequence[tuple[int | None, int]]) -> tuple | None:
    """Per evidence, the supporting sentence that holds the answer, else the first; None when unknown."""
    picks = []
    for _, sentence_hop in evidences:
        node, sentences = example.hop_targets[sentence_hop]
        sentences = [j for j in sentences if node >= 0 and j < example.num_sentences[node]]
        if not sentences:
            return None
        with_answer = [
            j for j in sentences if example.answer and answer_char_spans(example.sentences[node][j], example.answer)
        ]
        picks.append((node, (with_answer or sentences)[0]))
    return tuple(picks)


def read(model, items: list[tuple[DocHopperExample, tuple]]) -> ReaderOutput:
    """The reader over (example, combination) pairs: `[CLS] question [SEP] title: sentence ... [SEP]`."""
    questions = [e.question for e, _ in items]
    contexts = [reader_context([(e.titles[p], e.sentences[p][j]) for p, j in combo]) for e, combo in items]
    device = next(model.parameters()).device
    enc = model.tokenizer(
        questions,
        contexts,
        truncation="only_second",
        max_length=model.cfg.max_reader_tokens,
        padding=True,
        return_offsets_mapping=True,
        return_token_type_ids=True,
        return_tensors="pt",
    )
    in_context = torch.tensor([[s == 1 for s in enc.sequence_ids(i)] for i in range(len(items))], dtype=torch.bool)
    hidden = model.backbone(
        input_ids=enc["input_ids"].to(device),
        attention_mask=enc["attention_mask"].to(device),
        token_type_ids=enc["token_type_ids"].to(device) if model._use_token_types else None,
    ).last_hidden_state
    context_mask = in_context.to(device)
    start, end = model.reader_span(hidden).float().unbind(-1)
    cls = hidden[:, 0]
    return ReaderOutput(
        start_logits=start.masked_fill(~context_mask, MASKED),
        end_logits=end.masked_fill(~context_mask, MASKED),
        answer_type_logits=model.reader_type(cls).float(),
        pair_logits=model.reader_pair(cls).squeeze(-1).float(),
        contexts=contexts,
        offsets=enc["offset_mapping"],
        context_mask=context_mask,
        tokens=int(enc["attention_mask"].sum()),
    )


def reader_losses(
    model, batch: DocHopperBatch, evidence_scores: torch.Tensor
) -> tuple[dict[str, torch.Tensor], ReaderOutput | None]:
    """The reader reads each question's gold combination and its `reader_negatives` best wrong ones:
    rerank = cross-entropy of the gold among them; span and answer type on the gold one."""
    items, groups, types = [], [], []  # groups: (first row, rows) per question
    for b, example in enumerate(batch.examples):
        gold = gold_combination(example, model.evidences)
        if gold is None:
            continue
        negatives = [c for _, c in combinations(evidence_scores, b, model.cfg.top_k) if c != gold]
        group = [gold, *negatives[: model.cfg.reader_negatives]]
        groups.append((len(items), len(group)))
        items.extend((example, combo) for combo in group)
        types.append(example.answer_type)
    if not items:
        return {}, None
    out = read(model, items)
    device = out.pair_logits.device
    losses: dict[str, torch.Tensor] = {}
    rerank = [
        F.cross_entropy(out.pair_logits[i : i + n].unsqueeze(0), torch.zeros(1, dtype=torch.long, device=device))
        for i, n in groups
        if n > 1
    ]
    if rerank:
        losses["rerank"] = torch.stack(rerank).mean()
    gold_rows = torch.tensor([i for i, _ in groups], device=device)
    answer_types = torch.tensor(types, device=device)
    if (answer_types >= 0).any():
        known = answer_types >= 0
        losses["answer_type"] = F.cross_entropy(out.answer_type_logits[gold_rows[known]], answer_types[known])
    span_rows, starts, ends = [], [], []
    for (i, _), answer_type in zip(groups, types):
        answer = items[i][0].answer
        found = (
            answer_char_spans(out.contexts[i], answer) if answer_type == ANSWER_TYPES.index("span") and answer else []
        )
        if not found:
            continue  # the answer is not in the gold sentences (or was truncated away)
        first = found[0]
        tokens = [
            t
            for t in range(out.offsets.shape[1])
            if out.context_mask[i, t] and out.offsets[i, t, 1] > first["start"] and out.offsets[i, t, 0] < first["end"]
        ]
        if tokens:
            span_rows.append(i)
            starts.append(tokens[0])
            ends.append(tokens[-1])
    if span_rows:
        rows = torch.tensor(span_rows, device=device)
        losses["span"] = (
            F.cross_entropy(out.start_logits[rows], torch.tensor(starts, device=device))
            + F.cross_entropy(out.end_logits[rows], torch.tensor(ends, device=device))
        ) / 2
    return losses, out
