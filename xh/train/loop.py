"""The Ray Train worker loop of Transformer-XH: DDP over the `graphs` table, checkpoints, rank-0 MLflow logging.

`train_loop_per_worker(config)` is what `workflows.train` hands to `TorchTrainer`; `config` holds the
whole `XHConfig` (as a dict) and the step plan the driver computed:

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
import logging
import os
import time
from pathlib import Path

from xh.config import TrainConfig, XHConfig
from xh.eval.official import official_metrics
from xh.graph.encode import GraphEncoder
from xh.inference import autocast, predict_graphs
from xh.model import XHModel, load_tokenizer
from xh.model.variants import architecture, load_saved, new_model
from xh.tracking import TrainingRun
from xh.train.batching import BatchLayout, BatchStats, in_lockstep
from xh.train.prefetch import Prefetcher, timed
from xh.train.split import SPLIT_ARTIFACT, in_dev_split  # noqa: F401 (in_dev_split: re-exported)
from xh.train.state import MODEL_DIR, Progress, load_training_state, save_training_state
from xh.train.worker import StepPlan, adamw_with_warmup, checkpoint_folder, optimizer_step, report, start_worker

FAILURE_MARKER = "xh-injected-failure"  # written next to the checkpoints so a failure is injected once
# Fault injection, for tests only (never a config setting): the rank-0 worker dies once at this step.
FAIL_AT_STEP_ENV = "XH_TRAIN_FAIL_AT_STEP"


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


def injected_failure_env() -> dict:
    """The Ray Train workers' runtime env for fault injection (`RunConfig.worker_runtime_env`): the driver's
    `XH_TRAIN_FAIL_AT_STEP` when a test set it, else nothing. Workers are processes of the cluster, which
    does not see the driver's environment."""
    step = os.environ.get(FAIL_AT_STEP_ENV)
    return {"env_vars": {FAIL_AT_STEP_ENV: step}} if step else {}


def _inject_failure_once(step: int, storage_dir: str) -> None:
    """Testing: the rank-0 worker process dies at step `$XH_TRAIN_FAIL_AT_STEP`, once per run (a marker
    next to the checkpoints remembers)."""
    from xh.store import Store

    if os.environ.get(FAIL_AT_STEP_ENV) != str(step):
        return
    marker = Store().at(storage_dir, FAILURE_MARKER)  # a worker reaches S3 with its environment's settings
    if marker.exists():
        return
    marker.write_bytes(f"failed at step {step}\n".encode())
    os._exit(1)  # a dead worker process, as a crashed node would leave


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
    import torch

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


def train_loop_per_worker(config: dict) -> None:
    import mlflow
    import ray.train
    import ray.train.torch
    import torch

    cfg = XHConfig.model_validate(config["cfg"])
    plan = StepPlan(**config["plan"])
    dev_missed = list(config.get("dev_missed") or [])
    train = cfg.train
    context = ray.train.get_context()
    rank = context.get_world_rank()
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
        model = new_model(cfg.model)
        tokenizer = load_tokenizer(cfg.model.backbone)
        optimizer, scheduler = adamw_with_warmup(
            parameter_groups(model, train), plan.total_steps, train.warmup_fraction
        )
    # Every parameter gets a gradient in every step (each architecture's loss touches all its outputs,
    # `tests/unit/train/test_train_ddp.py`), so DDP need not walk the autograd graph again for unused ones.
    ddp_model = ray.train.torch.prepare_model(model, parallel_strategy_kwargs={"find_unused_parameters": False})

    nodes = _worker_nodes(context.get_world_size())
    tracking = None
    if rank == 0:
        tracking = TrainingRun(cfg, "train", run_name=train.run_name, run_id=progress.mlflow_run_id)
        progress.mlflow_run_id = tracking.run_id
        mlflow.set_tag("worker_nodes", str(len(set(nodes))))
        # the graphs table's own settings (edge mode, node counts, ...), as its build recorded them
        log_graph_settings(mlflow, config.get("graph_settings") or {})
        log_split(mlflow, config.get("split"), config.get("inputs") or [])
    train_shard = ray.train.get_dataset_shard("train")
    dev_rows = (
        [row for b in ray.train.get_dataset_shard("dev").iter_batches(batch_format="pyarrow") for row in b.to_pylist()]
        if rank == 0
        else []
    )

    def checkpoint_and_report(final: bool) -> None:
        metrics: dict = {"step": progress.step, "epoch": progress.epoch}
        if rank != 0:
            report(metrics)
            return
        recorder, batches, official = None, [], {}
        if final and train.attention_figures and getattr(model, "hop_steps", None):
            from xh.train.figures import HopAttentionRecorder

            with HopAttentionRecorder(model) as recorder:
                metrics |= evaluate_dev(model, tokenizer, dev_rows, cfg, batches, official, dev_missed)
        else:
            metrics |= evaluate_dev(model, tokenizer, dev_rows, cfg, official=official, missed=dev_missed)
        if official:
            _log_fever_files(mlflow, official, progress.step)
        model.train()
        progress.metrics = {k: v for k, v in metrics.items() if k.startswith("dev_")}
        tracking.log(progress.step, progress.metrics)
        report(metrics, save=lambda folder: save_training_state(folder, model, optimizer, scheduler, progress))
        tracking.flush()  # after the report: steps since the previous checkpoint are now final
        if final:
            from xh.train.figures import log_attention_figures, log_training_curves

            log_training_curves(mlflow, tracking.run_id)
            if recorder is not None:
                log_attention_figures(recorder, batches, mlflow)

    model.train()
    window_start, window_graphs, window_tokens = time.perf_counter(), 0, 0
    started, first_step = window_start, progress.step  # a resumed run's ETA counts only its own steps
    done = progress.step >= plan.total_steps
    layout, arch = BatchLayout.of(cfg), architecture(model)
    encoder = GraphEncoder(tokenizer, cfg.model.max_node_tokens, train.encode_processes)
    while not done and progress.epoch < train.epochs:
        feed: dict[str, float] = {}  # the background thread's seconds, by part of the chain (`timed`)
        batches = timed(
            train_shard.iter_batches(
                batch_size=train.batch_graphs,
                batch_format="pyarrow",
                drop_last=not layout.packed,
                local_shuffle_buffer_size=train.batch_graphs * 16,
                local_shuffle_seed=train.seed + progress.epoch,
            ),
            feed,
            "data",
        )
        # Encoded and batched ahead, in a background thread; resuming skips what the checkpoint trained on.
        if arch.encodes_graphs:
            # tables, not dicts: the encoder's processes convert them, off this process's busy thread
            encoded = timed(encoder.map(batches), feed, "encoded")
            made = timed(layout.batches(encoded, progress.batches_in_epoch, plan.batches_per_epoch), feed, "batched")
        else:  # its own batches (DocHopper: paragraphs without the question): no packing
            tables = itertools.islice(batches, progress.batches_in_epoch, plan.batches_per_epoch)
            made = (arch.collate(model, t.to_pylist(), tokenizer, cfg.model.max_node_tokens) for t in tables)
        epoch_start, epoch_stats = time.perf_counter(), BatchStats()
        prefetched = Prefetcher(made, depth=2, pin_memory=device.type == "cuda")
        stream = in_lockstep(prefetched, device) if layout.packed else prefetched
        for index, batch in enumerate(stream, start=progress.batches_in_epoch):
            if arch.encodes_graphs:
                epoch_stats.add(batch)  # on the host: no wait for the device
            batch = batch.to(device, non_blocking=True)
            with autocast(device, train.bf16):
                output = ddp_model(batch)
            (output.loss / train.grad_accum).backward()
            progress.batches_in_epoch = index + 1
            window_graphs += batch.num_graphs
            window_tokens += batch.num_real_tokens
            if progress.batches_in_epoch % train.grad_accum:
                continue
            grad_norm = optimizer_step(model, optimizer, scheduler, train.max_grad_norm)
            progress.step += 1
            if tracking is not None:
                seconds = time.perf_counter() - window_start
                tracking.log(
                    progress.step,
                    {
                        "loss": output.loss.item(),
                        "lr": scheduler.get_last_lr()[0],
                        "grad_norm": grad_norm,
                        # this worker's throughput times the workers: every worker runs the same batches
                        "graphs_per_s": window_graphs * plan.workers / seconds,
                        "tokens_per_s": window_tokens * plan.workers / seconds,
                    }
                    | {f"loss_{k}": v.item() for k, v in output.losses.items()},
                )
            if tracking is not None and train.log_every and progress.step % train.log_every == 0:
                done_here = (progress.step - first_step, time.perf_counter() - started)
                log_progress(
                    progress.step,
                    plan.total_steps,
                    output.loss.item(),
                    window_graphs * plan.workers,
                    time.perf_counter() - window_start,
                    done_here,
                )
            window_start, window_graphs, window_tokens = time.perf_counter(), 0, 0
            if rank == 0:
                _inject_failure_once(progress.step, config["storage_dir"])
            done = progress.step >= plan.total_steps
            if done:
                break
            if train.eval_every and progress.step % train.eval_every == 0:
                checkpoint_and_report(final=False)
        prefetched.close()
        if tracking is not None and epoch_stats.batches:
            if device.type == "cuda":
                torch.cuda.synchronize(device)  # the epoch's time includes its last steps' kernels
            tracking.log(
                progress.step,
                epoch_figures(epoch_stats, prefetched, feed, time.perf_counter() - epoch_start, device),
            )
        if not done:
            progress.epoch += 1
            progress.batches_in_epoch = 0
    encoder.close()
    checkpoint_and_report(final=True)
    if tracking is not None:
        tracking.end()
