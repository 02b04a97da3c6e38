"""What every driver shares: joining Ray, and its workers' log lines."""

from __future__ import annotations

import logging
import os
import sys

from xh.config import XHConfig
from xh.storage.store import Store

# Set by Ray in the environment of a job's driver.
RAY_JOB_CONFIG_JSON_ENV_VAR = "RAY_JOB_CONFIG_JSON_ENV_VAR"


def quiet_ray_workers() -> None:
    """Run in every Ray worker of a stage (a `worker_process_setup_hook`): Ray's own warnings off, the
    project's progress lines on; Ray forwards a worker's stderr to the driver and to `ray job logs`."""
    logging.getLogger("ray").setLevel(logging.ERROR)
    logger = logging.getLogger("xh")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s [%(name)s] %(message)s", "%H:%M:%S"))
        logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False  # Ray's root handler would print each line a second time


def verbose() -> bool:
    return logging.getLogger("xh").isEnabledFor(logging.DEBUG)


def init_ray(cfg: XHConfig, worker_output: bool = True) -> None:
    """Join the configured cluster, or start a local one in-process; a driver already connected is kept.

    `worker_output=False` (the demo): the workers' output stays in Ray's session files unless -v, so the
    console shows the driver's stage lines and summary only."""
    import ray

    if ray.is_initialized():
        return
    # A driver started by `ray job submit` already runs in the job's runtime env (which carries the S3
    # settings, see infra/submit.sh); passing them again makes Ray refuse to merge the two.
    in_job = RAY_JOB_CONFIG_JSON_ENV_VAR in os.environ
    # Unset address: a job's driver (or RAY_ADDRESS) joins its cluster; otherwise "local" starts a new
    # in-process cluster, never one that happens to run on this machine already.
    address = cfg.ray.address or (None if in_job or os.environ.get("RAY_ADDRESS") else "local")
    local = address == "local"
    runtime_env = Store.from_config(cfg).s3.ray_runtime_env()
    if not verbose():
        runtime_env["worker_process_setup_hook"] = "workflows.common.quiet_ray_workers"
        # MLflow's "Downloading artifacts" and transformers' "Loading weights" bars (the driver, score
        # actors, Serve replicas loading a version)
        quiet = {"MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
        os.environ.update(quiet)
        runtime_env["env_vars"] = {**runtime_env.get("env_vars", {}), **quiet}
        if "transformers" in sys.modules:  # imported already: it read the variable then
            sys.modules["transformers"].utils.logging.disable_progress_bar()
        elif "huggingface_hub" in sys.modules:
            sys.modules["huggingface_hub"].utils.disable_progress_bars()
    ray.init(
        address=address,
        num_cpus=cfg.ray.num_cpus if local else None,
        include_dashboard=False if local else None,
        runtime_env=None if in_job else runtime_env,
        logging_level=logging.INFO if verbose() else logging.ERROR,
        log_to_driver=worker_output or verbose(),
    )
    import ray.data

    # Ray Data logs each dataset's plan and, off a terminal, its progress as INFO lines by the hundred:
    # a terminal gets its progress bars, anything else (CI, `ray job logs`) the stage lines only.
    # Unless -v, warnings too ("no available CPUs" while Train or Serve hold them): errors only.
    logging.getLogger("ray.data").setLevel(logging.INFO if verbose() else logging.ERROR)
    logging.getLogger("ray.serve").setLevel(logging.INFO if verbose() else logging.ERROR)
    ray.data.DataContext.get_current().enable_progress_bars = verbose() or (worker_output and sys.stderr.isatty())
