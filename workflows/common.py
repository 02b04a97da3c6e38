"""What every driver shares: the `python -m workflows.<stage>` entry point and joining Ray."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Callable, Sequence

from xh.config import STAGES, ConfigError, XHConfig, check_demo_only, from_argv, storage_uris
from xh.jsonfiles import InputFileError
from xh.storage import S3Settings, StorageSettingsError

# Set by Ray in the environment of a job's driver.
RAY_JOB_CONFIG_JSON_ENV_VAR = "RAY_JOB_CONFIG_JSON_ENV_VAR"

# Errors a user can fix by changing a flag, a path or an input file: one line, exit code 2, no traceback.
USER_ERRORS = (ConfigError, FileNotFoundError, InputFileError, StorageSettingsError)


def log(stage: str, message: str) -> None:
    """One progress line of a stage, on stderr through `logging` (stdout carries the JSON summary line)."""
    logging.getLogger(f"xh.{stage}").info(message)


def configure_logging(verbosity: int = 0) -> None:
    """-q: warnings only; default: one line per stage step; -v: debug, and Ray's own logs on the console.

    Ray's INFO chatter (and the workers' output) goes to its session log files unless -v: a user reads
    the stage lines, Ray Data's progress bars and the summary.
    """
    level = logging.WARNING if verbosity < 0 else logging.DEBUG if verbosity > 0 else logging.INFO
    logging.basicConfig(format="%(asctime)s [%(name)s] %(message)s", datefmt="%H:%M:%S", stream=sys.stderr, force=True)
    logging.getLogger("xh").setLevel(level)
    # Ray's warnings repeat by the hundred on a small machine (Train's controller polling): errors only.
    logging.getLogger("ray").setLevel(logging.INFO if verbosity > 0 else logging.ERROR)
    for library in ("mlflow", "alembic"):
        logging.getLogger(library).setLevel(logging.INFO if verbosity > 0 else logging.WARNING)


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


def split_verbosity(argv: Sequence[str] | None) -> tuple[int, list[str]]:
    """`-q` / `-v` taken off the command line; the rest is the stage's `--config/--set`."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("-q", "--quiet", action="count", default=0)
    parser.add_argument("-v", "--verbose", action="count", default=0)
    known, rest = parser.parse_known_args(sys.argv[1:] if argv is None else list(argv))
    return known.verbose - known.quiet, rest


def s3_settings(cfg: XHConfig) -> S3Settings:
    return S3Settings.from_env(endpoint_url=cfg.storage.s3_endpoint_url, region=cfg.storage.s3_region)


def check_before_ray(cfg: XHConfig, stage: str) -> None:
    """What a stage can refuse before any work (one line, exit 2): `auto` outside the demo, and each s3://
    location it reads without an S3 endpoint configured (the demo's: every section's). URI schemes and
    dates are checked when the config is read (`xh.config.load_config`)."""
    check_demo_only(cfg, stage)
    settings = s3_settings(cfg)
    for _, uri in storage_uris(cfg, None if stage == "demo" else STAGES.get(stage)):
        settings.require_endpoint(uri)


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
    runtime_env = s3_settings(cfg).ray_runtime_env()
    if not verbose():
        runtime_env["worker_process_setup_hook"] = "workflows.common.quiet_ray_workers"
    ray.init(
        address=address,
        num_cpus=cfg.ray.num_cpus if local else None,
        include_dashboard=False if local else None,
        runtime_env=None if in_job else runtime_env,
        logging_level=logging.INFO if verbose() else logging.ERROR,
    )
    import ray.data

    # Ray Data logs each dataset's plan and, off a terminal, its progress as INFO lines by the hundred:
    # a terminal gets its progress bars, anything else (CI, `ray job logs`) the stage lines only.
    logging.getLogger("ray.data").setLevel(logging.INFO if verbose() else logging.WARNING)
    ray.data.DataContext.get_current().enable_progress_bars = verbose() or sys.stderr.isatty()


def main(
    stage: str,
    run: Callable[[XHConfig], dict],
    argv: Sequence[str] | None = None,
    epilogue: Callable[[dict], str] | None = None,
) -> None:
    """Parse `-q/-v --config/--set`, run the stage, print its summary as one JSON line (and, on stderr,
    what `epilogue` makes of it: the demo's table)."""
    verbosity, argv = split_verbosity(argv)
    configure_logging(verbosity)
    try:
        cfg = from_argv(argv, prog=f"python -m workflows.{stage}")
        check_before_ray(cfg, stage)
        summary = run(cfg)
    except USER_ERRORS as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    print(json.dumps(summary, sort_keys=True, default=str))
    if epilogue:
        print("\n" + epilogue(summary), file=sys.stderr)
