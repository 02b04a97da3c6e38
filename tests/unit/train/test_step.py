"""The training step (`xh.train.step.Trainer`): the same losses as the landed step, and no read-back from
the device between metric flushes.

The reference figures (`data/step_losses.json`) were computed by `step_reference.py` from the landed tree
before the step changed (heads' losses as masked sums, dense hop attention over one [N, N] mask with a
fused attention kernel in training, fused AdamW, figures kept on the device); see its docstring.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tests.unit.train.step_reference import CASES, case_batches, case_model
from xh.config import TrainConfig
from xh.train.meters import StepMeter
from xh.train.state import Progress
from xh.train.step import Trainer

REFERENCE = json.loads((Path(__file__).parent / "data" / "step_losses.json").read_text())


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny matrices: one thread is faster, and far faster on a machine whose cores other work shares."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


class Logged:
    """A stand-in for rank 0's `TrainingRun`: what the meter logs, by step."""

    def __init__(self):
        self.steps: dict[int, dict[str, float]] = {}

    def log(self, step: int, metrics: dict[str, float]) -> None:
        assert all(isinstance(v, float) for v in metrics.values()), metrics  # tensors were read at the flush
        self.steps.setdefault(step, {}).update(metrics)


def trainer_for(name: str, tracking=None) -> Trainer:
    task, variant, isolated, _ = CASES[name]
    model = case_model(task, variant, isolated)
    # the reference's plain AdamW (lr 1e-3, weight decay 0.01), fused as training now runs it; constant schedule
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01, fused=True)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    train = TrainConfig(grad_accum=1, max_grad_norm=1.0, bf16=False)
    return Trainer(model, model, optimizer, scheduler, train, torch.device("cpu"), Progress(), StepMeter(tracking, 1))


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_step_gives_the_losses_of_the_landed_step(name):
    logged = Logged()
    trainer = trainer_for(name, logged)
    for batch in case_batches(CASES[name][0], CASES[name][3]):
        output = trainer.forward_backward(batch)
        assert trainer.step_due()
        trainer.optimizer_step(output)
    trainer.meter.flush()
    assert sorted(logged.steps) == list(range(1, len(REFERENCE[name]) + 1))
    for step, expected in enumerate(REFERENCE[name], start=1):
        got = {k: v for k, v in logged.steps[step].items() if k == "grad_norm" or k.startswith("loss")}
        assert set(got) == set(expected), step  # the same terms present, step by step
        for key, value in expected.items():
            assert got[key] == pytest.approx(value, rel=2e-4, abs=2e-5), (step, key)


# Operators that make the host wait for the device: a scalar read (`.item()`, float(), bool(), int()),
# a data-dependent output size (nonzero, boolean-mask indexing, masked_select).
SYNCING_OPS = ("_local_scalar_dense", "nonzero", "masked_select")


class HostSyncs(TorchDispatchMode):
    """Counts syncing operators torch dispatches (backward included) and, with `patch`, the Python-level
    conversions of tensors (`item`, `tolist`, `cpu`, `numpy`, float/int/bool/index)."""

    def __init__(self):
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.name()
        indices = args[1] if name.startswith(("aten::index.", "aten::index_put")) and len(args) > 1 else ()
        boolean = any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in indices or ())
        if boolean or any(op in name for op in SYNCING_OPS):
            self.seen.append(name)
        return func(*args, **(kwargs or {}))

    def patch(self, monkeypatch) -> None:
        for method in ("item", "tolist", "cpu", "numpy", "__float__", "__int__", "__bool__", "__index__"):
            original = getattr(torch.Tensor, method)

            def counted(tensor, *args, _original=original, _method=method, **kwargs):
                self.seen.append(_method)
                return _original(tensor, *args, **kwargs)

            monkeypatch.setattr(torch.Tensor, method, counted)


def test_the_counter_sees_reads_and_boolean_masks(monkeypatch):
    syncs = HostSyncs()
    syncs.patch(monkeypatch)
    x = torch.arange(6.0)
    with syncs:
        x[x > 2].sum()
        float(x.sum())
    assert (
        "aten::index.Tensor" in syncs.seen and "__float__" in syncs.seen and "aten::_local_scalar_dense" in syncs.seen
    )


@pytest.mark.parametrize("name", ["hotpot_paper_packed", "hotpot_gat_packed", "fever_paper_collate"])
def test_twenty_steps_read_nothing_back_until_the_flush(name, monkeypatch):
    logged = Logged()
    trainer = trainer_for(name, logged)
    batches = case_batches(
        CASES[name][0], CASES[name][3], steps=20
    )  # made on the host beforehand, as the prefetcher does
    for module in trainer.model.modules():  # dropout on, as in training: its kernels must not sync either
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.1
    syncs = HostSyncs()
    syncs.patch(monkeypatch)
    with syncs:
        for batch in batches:
            output = trainer.forward_backward(batch)
            trainer.optimizer_step(output)
    assert syncs.seen == []
    with syncs:
        trainer.meter.flush()
    assert syncs.seen.count("tolist") == 1  # one read for every figure of the 20 steps
    assert sorted(logged.steps) == list(range(1, 21))
    assert all(torch.isfinite(torch.tensor(s["loss"])) for s in logged.steps.values())
