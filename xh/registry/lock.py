"""The registry lock of a registered model `NAME`: the registered model `NAME.promotion-lock`.

Creating a registered model is a conditional create in the registry's database (its name is the primary key),
which exactly one of any number of simultaneous promotions wins, whatever the latency of each. It carries
{owner, expires} as tags; an expired lock (a holder that died) is broken by the one process that creates its
break marker."""

from __future__ import annotations

import random
import time

import mlflow

LOCK_SUFFIX = ".promotion-lock"  # the registered model NAME.promotion-lock exists while a promotion holds NAME
LEASE_TTL_S = 120.0  # a lock older than this is a dead holder's: the locked steps take a few registry calls
LOCK_POLL_S = 0.5
# A registered model created per lock, because creation is the one conditional write MLflow offers: the
# store refuses a second model of the same name (RESOURCE_ALREADY_EXISTS, also for SQLite's IntegrityError).
_BUSY = {"RESOURCE_ALREADY_EXISTS", "RESOURCE_DOES_NOT_EXIST"}


def _create(client, lock: str, tags: dict[str, str]) -> bool:
    """Create the registered model `lock`: True for the one caller that did, False when it exists."""
    try:
        client.create_registered_model(lock, tags=tags, description="registry lock of xh promotions; see xh.registry")
        return True
    except Exception as e:  # an embedded SQLite store may answer a simultaneous write with "database is locked"
        if getattr(e, "error_code", None) in _BUSY or "database is locked" in str(e):
            return False
        raise


def _read_lock(client, lock: str) -> dict | None:
    try:
        return dict(client.get_registered_model(lock).tags)
    except mlflow.exceptions.MlflowException as e:
        if e.error_code == "RESOURCE_DOES_NOT_EXIST":
            return None
        raise


def _expired(held: dict) -> bool:
    try:
        return float(held.get("expires", 0)) < time.time()
    except ValueError:
        return True


def _delete(client, lock: str) -> None:
    try:
        client.delete_registered_model(lock)
    except mlflow.exceptions.MlflowException as e:
        if e.error_code != "RESOURCE_DOES_NOT_EXIST":
            raise


def _break(client, lock: str, dead_owner: str) -> None:
    """Remove the expired lock of `dead_owner`. Of all processes that found it expired, only the one that
    creates its break marker removes it, and only while it still is `dead_owner`'s: a later holder's lock is
    never removed by a slow breaker. A marker left by a breaker that died expires too."""
    marker = f"{lock}.broken-{dead_owner}"
    if not _create(client, marker, {"expires": str(time.time() + LEASE_TTL_S)}):
        left = _read_lock(client, marker)
        if left is not None and _expired(left):
            _delete(client, marker)
        return
    try:
        held = _read_lock(client, lock)
        if held is not None and held.get("owner") == dead_owner and _expired(held):
            _delete(client, lock)
    finally:
        _delete(client, marker)


def acquire_lease(client, name: str, owner: str, timeout_s: float) -> None:
    """Hold `name`'s registry lock as `owner`, waiting up to `timeout_s` for its holder (TimeoutError)."""
    lock = name + LOCK_SUFFIX
    deadline = time.monotonic() + timeout_s
    while True:
        if _create(client, lock, {"owner": owner, "expires": str(time.time() + LEASE_TTL_S), "model": name}):
            return
        held = _read_lock(client, lock)
        if held is not None and _expired(held):
            _break(client, lock, held.get("owner", ""))
            continue
        if time.monotonic() > deadline:
            holder = (held or {}).get("owner", "?")
            raise TimeoutError(
                f"another promotion ({holder}) holds {name}'s registry lock (the registered model {lock}); "
                "try again later"
            )
        time.sleep(LOCK_POLL_S * (1 + random.random()))


def release_lease(client, name: str, owner: str) -> None:
    lock = name + LOCK_SUFFIX
    held = _read_lock(client, lock)
    if held is not None and held.get("owner") == owner:
        _delete(client, lock)
