"""The model actors of batch scoring as Ray Data accepts them, with and without GPUs: a GPU run of
`bench/gpu_ray.py` found `score.use_gpu=true` refused by Ray (GPU actors need a batch size)."""

from __future__ import annotations

import pytest

from xh.config import load_config
from xh.stages.score import _InferenceActor, model_pool

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("use_gpu", [False, True])
def test_ray_data_accepts_the_model_pool_with_and_without_gpus(ray_cluster, use_gpu):
    import ray.data

    sc = load_config(None, ["score.batch_size=32", "score.inference_workers=2"]).score
    options = model_pool(sc, use_gpu)
    # building the plan is where Ray checks the options; nothing runs, so no GPU is needed
    ray.data.range(4).map_batches(_InferenceActor, **options, fn_constructor_args=(None,) * 7)
    assert options["num_gpus"] == (1 if use_gpu else 0)
    assert options["batch_size"] == (32 if use_gpu else None)
