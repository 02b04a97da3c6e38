"""Moving `@champion`: the promotion decision (a compare-and-swap under the registry lock) and rollback, each
replaced version kept in the registered model's `champion_history` tag.

The locked step writes the history first and moves the alias second. A promotion killed between the two
leaves a history whose last entry is still the champion; every reader drops such trailing entries
(`champion_history`), so neither a later promotion nor a rollback ever steps to the version that is
champion already.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Sequence

import mlflow

from xh.config import ConfigError
from xh.registry import lock
from xh.registry.evaluation import evaluate_version
from xh.registry.versions import version_loads, version_of
from xh.tracking import tracking_store

HISTORY_TAG = "champion_history"  # JSON list of every version @champion replaced, oldest first
DECISION_TAG = "promotion_decision"  # the last decision about a version, on that version


def promote(
    name: str,
    rows: Sequence[dict],
    *,
    metric: str = "f1",
    min_delta: float = 0.5,
    floor: float = 0.0,
    task: str = "hotpot",
    challenger_version: str | None = None,
    lease_timeout_s: float = 600.0,
    missed: Sequence[str] = (),
    evaluate=None,
    dry_run: bool = False,
    on_evaluated: Callable[[str, dict, list], None] | None = None,
    notes: dict | None = None,
) -> dict:
    """Move `@champion` to `@challenger` (or `challenger_version`) if it wins on `rows` by `min_delta` points
    (metrics x 100); the first model, or one facing an unloadable champion, must pass `floor`.

    Returns the decision (also written as a tag on the challenger version, except in a dry run); a challenger
    that fails to load, whose signature differs or whose metric is missing is never promoted, and the reason
    is returned. The alias moves as a compare-and-swap: under the registry lock `@champion` is read again, and
    if another promotion moved it meanwhile, the challenger is judged against the new champion (outside the
    lock: evaluation is long) and the swap is tried again. `missed`: ids of evaluation questions without a
    graph; both models score 0 on them (the official rule). `evaluate`: `evaluate_version`'s signature (the
    default: it, in this process); its result's `predictions`, when present, go to `on_evaluated(version,
    metrics, predictions)` with the metrics. `dry_run`: judge and return the decision (`would_promote`),
    writing nothing to the registry. `notes`: more fields of the decision (the eval set, the decision run).
    """
    client = mlflow.MlflowClient()
    if challenger_version is not None:
        challenger = client.get_model_version(name, str(challenger_version))
    else:
        challenger = version_of(client, name, "challenger")
    champion = version_of(client, name, "champion")
    decision: dict = {"model": name, "metric": metric, "min_delta": min_delta, "floor": floor, "promoted": False}
    decision |= {"challenger": challenger and challenger.version, "champion": champion and champion.version}
    decision |= {"decided_at": _now(), **(notes or {})} | ({"dry_run": True} if dry_run else {})
    if challenger is None:
        return decision | {"reason": f"{name} has no @challenger"}
    if champion is not None and champion.version == challenger.version:
        return decision | {"reason": "the challenger already is the champion"}
    judge = _Judge(name, challenger.version, rows, task, missed, evaluate or evaluate_version, on_evaluated)
    record = (lambda verdict: verdict) if dry_run else (lambda verdict: _record(client, name, verdict, challenger))
    try:
        decision["challenger_score"] = judge.score(challenger.version, metric)
    except Exception as e:  # any failure of the challenger is a reason not to promote it
        return record(decision | {"reason": f"challenger evaluation failed: {e}".splitlines()[0]})
    verdict = judge.verdict(decision, champion and champion.version, min_delta, floor)
    if dry_run:
        return verdict | {"would_promote": verdict["promoted"], "promoted": False}
    while verdict["promoted"]:  # compare-and-swap: the champion judged against must still be the champion
        try:
            moved_to = _swap(client, name, verdict["champion"], challenger.version, lease_timeout_s)
        except TimeoutError as e:
            return record(verdict | {"promoted": False, "reason": str(e)})
        if moved_to is None:
            break
        verdict = judge.verdict(decision, moved_to, min_delta, floor)  # another promotion won meanwhile
    return record(verdict)


class _Judge:
    """A challenger's judgement: each version evaluated once on the rows, its score or why it has none."""

    def __init__(self, name, challenger, rows, task, missed, evaluate, on_evaluated):
        self.name, self.challenger, self.rows, self.task, self.missed = name, challenger, rows, task, missed
        self.evaluate, self.on_evaluated = evaluate, on_evaluated
        self.scores: dict[str, float | str] = {}  # version -> score, or why it could not be evaluated

    def score(self, version: str, metric: str) -> float:
        found = dict(self.evaluate(self.name, version, self.rows, self.task, self.missed))
        predictions = found.pop("predictions", None)
        if self.on_evaluated is not None:
            self.on_evaluated(version, found, predictions or [])
        if metric not in found:
            raise ValueError(f"no metric '{metric}'")
        return 100 * found[metric]

    def verdict(self, decision: dict, champion: str | None, min_delta: float, floor: float) -> dict:
        verdict = {k: v for k, v in decision.items() if k != "champion_score"}
        verdict |= {"champion": champion, "decided_at": _now()}
        if champion == self.challenger:
            return verdict | {"promoted": False, "reason": "the challenger already is the champion"}
        if champion is not None and champion not in self.scores:
            try:
                self.scores[champion] = self.score(champion, decision["metric"])
            except Exception as e:  # a champion that cannot be scored is no obstacle, but the floor is
                self.scores[champion] = f"{type(e).__name__}: {e}".splitlines()[0]
        score, against = decision["challenger_score"], self.scores.get(champion) if champion is not None else None
        if isinstance(against, float):
            promoted = score >= against + min_delta
            reason = f"{score:.2f} vs champion {against:.2f} (needs +{min_delta})"
            return verdict | {"champion_score": against, "promoted": promoted, "reason": reason}
        promoted = score >= floor
        first = "first model" if champion is None else f"champion unloadable ({against})"
        return verdict | {
            "promoted": promoted,
            "reason": f"{first}: {score:.2f} {'>=' if promoted else '<'} floor {floor}",
        }


def _swap(client, name: str, expected: str | None, challenger: str, lease_timeout_s: float) -> str | None:
    """Under the registry lock, move `@champion` from `expected` to `challenger`: None when moved, else the
    version that is champion now (another promotion moved it). History first, alias second (module doc)."""
    owner = uuid.uuid4().hex
    lock.acquire_lease(client, name, owner, lease_timeout_s)
    try:
        current = version_of(client, name, "champion")
        current_version = current and current.version
        if current_version != expected:
            return current_version
        if current_version is not None:
            history = champion_history(client, name, current_version) + [current_version]
            client.set_registered_model_tag(name, HISTORY_TAG, json.dumps(history))
        client.set_registered_model_alias(name, "champion", challenger)
        return None
    finally:
        lock.release_lease(client, name, owner)


def rollback(name: str) -> dict:
    """Give `@champion` back to the version it replaced (the last of `champion_history`), if that one loads."""
    client = mlflow.MlflowClient()
    try:
        current = version_of(client, name, "champion")
        history = champion_history(client, name, current and current.version)
    except mlflow.exceptions.MlflowException as e:  # a misspelt name: one line, as for any setting
        if e.error_code != "RESOURCE_DOES_NOT_EXIST":
            raise
        raise ConfigError(
            f"promote.model: no registered model {name!r} in the tracking store {tracking_store()}"
        ) from None
    if not history:
        raise ConfigError(f"{name} has no previous champion to roll back to")
    previous = history[-1]
    problem = version_loads(name, previous)
    if problem is not None:
        raise ConfigError(f"{name} version {previous} does not load, @champion left as it is: {problem}")
    owner = uuid.uuid4().hex
    lock.acquire_lease(client, name, owner, lock.LEASE_TTL_S)
    try:
        now = version_of(client, name, "champion")
        now_version = now and now.version
        if now_version != (current and current.version) or champion_history(client, name, now_version) != history:
            raise ConfigError(f"{name}'s champion changed during the rollback; run it again")
        client.set_registered_model_alias(name, "champion", previous)
        client.set_registered_model_tag(name, HISTORY_TAG, json.dumps(history[:-1]))
    finally:
        lock.release_lease(client, name, owner)
    return {"model": name, "champion": previous, "rolled_back_from": current and current.version}


def champion_history(client, name: str, champion: str | None = None) -> list[str]:
    """The versions `@champion` pointed to before `champion` (the current one), oldest first: the
    `champion_history` tag less its trailing entries naming `champion` (left by a promotion killed between
    writing the history and moving the alias)."""
    tags = client.get_registered_model(name).tags
    history = [str(v) for v in json.loads(tags.get(HISTORY_TAG) or "[]")]
    while history and champion is not None and history[-1] == str(champion):
        history.pop()
    return history


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _record(client, name: str, decision: dict, version) -> dict:
    client.set_model_version_tag(name, version.version, DECISION_TAG, json.dumps(decision))
    return decision
