"""Operators a step dispatches: what a GPU launches at least one kernel for (`bench/gpu_train.py`, tests).

from op_count import count_ops               # bench/ on sys.path
count_ops(lambda: model(batch).loss.backward())     # forward and backward, views left out
"""

from __future__ import annotations

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
