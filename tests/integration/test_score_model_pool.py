"""The actor pools of batch scoring (`xh.stages.score_actors.Pools`) on the real two-node cluster: a pool
starts when the run starts where the cluster has room for it and for the run's tasks; one that would
leave no room starts only when its stage asks for it, and is placed once the pool before it has stopped.
The model actors' options as Ray accepts them, with and without GPUs."""

from __future__ import annotations

import os

import pytest

from xh.config import load_config
from xh.stages.score import model_options
from xh.stages.score_actors import TASK_CPUS, ModelActor, Pools, _Worker

pytestmark = pytest.mark.integration


def _pid() -> int:
    return os.getpid()


class _Probe(_Worker):
    def pid(self) -> int:
        return os.getpid()


def test_pools_start_where_the_cluster_has_room_and_the_run_keeps_a_cpu_share_for_its_tasks(ray_cluster):
    import ray

    pools = Pools(ray.cluster_resources()["CPU"])  # 2 CPUs
    pools.add("graphs", _Probe, 2, {"num_cpus": 0.5})
    pools.add("models", _Probe, 3, {"num_cpus": 0.5})
    try:
        room = pools.cpus - TASK_CPUS
        assert len(pools.start("graphs", 2, room=room)) == 2
        assert pools.start("models", 2, room=room) == []  # 2.0 CPUs with the graphs: no room for a task
        assert len(pools.start("models", 1, room=room)) == 1
        assert pools.held() == 1.5 and pools.held({"models": 3}) == 2.5
        # a task of the run still finds its share while the pools hold theirs
        assert ray.get(ray.remote(num_cpus=TASK_CPUS)(lambda: 1).remote(), timeout=120) == 1
        assert len({ray.get(a.pid.remote(), timeout=120) for a in pools.start("graphs", 2)}) == 2
        assert pools.wanted("models", rows=10, batch_size=4) == 3 and pools.wanted("models", 1, 4) == 1
        models = pools.start("models", 3)  # without room: started, placed once the graph pool has gone
        pools.stop("graphs")
        assert len({ray.get(a.pid.remote(), timeout=120) for a in models}) == 3
        assert pools.call(_pid) in {ray.get(a.pid.remote()) for a in models}  # in a warm actor
    finally:
        pools.stop()
    assert pools.started == {}
    assert pools.call(_pid) != os.getpid()  # no actor left: a task


@pytest.mark.parametrize("use_gpu", [False, True])
def test_ray_accepts_the_model_actors_options_with_and_without_gpus(ray_cluster, use_gpu):
    import ray

    sc = load_config(None, ["score.inference_cpus=0.5"]).score
    options = model_options(sc, use_gpu)
    assert options == {"num_cpus": 0.5, "num_gpus": 1 if use_gpu else 0}
    ray.remote(ModelActor).options(**options)  # Ray checks the options here; nothing is started
