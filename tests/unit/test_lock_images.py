"""Images pinned by digest: the Dockerfile's base and every tool image the manifests run, so that a moved
tag cannot change what runs. Two exceptions, each with its reason: the project's own image (its digest
exists only once a release is pushed; the tag is the project version) and kubectl, whose digest for this
tag was not known where the pin was written (pin it with `crane digest registry.k8s.io/kubectl:v1.32.4`)."""

import re
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
DIGEST = re.compile(r"^[^@\s]+:[\w.-]+@sha256:[0-9a-f]{64}$")
NOT_PINNED = {
    "ghcr.io/transformer-xh/transformer-xh-ray:0.1.0": "the project's image: a digest only once pushed",
    "registry.k8s.io/kubectl:v1.32.4": "digest not known offline when pinned",
}


def _images(obj) -> list[str]:
    if isinstance(obj, dict):
        return [v for k, v in obj.items() if k == "image" and isinstance(v, str)] + [
            i for v in obj.values() for i in _images(v)
        ]
    return [i for v in obj for i in _images(v)] if isinstance(obj, list) else []


def test_the_dockerfile_base_is_pinned_by_digest_and_uv_by_hash():
    text = (ROOT / "infra" / "Dockerfile").read_text()
    bases = re.findall(r"^FROM (\S+)", text, flags=re.M)
    assert bases and all(DIGEST.match(b) for b in bases), bases
    assert re.search(r"^ARG UV_WHEEL_SHA256=[0-9a-f]{64}$", text, flags=re.M)
    assert "sha256sum -c -" in text


def test_every_manifest_image_is_pinned_by_digest_but_the_listed_exceptions():
    images = {
        image
        for path in sorted((ROOT / "infra").rglob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text())
        if doc is not None
        for image in _images(doc)
    }
    assert len(images) >= 4
    unpinned = sorted(i for i in images if not DIGEST.match(i) and i not in NOT_PINNED)
    assert not unpinned, f"images without a digest: {unpinned}"
    assert set(NOT_PINNED) <= images, "an exception names an image no manifest runs any more: drop it"
