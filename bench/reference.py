"""What the benchmarks and the tests both use: a reference node encoder and an operator count.

Neither is on a production path: `encode_node` is the plain, one-node-at-a-time form of what
`xh.graph.encode` does in bulk, and `count_ops` counts what a GPU would launch for a step. Benchmarks
run as scripts import it as `reference`; tests as `bench.reference`.
"""

from __future__ import annotations

import numpy as np

# Operators that only re-describe memory: no kernel of their own on a GPU.
VIEW_OPS = frozenset(
    {
        "view",
        "transpose",
        "permute",
        "expand",
        "unsqueeze",
        "reshape",
        "flatten",
        "select",
        "slice",
        "detach",
        "t",
        "as_strided",
        "squeeze",
        "alias",
        "narrow",
        "_unsafe_view",
        "unbind",
        "view_as",
        "expand_as",
        "split",
        "split_with_sizes",
    }
)


def count_ops(fn) -> int:
    """Operators torch dispatches from Python or autograd while `fn()` runs (not those they call
    inside), views left out: on a GPU each launches at least one kernel."""
    import torch

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()

    def top_level(event) -> bool:
        parent = event.cpu_parent
        while parent is not None and not parent.name.startswith("aten::"):
            parent = parent.cpu_parent
        return parent is None

    return sum(1 for e in prof.events() if e.name.startswith("aten::") and e.name[6:] not in VIEW_OPS and top_level(e))


def encode_node(tokenizer, question: str, sentences: list[str], max_tokens: int | None = None) -> dict:
    """`[CLS] question [SEP] paragraph [SEP]` with the paragraph mask, character offsets (-1 outside the
    paragraph) and each token's sentence id; `max_tokens` truncates the paragraph."""
    paragraph = "".join(sentences)
    truncation = {"truncation": "only_second", "max_length": max_tokens} if max_tokens else {}
    enc = tokenizer(question, paragraph, return_offsets_mapping=True, return_token_type_ids=True, **truncation)
    in_paragraph = np.array([s == 1 for s in enc.sequence_ids()])
    offsets = np.array(enc["offset_mapping"], np.int64)
    offsets[~in_paragraph] = -1
    starts = np.cumsum([0] + [len(s) for s in sentences])[:-1]
    sentence_ids = np.where(in_paragraph, np.searchsorted(starts, offsets[:, 0], side="right") - 1, -1)
    return {
        "input_ids": np.array(enc["input_ids"], np.int64),
        "token_type_ids": np.array(enc["token_type_ids"], np.int64),
        "paragraph_mask": in_paragraph,
        "offsets": offsets,
        "sentence_ids": sentence_ids.astype(np.int64),
        "paragraph": paragraph,
        # the sentences the (possibly truncated) paragraph still reaches
        "num_sentences": int(sentence_ids.max()) + 1 if in_paragraph.any() else 0,
    }


def part(label: str, fn):
    """`fn` whose operators `ops_by_part` counts under `label` (a profiler range around each call)."""
    import functools

    import torch

    @functools.wraps(fn)
    def labelled(*args, **kwargs):
        with torch.profiler.record_function(PART + label):
            return fn(*args, **kwargs)

    return labelled


PART = "part: "


def ops_by_part(fn, names: bool = False) -> dict[str, int]:
    """`count_ops` split by the `part` whose call dispatched each operator: forward operators under the
    innermost part, backward ones under the part of the forward operator they differentiate
    ("<part> backward"); "other" outside every part. `names`: keys "<part>: <operator>" instead."""
    import collections

    import torch

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    events = prof.events()

    def enclosing(event):
        """(the innermost part range around the event or None, the autograd node it runs in or None)."""
        parent, node = event.cpu_parent, None
        while parent is not None:
            if parent.name.startswith(PART):
                return parent.name[len(PART) :], node
            if parent.name.startswith("autograd::engine::evaluate_function") and node is None:
                node = parent
            parent = parent.cpu_parent
        return None, node

    def counted(event) -> bool:
        parent = event.cpu_parent
        while parent is not None and not parent.name.startswith("aten::"):
            parent = parent.cpu_parent
        return event.name.startswith("aten::") and event.name[6:] not in VIEW_OPS and parent is None

    forward_part = {}  # sequence number of a forward operator -> its part
    for event in events:
        label, node = enclosing(event)
        if label is not None and node is None and getattr(event, "sequence_nr", -1) >= 0:
            forward_part.setdefault(event.sequence_nr, label)
    parts: collections.Counter = collections.Counter()
    for event in filter(counted, events):
        label, node = enclosing(event)
        if node is not None:
            label = f"{forward_part.get(node.sequence_nr, 'other')} backward"
        parts[f"{label or 'other'}: {event.name[6:]}" if names else label or "other"] += 1
    return dict(parts)
