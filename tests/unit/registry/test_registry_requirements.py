"""The registered model's requirements resolve on a public index: public versions, no local labels."""

import re
from importlib.metadata import version

from packaging.version import Version

from xh.registry import pip_requirements


def test_requirements_pin_the_installed_public_versions_without_local_labels():
    pins = dict(line.split("==") for line in pip_requirements())
    assert {"torch", "transformers", "mlflow", "safetensors"} <= set(pins)
    for name, pinned in pins.items():
        assert re.fullmatch(r"\d+(\.\d+)*((a|b|rc)\d+)?(\.post\d+)?(\.dev\d+)?", pinned), f"{name}=={pinned}"
        assert pinned == Version(version(name)).public
