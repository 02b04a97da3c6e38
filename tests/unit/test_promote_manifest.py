"""infra/k8s/rayjob-promote.yaml runs the promotion stage with the cluster config, on the recorded gate split
(its schema is checked with every other manifest, tests/unit/test_manifests.py)."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.unit

K8S = Path(__file__).resolve().parents[2] / "infra" / "k8s"


def test_the_promote_rayjob_promotes_with_the_cluster_config_on_the_recorded_gate_split():
    from xh.config import load_config

    (job,) = [d for d in yaml.safe_load_all((K8S / "rayjob-promote.yaml").read_text()) if d]
    assert job["kind"] == "RayJob" and job["spec"]["clusterSelector"] == {"ray.io/cluster": "xh"}
    words = shlex.split(job["spec"]["entrypoint"])
    assert words[:2] == ["xh", "promote"], words
    assert words[words.index("--config") + 1] == "/etc/xh/cluster.yaml"  # raycluster.yaml mounts xh-config there
    overrides = [words[i + 1] for i, w in enumerate(words) if w == "--set"]
    cfg = load_config(K8S / "xh-config" / "cluster.yaml", overrides)
    assert words[2] == "--config"  # no `rollback` verb: the driver promotes
    assert cfg.promote.eval_set is None  # the challenger's recorded gate split
    assert cfg.mlflow.tracking_uri.startswith("http")  # a tracking server: the decision run outlives the job
