"""The Ray Train worker loop of Transformer-XH: DDP over the `graphs` table, checkpoints, rank-0 MLflow logging.

`train_loop_per_worker(config)` is what `workflows.train` hands to `TorchTrainer`; `config` holds the
whole `XHConfig` (as a dict) and the step plan the driver computed. It reads top-down: `start` (model,
optimizer, a checkpoint to resume, rank 0's MLflow run), then `train_epoch` per epoch (batches made ahead,
`xh.train.step.Trainer` for each step, `evaluate_and_checkpoint` every `train.eval_every` steps), then a
last `evaluate_and_checkpoint`. Figures and timers are `xh.train.meters`.

    plan = plan_steps(num_train_graphs, workers=train.workers, batch_size=train.batch_graphs, ...)  # xh.train.worker

Every worker runs the same number of optimizer steps per epoch (the training split is equal-sized and
each worker stops after `plan.batches_per_epoch` batches), so DDP's all-reduces always pair up. The
parts the re-ranker's loop shares (plan, seeding, optimizer and schedule, reports) are `xh.train.worker`.

Resumption: a checkpoint holds the weights, optimizer, scheduler and the data position (epoch, batches
consumed). After a worker failure Ray Train restarts the group and `ray.train.get_checkpoint()` returns
the last one; re-running with the same run name does the same. MLflow step metrics are buffered and
written only when a checkpoint is reported (`xh.tracking.TrainingRun`), so steps repeated after a failure
are never logged twice.
"""

from __future__ import annotations

import itertools
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from xh.config import TrainConfig, XHConfig
from xh.eval.official import official_metrics
from xh.graph.encode import GraphEncoder
from xh.inference import predict_graphs
from xh.model.variants import architecture, load_saved, new_model
from xh.model.xh import XHModel, load_tokenizer
from xh.tracking import TrainingRun
from xh.train.batching import BatchLayout, BatchStats, in_lockstep
from xh.train.meters import StepMeter, epoch_figures, log_progress
from xh.train.prefetch import Prefetcher, timed
from xh.train.split import SPLIT_ARTIFACT
from xh.train.state import MODEL_DIR, Progress, load_training_state, save_training_state
from xh.train.step import Trainer
from xh.train.worker import StepPlan, adamw_with_warmup, checkpoint_folder, report, start_worker


def parameter_groups(model: XHModel, train: TrainConfig) -> list[dict]:
    """Pretrained backbone weights at `lr`; the new hop and head parameters at `hop_lr`; no decay on
    biases and LayerNorm weights."""
    pretrained = {id(p) for p in model.backbone.parameters()}
    groups: dict[tuple[bool, bool], list] = {}
    for name, p in model.named_parameters():
        if p.requires_grad:
            no_decay = p.ndim == 1 or name.endswith(".bias")
            groups.setdefault((id(p) in pretrained, no_decay), []).append(p)
    return [
        {
            "params": params,
            "lr": train.lr if is_pretrained else (train.hop_lr or train.lr),
            "weight_decay": 0.0 if no_decay else train.weight_decay,
        }
        for (is_pretrained, no_decay), params in sorted(groups.items())
    ]


def evaluate_dev(
    model: XHModel,
    tokenizer,
    rows: list[dict],
    cfg: XHConfig,
    attention: list | None = None,
    official: dict | None = None,
    missed: list[str] | tuple = (),
) -> dict:
    """Dev metrics with the official HotpotQA rules (FEVER: the official scorer, with its slices), keys
    prefixed `dev_`. `official`, when a dict, receives FEVER's "gold" and "predictions" files. `missed`: ids
    of dev questions quarantined at graph building; each counts as a miss (score 0), as the official
    scripts count a question without a prediction."""
    predictions = predict_graphs(
        model,
        tokenizer,
        rows,
        batch_graphs=cfg.train.eval_batch_graphs,
        bf16=cfg.train.bf16,
        collect_attention=attention,
        make_batch=BatchLayout.of(cfg).eval_batcher(),
    )
    if cfg.model.task == "fever":
        return fever_dev_metrics(rows, predictions, official, missed)
    metrics = official_metrics(rows, predictions, "hotpot", missed)
    return {f"dev_{k}": v for k, v in metrics.items()} | {"dev_graphs": len(rows), "dev_missed": len(missed)}


def log_graph_settings(mlflow, settings: dict) -> None:
    """Log the graphs table's settings as `graphs.*` parameters; a resumed run logs the same values again."""
    params = {f"graphs.{k}": json.dumps(v) if isinstance(v, (list, dict)) else v for k, v in settings.items()}
    if params:
        mlflow.log_params(params)


def log_split(mlflow, split: dict | None, inputs: list) -> None:
    """The run's split (`split.json`, what promotion reads) and its train and dev graphs as dataset inputs;
    a resumed run logs the same again (MLflow keeps one input per dataset name and digest)."""
    from xh.tracking import log_datasets

    if split is not None:
        mlflow.log_dict(split, SPLIT_ARTIFACT)
    if inputs:
        log_datasets([(ref, context) for ref, context in inputs])


def fever_dev_metrics(
    rows: list[dict], predictions: list[dict], official: dict | None = None, missed: list[str] | tuple = ()
) -> dict:
    """The official FEVER scorer on dev graphs: FEVER score, label accuracy, evidence P / R / F1 and the
    single- / multi-evidence / NEI slices, as `dev_` metrics; claims in `missed` (no graph) count as wrong."""
    metrics = official_metrics(rows, predictions, "fever", missed, files=official)
    if not rows:
        return {f"dev_{k}": v for k, v in metrics.items()} | {"dev_graphs": 0}
    return {f"dev_{k}": v for k, v in metrics.items()} | {"dev_graphs": len(rows), "dev_missed": len(missed)}


def _log_fever_files(mlflow, official: dict, step: int) -> None:
    """The dev evaluation's official files: `xh eval fever --gold dev/gold.jsonl --pred dev/predictions-<step>.jsonl`
    gives the run's `dev_fever_score` at that step."""
    import json

    def lines(records: list[dict]) -> str:
        return "".join(json.dumps(r) + "\n" for r in records)

    mlflow.log_text(lines(official["gold"]), "dev/gold.jsonl")
    mlflow.log_text(lines(official["predictions"]), f"dev/predictions-{step}.jsonl")


def _worker_nodes(world_size: int) -> list[str]:
    """The Ray node of every worker (an all-gather), so the run records where it ran."""
    import ray
    import torch.distributed as dist

    node = ray.get_runtime_context().get_node_id()
    if world_size == 1 or not dist.is_initialized():
        return [node]
    nodes: list = [None] * world_size
    dist.all_gather_object(nodes, node)
    return nodes


@dataclass
class Worker:
    """What one Ray Train worker holds for its run."""

    config: dict  # train_loop_per_worker's
    cfg: XHConfig
    plan: StepPlan
    rank: int
    trainer: Trainer
    tokenizer: object
    tracking: TrainingRun | None  # rank 0's MLflow run
    dev_rows: list[dict] = field(default_factory=list)  # rank 0's
    started: float = field(default_factory=time.perf_counter)
    first_step: int = 0  # a resumed run's ETA counts only its own steps

    @property
    def progress(self) -> Progress:
        return self.trainer.progress

    @property
    def model(self) -> XHModel:
        return self.trainer.model

    @property
    def done(self) -> bool:
        return self.progress.step >= self.plan.total_steps


def train_loop_per_worker(config: dict) -> None:
    worker = start(config)
    train = worker.cfg.train
    encoder = GraphEncoder(worker.tokenizer, worker.cfg.model.max_node_tokens, train.encode_processes)
    while not worker.done and worker.progress.epoch < train.epochs:
        train_epoch(worker, encoder)
        if not worker.done:
            worker.progress.epoch += 1
            worker.progress.batches_in_epoch = 0
    encoder.close()
    evaluate_and_checkpoint(worker, final=True)
    if worker.tracking is not None:
        worker.tracking.end()


def start(config: dict) -> Worker:
    """Seeds, the model and optimizer (from the last checkpoint when there is one), DDP, rank 0's run."""
    import ray.train
    import ray.train.torch

    cfg = XHConfig.model_validate(config["cfg"])
    plan = StepPlan(**config["plan"])
    train = cfg.train
    context = ray.train.get_context()
    start_worker(train.seed, train.threads_per_worker)
    device = ray.train.torch.get_device()
    checkpoint = ray.train.get_checkpoint()
    progress = Progress()
    if checkpoint is not None:
        with checkpoint_folder(checkpoint) as folder:
            model = load_saved(str(Path(folder) / MODEL_DIR))
            tokenizer = load_tokenizer(str(Path(folder) / MODEL_DIR))
            optimizer, scheduler = adamw_with_warmup(
                parameter_groups(model, train), plan.total_steps, train.warmup_fraction
            )
            progress = load_training_state(folder, optimizer, scheduler)
    else:
        model, tokenizer = new_model(cfg.model), load_tokenizer(cfg.model.backbone)
        optimizer, scheduler = adamw_with_warmup(
            parameter_groups(model, train), plan.total_steps, train.warmup_fraction
        )
    # Every parameter gets a gradient in every step (each architecture's loss touches all its outputs,
    # `tests/unit/train/test_train_ddp.py`), so DDP need not walk the autograd graph again for unused ones.
    ddp_model = ray.train.torch.prepare_model(model, parallel_strategy_kwargs={"find_unused_parameters": False})
    nodes = _worker_nodes(context.get_world_size())
    rank = context.get_world_rank()
    tracking = open_run(cfg, config, progress, nodes) if rank == 0 else None
    trainer = Trainer(
        model, ddp_model, optimizer, scheduler, train, device, progress, StepMeter(tracking, plan.workers)
    )
    worker = Worker(config, cfg, plan, rank, trainer, tokenizer, tracking, first_step=progress.step)
    if rank == 0:
        shard = ray.train.get_dataset_shard("dev")
        worker.dev_rows = [row for b in shard.iter_batches(batch_format="pyarrow") for row in b.to_pylist()]
    model.train()
    return worker


def open_run(cfg: XHConfig, config: dict, progress: Progress, nodes: list[str]) -> TrainingRun:
    """Rank 0's MLflow run (resumed when the checkpoint names one), with the run's lineage logged."""
    import mlflow

    tracking = TrainingRun(cfg, "train", run_name=cfg.train.run_name, run_id=progress.mlflow_run_id)
    progress.mlflow_run_id = tracking.run_id
    mlflow.set_tag("worker_nodes", str(len(set(nodes))))
    # the graphs table's own settings (edge mode, node counts, ...), as its build recorded them
    log_graph_settings(mlflow, config.get("graph_settings") or {})
    log_split(mlflow, config.get("split"), config.get("inputs") or [])
    return tracking


def epoch_batches(worker: Worker, encoder: GraphEncoder, feed: dict[str, float]) -> Prefetcher:
    """This epoch's batches, encoded and batched ahead in a background thread (`feed`: its seconds by part
    of the chain); resuming skips what the checkpoint trained on."""
    import ray.train

    train, progress = worker.cfg.train, worker.progress
    layout, arch = BatchLayout.of(worker.cfg), architecture(worker.model)
    rows = ray.train.get_dataset_shard("train").iter_batches(
        batch_size=train.batch_graphs,
        batch_format="pyarrow",
        drop_last=not layout.packed,
        local_shuffle_buffer_size=train.batch_graphs * 16,
        local_shuffle_seed=train.seed + progress.epoch,
    )
    tables = timed(rows, feed, "data")
    if arch.encodes_graphs:
        # tables, not dicts: the encoder's processes convert them, off this process's busy thread
        encoded = timed(encoder.map(tables), feed, "encoded")
        made = timed(layout.batches(encoded, progress.batches_in_epoch, worker.plan.batches_per_epoch), feed, "batched")
    else:  # its own batches (DocHopper: paragraphs without the question): no packing
        tables = itertools.islice(tables, progress.batches_in_epoch, worker.plan.batches_per_epoch)
        max_tokens = worker.cfg.model.max_node_tokens
        made = (arch.collate(worker.model, t.to_pylist(), worker.tokenizer, max_tokens) for t in tables)
    return Prefetcher(made, depth=2, pin_memory=worker.trainer.device.type == "cuda")


def train_epoch(worker: Worker, encoder: GraphEncoder) -> None:
    """The steps of one epoch (or what is left of it), with a dev evaluation and checkpoint every
    `train.eval_every` steps; the epoch's figures at its end."""
    trainer, train = worker.trainer, worker.cfg.train
    feed: dict[str, float] = {}
    prefetched = epoch_batches(worker, encoder, feed)
    stream = in_lockstep(prefetched, trainer.device) if BatchLayout.of(worker.cfg).packed else prefetched
    stats, epoch_start = BatchStats(), time.perf_counter()
    encodes_graphs = architecture(worker.model).encodes_graphs
    for host_batch in stream:
        if encodes_graphs:
            stats.add(host_batch)  # on the host: no wait for the device
        output = trainer.forward_backward(host_batch)
        if not trainer.step_due():
            continue
        trainer.optimizer_step(output)
        step_done(worker)
        if worker.done:
            break
        if train.eval_every and worker.progress.step % train.eval_every == 0:
            evaluate_and_checkpoint(worker, final=False)
    prefetched.close()
    if worker.tracking is not None and stats.batches:
        trainer.meter.flush()
        if trainer.device.type == "cuda":
            import torch

            torch.cuda.synchronize(trainer.device)  # the epoch's time includes its last steps' kernels
        seconds = time.perf_counter() - epoch_start
        worker.tracking.log(worker.progress.step, epoch_figures(stats, prefetched, feed, seconds, trainer.device))


def step_done(worker: Worker) -> None:
    """After each optimizer step: every `train.log_every` steps, rank 0 flushes the step figures (the only
    read-back between checkpoints) and prints the progress line. Tests patch this to stop a worker."""
    step, every = worker.progress.step, worker.cfg.train.log_every
    if worker.tracking is None or not every or step % every:
        return
    meter = worker.trainer.meter
    graphs, window_s = meter.last_window
    last = meter.flush()
    done_here = (step - worker.first_step, time.perf_counter() - worker.started)
    log_progress(step, worker.plan.total_steps, last["loss"], graphs * worker.plan.workers, window_s, done_here)


def evaluate_and_checkpoint(worker: Worker, final: bool) -> None:
    """Every worker reports; rank 0 evaluates on dev, logs, and attaches the checkpoint (weights, optimizer,
    progress). The final one also logs the training curves and, when asked, the hop-attention figures."""
    import mlflow

    progress, trainer = worker.progress, worker.trainer
    metrics: dict = {"step": progress.step, "epoch": progress.epoch}
    if worker.rank != 0:
        report(metrics)
        return
    trainer.meter.flush()
    dev_metrics, recorder, batches = evaluate_worker(worker, final)
    metrics |= dev_metrics
    progress.metrics = {k: v for k, v in metrics.items() if k.startswith("dev_")}
    worker.tracking.log(progress.step, progress.metrics)
    state = (worker.model, trainer.optimizer, trainer.scheduler, progress)
    report(metrics, save=lambda folder: save_training_state(folder, *state))
    worker.tracking.flush()  # after the report: steps since the previous checkpoint are now final
    if final:
        from xh.train.figures import log_attention_figures, log_training_curves

        log_training_curves(mlflow, worker.tracking.run_id)
        if recorder is not None:
            log_attention_figures(recorder, batches, mlflow)


def evaluate_worker(worker: Worker, final: bool) -> tuple[dict, object, list]:
    """Rank 0's dev metrics (FEVER: the official files logged too); at the end, with `train.attention_figures`,
    also the hop-attention recorder and the batches it saw. The model is back in training mode after."""
    import mlflow

    model, cfg, missed = worker.model, worker.cfg, list(worker.config.get("dev_missed") or [])
    recorder, batches, official = None, [], {}
    if final and cfg.train.attention_figures and getattr(model, "hop_steps", None):
        from xh.train.figures import HopAttentionRecorder

        with HopAttentionRecorder(model) as recorder:
            metrics = evaluate_dev(model, worker.tokenizer, worker.dev_rows, cfg, batches, official, missed)
    else:
        metrics = evaluate_dev(model, worker.tokenizer, worker.dev_rows, cfg, official=official, missed=missed)
    if official:
        _log_fever_files(mlflow, official, worker.progress.step)
    model.train()
    return metrics, recorder, batches
