"""Training state on disk without pickle: weights and optimizer moments in safetensors, the rest in JSON.

    save_training_state(directory, model, optimizer, scheduler, progress)
    progress = load_training_state(directory, optimizer, scheduler)     # the model loads from directory/model

A checkpoint folder holds `model/` (what `XHModel.save_pretrained` writes: it is also the folder the
registry packages), `optimizer.safetensors` and `trainer_state.json` (progress, optimizer hyper-parameters
and scalar state, scheduler state). `torch.load` is never used, so loading a checkpoint runs no code.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

MODEL_DIR = "model"
OPTIMIZER_FILE = "optimizer.safetensors"
STATE_FILE = "trainer_state.json"


@dataclass
class Progress:
    step: int = 0  # optimizer steps done
    epoch: int = 0  # the epoch in progress
    batches_in_epoch: int = 0  # batches of that epoch already consumed: the data position
    mlflow_run_id: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)  # the dev metrics at this checkpoint


def _split_optimizer_state(optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict]:
    state = optimizer.state_dict()
    tensors, scalars = {}, {}
    for index, per_param in state["state"].items():
        for name, value in per_param.items():
            if torch.is_tensor(value):
                tensors[f"{index}.{name}"] = value.detach().cpu().contiguous()
            else:
                scalars[f"{index}.{name}"] = value
    return tensors, {"param_groups": state["param_groups"], "scalars": scalars}


def _join_optimizer_state(tensors: dict[str, torch.Tensor], meta: dict) -> dict:
    state: dict[int, dict] = {}
    for key, value in list(tensors.items()) + list(meta["scalars"].items()):
        index, name = key.split(".", 1)
        state.setdefault(int(index), {})[name] = value
    return {"state": state, "param_groups": meta["param_groups"]}


def save_training_state(directory: str | Path, model, optimizer, scheduler, progress: Progress) -> None:
    directory = Path(directory)
    model.save_pretrained(directory / MODEL_DIR)
    tensors, optimizer_meta = _split_optimizer_state(optimizer)
    save_file(tensors, str(directory / OPTIMIZER_FILE))
    (directory / STATE_FILE).write_text(
        json.dumps(
            {"progress": asdict(progress), "optimizer": optimizer_meta, "scheduler": scheduler.state_dict()},
            indent=1,
        )
    )


def read_progress(directory: str | Path) -> Progress:
    return Progress(**json.loads((Path(directory) / STATE_FILE).read_text())["progress"])


def load_training_state(directory: str | Path, optimizer, scheduler) -> Progress:
    """Restore optimizer and scheduler in place (the model is loaded from `directory/model` by the caller)."""
    directory = Path(directory)
    saved = json.loads((directory / STATE_FILE).read_text())
    tensors = load_file(str(directory / OPTIMIZER_FILE))
    optimizer.load_state_dict(_join_optimizer_state(tensors, saved["optimizer"]))
    scheduler.load_state_dict(saved["scheduler"])
    return Progress(**saved["progress"])
