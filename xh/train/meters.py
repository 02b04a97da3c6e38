"""The training loop's figures: step metrics kept on the device until a flush, throughput windows, the
progress line and the per-epoch figures (`xh.train.loop`).

    meter = StepMeter(tracking, workers=plan.workers)       # tracking: rank 0's TrainingRun, else None
    meter.count(host_batch)                                 # graphs and real tokens, read on the host
    meter.record(step, loss=output.loss, grad_norm=norm, lr=lr, losses=output.losses)   # no read-back
    meter.flush()                                           # one read-back for every step since the last

Reading a loss or a gradient norm on the host (`.item()`, `float()`) waits for the GPU to finish the step,
so the next step's kernels cannot be queued while this one runs. Steps keep their figures as device
tensors; `flush` stacks them and reads them in one transfer, at the points where the loop already stops
(a progress line, a checkpoint, the end of an epoch), and hands them to the MLflow run.
"""

from __future__ import annotations

import logging
import time

import torch

from xh.train.batching import BatchStats
from xh.train.prefetch import Prefetcher


class StepMeter:
    """Rank 0's figures per optimizer step (every rank counts, only a meter with a run records)."""

    def __init__(self, tracking, workers: int):
        self.tracking, self.workers = tracking, workers
        self.pending: list[tuple[int, dict]] = []  # (step, {name: device tensor or float})
        self.window_start, self.graphs, self.tokens = time.perf_counter(), 0, 0
        self.last_window = (0, 0.0)  # the last step's (graphs, seconds) on this worker

    def count(self, host_batch) -> None:
        """The batch's graphs and real tokens, read from its host copy (no device involved)."""
        self.graphs += host_batch.num_graphs
        self.tokens += host_batch.num_real_tokens

    def record(self, step: int, loss: torch.Tensor, grad_norm: torch.Tensor, lr: float, losses: dict) -> None:
        """One optimizer step's figures, kept as they are; the throughput window restarts."""
        seconds = time.perf_counter() - self.window_start
        self.last_window = (self.graphs, seconds)
        if self.tracking is not None:
            # this worker's throughput times the workers: every worker runs the same batches
            figures = {"loss": loss.detach(), "lr": lr, "grad_norm": grad_norm}
            figures |= {f"loss_{k}": v.detach() for k, v in losses.items()}
            figures |= {"graphs_per_s": self.graphs * self.workers / seconds}
            self.pending.append((step, figures | {"tokens_per_s": self.tokens * self.workers / seconds}))
        self.window_start, self.graphs, self.tokens = time.perf_counter(), 0, 0

    def flush(self) -> dict[str, float]:
        """Read every pending tensor in one transfer and log the steps; the last step's figures."""
        if not self.pending:
            return {}
        tensors = [v for _, figures in self.pending for v in figures.values() if isinstance(v, torch.Tensor)]
        values = iter(torch.stack([t.float() for t in tensors]).tolist()) if tensors else iter(())
        last: dict[str, float] = {}
        for step, figures in self.pending:
            last = {k: next(values) if isinstance(v, torch.Tensor) else v for k, v in figures.items()}
            self.tracking.log(step, last)
        self.pending = []
        return last


def log_progress(step: int, total: int, loss: float, graphs: int, window_s: float, done_here: tuple[int, float]) -> str:
    """One line a user reads in `ray job logs`: where training is, how fast, how long it has left.
    `done_here`: (steps, seconds) of this process, so a resumed run's ETA is not skewed by the restart."""
    steps, seconds = done_here
    eta = seconds / max(steps, 1) * (total - step)
    line = (
        f"step {step}/{total}  loss {loss:.4f}  {graphs / max(window_s, 1e-9):.1f} graphs/s  "
        f"ETA {int(eta // 60)}m{int(eta % 60):02d}s"
    )
    logging.getLogger("xh.train").info(line)
    return line


def epoch_figures(
    stats: BatchStats, prefetched: Prefetcher, feed: dict[str, float], seconds: float, device
) -> dict[str, float]:
    """Per epoch (what this worker ran of it): the encoder's distinct input shapes (a GPU plans each new
    one), real / computed tokens, the share of the time the step loop waited for its next batch, the
    epoch's wall time, batches and real tokens (so later epochs give a throughput without the first one's
    shape planning), and on a GPU the peak memory allocated so far.

    Where the batches' making spent its time, as shares of the epoch (`feed`, timed in the background
    thread): waiting for Ray Data's next chunk of rows, for the encoder processes, and grouping and
    packing in this process. When the step loop waits, the largest of them is what to give more CPUs."""
    data = feed.get("data", 0.0)  # the timers nest (`timed`): each part is its timer less the one inside
    encoded = feed.get("encoded", data)
    batched = feed.get("batched", encoded)
    figures = {
        "distinct_step_shapes": len(stats.shapes),
        "real_token_fraction": stats.real_token_fraction,
        "encode_wait_fraction": prefetched.wait_seconds / max(seconds, 1e-9),
        "feed_data_fraction": data / max(seconds, 1e-9),
        "feed_encode_fraction": (encoded - data) / max(seconds, 1e-9),
        "feed_batch_fraction": (batched - encoded) / max(seconds, 1e-9),
        "epoch_seconds": seconds,
        "epoch_batches": stats.batches,
        "epoch_real_tokens": stats.real_tokens,
    }
    if device.type == "cuda":
        figures["gpu_memory_peak_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
    return figures
