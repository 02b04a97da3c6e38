"""The size of promotion's actor pool (xh.stages.promote.pool_size)."""

from __future__ import annotations

import pytest

from xh.stages.promote import pool_size

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    "rows, gpus, actors, expected",
    [
        (100, 0, None, 1),  # a CPU cluster: one actor
        (100, 4, None, 4),  # one per GPU
        (3, 8, None, 3),  # never more actors than rows
        (0, 2, None, 1),  # an empty set still loads the version once (a broken one is found out)
        (100, 0, 2, 2),  # asked for
        (100, 2.5, None, 2),  # whole GPUs
    ],
)
def test_one_actor_per_gpu_at_least_one_and_never_more_than_the_rows(rows, gpus, actors, expected):
    assert pool_size(rows, gpus, actors) == expected
