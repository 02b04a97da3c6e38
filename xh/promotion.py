"""Promotion's evaluation as a Ray stage: each version's predictions on an actor pool (one GPU per actor
where the cluster has GPUs), the official metrics on the driver.

    evaluate = on_ray(tracking_uri)                     # evaluate_version's signature
    decision = promote("xh-hotpot", rows, evaluate=evaluate, ...)

The rows are cut into contiguous shards, one per actor, and the predictions joined in the rows' order
(FEVER's scorer pairs gold and predictions by line). Each actor loads the version from its data alone
(`xh.registry.load_registered`), so no code from the artifact store runs on the cluster either.
"""

from __future__ import annotations

from collections.abc import Sequence


class VersionPredictor:
    """One actor: a registered version loaded once, predicting shards of graph rows."""

    def __init__(self, tracking_uri: str, name: str, version: str):
        import mlflow

        mlflow.set_tracking_uri(tracking_uri)  # credentials, if any, come from the worker's environment
        self.name, self.version = name, version

    def predict(self, rows: Sequence[dict]) -> list[dict]:
        from xh.registry import version_predictions

        return version_predictions(self.name, self.version, rows)


def pool_size(rows: int, gpus: float, actors: int | None = None) -> int:
    """Actors for `rows` rows: `actors`, or one per GPU of the cluster (one on a CPU cluster), never more than
    the rows, and at least one (so that a version that does not load is still found out)."""
    return max(1, min(actors or int(gpus) or 1, rows))


def on_ray(tracking_uri: str, actors: int | None = None, cpus_per_actor: float = 1.0):
    """`evaluate_version` on the connected Ray cluster: an actor pool per evaluated version (`pool_size`)."""
    import ray

    from xh.registry import official_metrics

    def evaluate(name: str, version: str, rows: Sequence[dict], task: str, missed: Sequence[str] = ()) -> dict:
        gpus = ray.cluster_resources().get("GPU", 0)
        size_of_pool = pool_size(len(rows), gpus, actors)
        remote = ray.remote(num_cpus=cpus_per_actor, num_gpus=1 if gpus else 0)(VersionPredictor)
        pool = [remote.remote(tracking_uri, name, str(version)) for _ in range(size_of_pool)]
        size = -(-len(rows) // size_of_pool)
        shards = [list(rows[i * size : (i + 1) * size]) for i in range(size_of_pool)]
        try:
            parts = ray.get([actor.predict.remote(shard) for actor, shard in zip(pool, shards)])
        except ray.exceptions.RayTaskError as e:  # the version's own failure, as evaluate_version raises it
            raise e.as_instanceof_cause() from None
        finally:
            for actor in pool:
                ray.kill(actor)
        return official_metrics(rows, [p for part in parts for p in part], task, missed)

    return evaluate
