"""The actor pools of batch scoring (`xh.stages.score_actors.Pools`) on the real two-node cluster: a pool
starts when the run starts where the cluster has room for it and for the run's tasks; one that would
leave no room starts only when its stage asks for it, and is placed once the pool before it has stopped.
The model actors' options as Ray accepts them, with and without GPUs."""

from __future__ import annotations

import os

import pytest

from xh.config import load_config
from xh.stages.score import model_options
from xh.stages.score_actors import ModelActor, Pools

pytestmark = pytest.mark.integration


class _Probe:
    def pid(self) -> int:
        return os.getpid()


def test_pools_start_early_where_the_cluster_has_room_and_late_where_it_has_not(ray_cluster):
    import ray

    pools = Pools(ray.cluster_resources()["CPU"])  # 2 CPUs: 1.75 for pools, 0.25 kept for the run's tasks
    try:
        pools.add("graphs", _Probe, 2, {"num_cpus": 0.5})
        pools.add("models", _Probe, 2, {"num_cpus": 0.5})  # 2.0 with the graphs: not now
        assert set(pools.started) == {"graphs"}
        assert len({ray.get(a.pid.remote(), timeout=120) for a in pools.actors("graphs")}) == 2
        # a task of the run still finds a CPU while the early pool holds its share
        assert ray.get(ray.remote(num_cpus=0.25)(lambda: 1).remote(), timeout=120) == 1
        models = pools.actors("models")  # asked for by its stage: started, placed when there is room
        pools.stop("graphs")
        assert len({ray.get(a.pid.remote(), timeout=120) for a in models}) == 2
        pools.add("late", _Probe, 1, {"num_cpus": 0.25}, early=False)  # a pool its stage may not need
        assert "late" not in pools.started
    finally:
        pools.stop()
    assert pools.started == {}


@pytest.mark.parametrize("use_gpu", [False, True])
def test_ray_accepts_the_model_actors_options_with_and_without_gpus(ray_cluster, use_gpu):
    import ray

    sc = load_config(None, ["score.inference_cpus=0.5"]).score
    options = model_options(sc, use_gpu)
    assert options == {"num_cpus": 0.5, "num_gpus": 1 if use_gpu else 0}
    ray.remote(ModelActor).options(**options)  # Ray checks the options here; nothing is started
