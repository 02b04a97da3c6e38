"""What every Ray Train worker loop here does: Transformer-XH's (`xh.train.loop`) and the re-ranker's
(`xh.train.rerank`).

    plan = plan_steps(num_examples, workers=2, batch_size=16, epochs=1, max_steps=None)  # on the driver
    start_worker(seed=13, threads=None)                     # in each worker: torch threads, seeded generators
    optimizer, scheduler = adamw_with_warmup(param_groups, plan.total_steps, warmup_fraction=0.1)
    ...
    loss.backward()
    grad_norm = optimizer_step(model, optimizer, scheduler, max_grad_norm=1.0)
    ...
    report(metrics, save=model.save_pretrained if rank == 0 else None)   # rank 0's folder is the checkpoint

Every worker takes an equal share of the examples and runs the same number of steps, so DDP's
all-reduces always pair up; every worker reports at the same points, and only rank 0 attaches a
checkpoint. Rank 0 also keeps the MLflow run (`xh.tracking.TrainingRun`).
"""

from __future__ import annotations

import contextlib
import random
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import torch

from xh.config import ConfigError


@dataclass(frozen=True)
class StepPlan:
    workers: int
    batches_per_epoch: int  # per worker
    steps_per_epoch: int  # optimizer steps
    total_steps: int


def plan_steps(
    num_examples: int,
    *,
    workers: int,
    batch_size: int,
    epochs: int,
    max_steps: int | None,
    grad_accum: int = 1,
    unit: str = "examples",
) -> StepPlan:
    """The steps every worker runs: equal shares of `num_examples`, full batches, `grad_accum` batches a step."""
    per_worker = num_examples // workers
    steps_per_epoch = per_worker // (batch_size * grad_accum)
    if steps_per_epoch == 0:
        accumulation = f" x {grad_accum} accumulation steps" if grad_accum > 1 else ""
        raise ConfigError(
            f"{num_examples} training {unit} are too few for {workers} worker(s) x {batch_size} {unit}{accumulation}"
        )
    total = steps_per_epoch * epochs
    if max_steps is not None:
        total = min(total, max_steps)
    return StepPlan(workers, steps_per_epoch * grad_accum, steps_per_epoch, total)


def start_worker(seed: int, threads: int | None) -> None:
    """Torch's thread count (None: torch's default) and every random generator seeded."""
    if threads:
        torch.set_num_threads(threads)
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def adamw_with_warmup(param_groups: list[dict], total_steps: int, warmup_fraction: float):
    """(AdamW, its schedule): the learning rate rises linearly over the first `warmup_fraction` of the
    steps, then falls linearly to 0 at the last one. The fused AdamW: one kernel for all parameters on a
    GPU, and no read-back of its step counts (the plain one reads each from the host)."""
    warmup = max(1, int(total_steps * warmup_fraction))

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return max(0.0, (total_steps - step) / max(1, total_steps - warmup))

    optimizer = torch.optim.AdamW(param_groups, fused=True)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def optimizer_step(model: torch.nn.Module, optimizer, scheduler, max_grad_norm: float) -> torch.Tensor:
    """Clip the gradients, step the optimizer and the schedule, clear the gradients; the norm before
    clipping, a tensor on the device (reading it would wait for the step: `xh.train.meters` reads it later)."""
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm, foreach=True)
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return grad_norm.detach()


def report(metrics: dict, save: Callable[[str], object] | None = None) -> None:
    """`ray.train.report` from every worker; `save(folder)` (rank 0's) writes the folder reported as the checkpoint."""
    import ray.train

    if save is None:
        ray.train.report(metrics, checkpoint=None)
        return
    with tempfile.TemporaryDirectory() as folder:
        save(folder)
        ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(folder))


@contextlib.contextmanager
def checkpoint_folder(checkpoint, keep: bool = False) -> Iterator[str]:
    """A Ray Train checkpoint as a local folder this process alone reads; removed on exit unless `keep`.

    Not `Checkpoint.as_directory()`: for a remote checkpoint, every process on a node downloads into one
    shared temporary folder, and a process arriving after the first download has released its lock
    downloads again over the files another is reading (a rank read a half-written tokenizer.json so).
    A local checkpoint is read where it lies and never removed.
    """
    import pyarrow.fs

    if isinstance(checkpoint.filesystem, pyarrow.fs.LocalFileSystem):
        yield checkpoint.path
        return
    folder = tempfile.mkdtemp(prefix="xh-checkpoint-")
    try:
        yield checkpoint.to_directory(folder)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    if not keep:
        shutil.rmtree(folder, ignore_errors=True)
