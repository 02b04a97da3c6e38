"""One training step of Transformer-XH as every worker runs it: forward and backward of a batch, and every
`train.grad_accum` batches an optimizer step. Nothing here reads a tensor back from the device: the
loss and the gradient norm stay there until `xh.train.meters.StepMeter.flush`.

    trainer = Trainer(model, ddp_model, optimizer, scheduler, cfg.train, device, progress, meter)
    for host_batch in batches:
        output = trainer.forward_backward(host_batch)      # counts the batch on the host, then runs it
        if trainer.step_due():
            trainer.optimizer_step(output)                  # progress.step += 1, figures to the meter
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from xh.config import TrainConfig
from xh.model.predict import autocast
from xh.train.meters import StepMeter
from xh.train.state import Progress
from xh.train.worker import optimizer_step


@dataclass
class Trainer:
    model: nn.Module  # the parameters (what is clipped and saved)
    ddp_model: nn.Module  # what runs the batch: the model, or its DDP wrapper
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    train: TrainConfig
    device: torch.device
    progress: Progress
    meter: StepMeter

    def forward_backward(self, host_batch):
        """The batch (on the host, pinned: the copy is asynchronous) through the model and back; the output."""
        self.meter.count(host_batch)
        batch = host_batch.to(self.device, non_blocking=True)
        with autocast(self.device, self.train.bf16):
            output = self.ddp_model(batch)
        accum = self.train.grad_accum  # no division by 1: two operators a step (forward and backward)
        (output.loss if accum == 1 else output.loss / accum).backward()
        self.progress.batches_in_epoch += 1
        return output

    def step_due(self) -> bool:
        return self.progress.batches_in_epoch % self.train.grad_accum == 0

    def optimizer_step(self, output) -> None:
        grad_norm = optimizer_step(self.model, self.optimizer, self.scheduler, self.train.max_grad_norm)
        self.progress.step += 1
        lr = self.scheduler.get_last_lr()[0]
        self.meter.record(self.progress.step, output.loss, grad_norm, lr, output.losses)
