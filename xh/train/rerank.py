"""The re-ranker's Ray Train worker loop (`xh.retrieval.rerank.CrossEncoder`; listwise or pointwise loss).

`workflows.rerank` reads the pairs and plans the steps on the driver, then hands
`train_loop_per_worker` to a `TorchTrainer`:

    examples = training_examples(cfg.rerank, tables)             # xh.retrieval.rerank: Example pairs
    units, per_step, unit = training_units(cfg.rerank, examples)   # question groups (listwise) or pairs
    plan = plan_steps(len(units), workers=..., batch_size=per_step, epochs=..., max_steps=..., unit=unit)
    config = {"cfg": cfg.model_dump(mode="json"), "backbone": folder, "plan": asdict(plan),
              "examples": [asdict(e) for e in examples]}

Pairs come from `rerank.questions`, a HotpotQA file in the distractor format (each question's context
paragraphs: the supporting ones are positives, the others negatives; no index needed), or from
`rerank.retrieval`, the output folder of `xh retrieve run` (positives: the gold paragraphs from the
docs table; negatives: the question's BM25 candidates, hardest first).

Listwise (`rerank.loss`, the default), a step takes `rerank.questions_per_step` whole questions (each
positive against its question's negatives); pointwise, `rerank.batch_size` pairs (binary cross-entropy).
Each worker trains on an equal share of the units and runs the same number of steps (`xh.train.worker`).
At the end of every epoch all workers report; rank 0 attaches a checkpoint holding the saved
re-ranker. Rank 0 also owns the MLflow run: params, step losses, epoch metrics, and the final
re-ranker's files as artifacts under `reranker/`.
"""

from __future__ import annotations

import math
import time

from xh.config import RerankConfig, XHConfig
from xh.retrieval.rerank import CrossEncoder, Example, epoch_batches, listwise_loss, pair_loss, question_groups
from xh.tracking import TrainingRun
from xh.train.worker import StepPlan, adamw_with_warmup, optimizer_step, report, start_worker

RUN_NAME = "train-reranker"


def training_units(r: RerankConfig, examples: list[Example]) -> tuple[list, int, str]:
    """(units, units per step, their name): question groups for the listwise loss, pairs for the pointwise."""
    if r.loss == "listwise":
        return question_groups(examples), r.questions_per_step, "questions"
    return list(examples), r.batch_size, "pairs"


def train_loop_per_worker(config: dict) -> None:
    """One DDP worker: its share of the pairs, the planned steps, a report (and rank 0's checkpoint) per epoch."""
    import mlflow
    import ray.train
    import ray.train.torch

    cfg = XHConfig.model_validate(config["cfg"])
    r, plan = cfg.rerank, StepPlan(**config["plan"])
    rank = ray.train.get_context().get_world_rank()
    start_worker(r.seed, r.threads_per_worker)  # the seed also fixes the head's random start
    examples = [Example(**e) for e in config["examples"]]
    units, per_step, _ = training_units(r, examples)
    mine = units[rank :: plan.workers][: len(units) // plan.workers]  # equal shares
    loss_of = listwise_loss if r.loss == "listwise" else pair_loss

    encoder = CrossEncoder.from_backbone(config["backbone"], r.max_length, pooling=r.pooling)
    model = ray.train.torch.prepare_model(encoder)  # DDP with more than one worker; moved to the device
    groups = [{"params": list(model.parameters()), "lr": r.lr, "weight_decay": 0.01}]
    optimizer, scheduler = adamw_with_warmup(groups, plan.total_steps, r.warmup_fraction)
    tracking = None
    if rank == 0:
        params = {"backbone_path": config["backbone"], "pairs": len(examples), "total_steps": plan.total_steps}
        tracking = TrainingRun(cfg, "rerank", run_name=RUN_NAME, params=params)

    log_every = max(1, plan.total_steps // 50)
    step, start = 0, time.perf_counter()

    def save(folder: str) -> None:  # rank 0's checkpoint
        encoder.save(folder)
        if step == plan.total_steps:  # the final re-ranker also goes to the run
            mlflow.log_artifacts(folder, artifact_path="reranker")

    for epoch in range(math.ceil(plan.total_steps / plan.batches_per_epoch)):
        model.train()
        losses = []
        for batch in epoch_batches(mine, per_step, r.seed, epoch)[: plan.total_steps - step]:
            loss = loss_of(model, encoder, batch)
            loss.backward()
            optimizer_step(model, optimizer, scheduler, max_grad_norm=1.0)
            step += 1
            losses.append(loss.item())
            if tracking and step % log_every == 0:
                tracking.log(step, {"step_loss": loss.item(), "lr": scheduler.get_last_lr()[0]})
        metrics = {
            "epoch": epoch + 1,
            "step": step,
            "loss": sum(losses) / len(losses),
            "seconds": round(time.perf_counter() - start, 3),
            "pairs": len(examples),
        }
        if tracking is None:
            report(metrics)
        else:
            tracking.log(step, {f"epoch_{k}": float(v) for k, v in metrics.items()})
            report({**metrics, "mlflow_run_id": tracking.run_id}, save)
            tracking.flush()
    if tracking:
        tracking.end()
