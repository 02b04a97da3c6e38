"""What every driver shares: the `python -m workflows.<stage>` entry point and joining Ray."""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Callable, Sequence

from xh.config import ConfigError, XHConfig, from_argv
from xh.storage import S3Settings

# Set by Ray in the environment of a job's driver.
RAY_JOB_CONFIG_JSON_ENV_VAR = "RAY_JOB_CONFIG_JSON_ENV_VAR"

# Errors a user can fix by changing a flag or a path: one line, exit code 2, no traceback.
USER_ERRORS = (ConfigError, FileNotFoundError)


def log(stage: str, message: str) -> None:
    """Progress on stderr (stdout carries the JSON summary line)."""
    print(f"{time.strftime('%H:%M:%S')} [{stage}] {message}", file=sys.stderr, flush=True)


def s3_settings(cfg: XHConfig) -> S3Settings:
    return S3Settings.from_env(endpoint_url=cfg.storage.s3_endpoint_url, region=cfg.storage.s3_region)


def init_ray(cfg: XHConfig) -> None:
    """Join the configured cluster, or start a local one in-process; a driver already connected is kept."""
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
    ray.init(
        address=address,
        num_cpus=cfg.ray.num_cpus if local else None,
        include_dashboard=False if local else None,
        runtime_env=None if in_job else s3_settings(cfg).ray_runtime_env(),
    )


def main(stage: str, run: Callable[[XHConfig], dict], argv: Sequence[str] | None = None) -> None:
    """Parse `--config/--set`, run the stage, print its summary as one JSON line."""
    try:
        summary = run(from_argv(argv, prog=f"python -m workflows.{stage}"))
    except USER_ERRORS as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    print(json.dumps(summary, sort_keys=True))
