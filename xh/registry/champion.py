"""Moving `@champion`: promotion (a compare-and-swap under the registry lock) and rollback, each replaced
version kept in the registered model's `champion_history` tag."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Sequence

import mlflow

from xh.config import ConfigError
from xh.registry import lock
from xh.registry.evaluation import evaluate_version
from xh.registry.versions import version_loads, version_of
from xh.tracking import tracking_store

PREVIOUS_CHAMPION_TAG = "previous_champion"  # the last of HISTORY_TAG (kept for older readers)
HISTORY_TAG = "champion_history"  # JSON list of every version @champion replaced, oldest first


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
    eval_set: str | None = None,
    decision_run_id: str | None = None,
    evaluate=None,
    pipeline_drift: dict | None = None,
) -> dict:
    """Move `@champion` to `@challenger` if it wins on `rows` by `min_delta` points (metrics x 100).

    Returns the decision (also written as a tag on the challenger version); a challenger that fails to
    load, whose signature differs or whose metric is missing is never promoted, and the reason is
    returned. A champion that cannot be loaded or evaluated is compared against nothing: the challenger
    must then pass `floor`, like a first model.

    The alias moves as a compare-and-swap: under the registry lock (`LOCK_SUFFIX`) `@champion` is read
    again, and if another promotion moved it meanwhile, the lock is given back, the challenger is evaluated
    against the new champion, and the swap is tried again. The decision names the champion it was compared against (`champion`); every
    replaced version is appended to the registered model's `champion_history` tag. `missed`: ids of
    evaluation questions quarantined at graph building; both models score 0 on them (the official rule).
    `eval_set` (what the rows are, `evaluation_set`) and `decision_run_id` (the MLflow run that logs the
    decision and its eval set as an input) go into the decision. `evaluate`: how a version is evaluated,
    `evaluate_version`'s signature (default: it, in this process; `xh.promotion.on_ray`: an actor pool).
    `pipeline_drift`: the graph settings of the rows that differ from the challenger's, opted into
    (`eval_graph_drift`); recorded in the decision.
    """
    evaluate = evaluate or evaluate_version
    client = mlflow.MlflowClient()
    if challenger_version is not None:
        challenger = client.get_model_version(name, str(challenger_version))
    else:
        challenger = version_of(client, name, "challenger")
    champion = version_of(client, name, "champion")
    decision: dict = {
        "model": name,
        "metric": metric,
        "min_delta": min_delta,
        "floor": floor,
        "challenger": challenger and challenger.version,
        "champion": champion and champion.version,
        "promoted": False,
        "decided_at": _now(),
    }
    if eval_set is not None:
        decision |= {"eval_set": eval_set, "eval_questions": len(rows) + len(missed)}
    if decision_run_id is not None:
        decision["decision_run_id"] = decision_run_id
    if pipeline_drift:
        decision["pipeline_drift"] = pipeline_drift
    if challenger is None:
        return decision | {"reason": f"{name} has no @challenger"}
    if champion is not None and champion.version == challenger.version:
        return decision | {"reason": "the challenger already is the champion"}
    try:
        challenger_metrics = evaluate(name, challenger.version, rows, task, missed)
    except Exception as e:  # any failure of the challenger is a reason not to promote it
        return _record(client, name, decision | {"reason": f"challenger evaluation failed: {e}"}, challenger)
    if metric not in challenger_metrics:
        return _record(client, name, decision | {"reason": f"challenger has no metric '{metric}'"}, challenger)
    score = 100 * challenger_metrics[metric]
    decision["challenger_score"] = score
    champion_scores: dict[str, float | str] = {}  # version -> score, or why it could not be evaluated

    def judge(champion_version: str | None) -> dict:
        verdict = decision | {"champion": champion_version, "decided_at": _now()}
        verdict.pop("champion_score", None)
        if champion_version == challenger.version:
            return verdict | {"reason": "the challenger already is the champion"}
        if champion_version is not None and champion_version not in champion_scores:
            try:
                found = evaluate(name, champion_version, rows, task, missed)
                champion_scores[champion_version] = 100 * found[metric]
            except Exception as e:  # a champion that cannot be scored is no obstacle, but the floor is
                champion_scores[champion_version] = f"{type(e).__name__}: {e}".splitlines()[0]
        against = champion_scores.get(champion_version) if champion_version is not None else None
        if isinstance(against, float):
            verdict["champion_score"] = against
            verdict["promoted"] = score >= against + min_delta
            return verdict | {"reason": f"{score:.2f} vs champion {against:.2f} (needs +{min_delta})"}
        verdict["promoted"] = score >= floor
        first = "first model" if champion_version is None else f"champion unloadable ({against})"
        return verdict | {"reason": f"{first}: {score:.2f} {'>=' if verdict['promoted'] else '<'} floor {floor}"}

    verdict = judge(champion and champion.version)
    if not verdict["promoted"]:
        return _record(client, name, verdict, challenger)
    while True:  # compare-and-swap: the champion judged against must still be the champion
        owner = uuid.uuid4().hex
        try:
            lock.acquire_lease(client, name, owner, lease_timeout_s)
        except TimeoutError as e:
            return _record(client, name, verdict | {"promoted": False, "reason": str(e)}, challenger)
        try:
            current = version_of(client, name, "champion")
            current_version = current and current.version
            if current_version == verdict["champion"]:
                if current_version is not None:
                    history = champion_history(client, name) + [current_version]
                    client.set_registered_model_tag(name, HISTORY_TAG, json.dumps(history))
                    client.set_registered_model_tag(name, PREVIOUS_CHAMPION_TAG, current_version)
                client.set_registered_model_alias(name, "champion", challenger.version)
                return _record(client, name, verdict, challenger)
        finally:
            lock.release_lease(client, name, owner)
        # another promotion won meanwhile: judge against its champion, outside the lock (evaluation is long)
        verdict = judge(current_version)
        if not verdict["promoted"]:
            return _record(client, name, verdict, challenger)


def rollback(name: str) -> dict:
    """Give `@champion` back to the version it replaced (the last of `champion_history`), if that one loads."""
    client = mlflow.MlflowClient()
    try:
        history = champion_history(client, name)
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
        history = champion_history(client, name)
        if not history or history[-1] != previous:
            raise ConfigError(f"{name}'s champion history changed during the rollback; run it again")
        current = version_of(client, name, "champion")
        client.set_registered_model_alias(name, "champion", previous)
        client.set_registered_model_tag(name, HISTORY_TAG, json.dumps(history[:-1]))
        if len(history) > 1:
            client.set_registered_model_tag(name, PREVIOUS_CHAMPION_TAG, history[-2])
        else:
            client.delete_registered_model_tag(name, PREVIOUS_CHAMPION_TAG)
    finally:
        lock.release_lease(client, name, owner)
    return {"model": name, "champion": previous, "rolled_back_from": current and current.version}


def champion_history(client, name: str) -> list[str]:
    """The versions `@champion` pointed to before, oldest first (the `champion_history` tag)."""
    tags = client.get_registered_model(name).tags
    if HISTORY_TAG in tags:
        return [str(v) for v in json.loads(tags[HISTORY_TAG])]
    return [tags[PREVIOUS_CHAMPION_TAG]] if tags.get(PREVIOUS_CHAMPION_TAG) else []


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _record(client, name: str, decision: dict, version) -> dict:
    client.set_model_version_tag(name, version.version, "promotion_decision", json.dumps(decision))
    return decision
