"""The registered model's requirements rebuild its environment: the project's own distribution (the loader
module's) and every package the loader imports, pinned to public versions (no local labels)."""

import json
import re
import subprocess
import sys
from importlib.metadata import distribution, version

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from xh.registry.register import pip_requirements, project_distribution

# what answering a raw question imports: the loader, both halves of the pipeline, the model's libraries
LOADER_IMPORTS = (
    "import xh.pyfunc_entry, xh.pipeline, xh.retrieval.candidates, xh.graph.hotpot, xh.graph.fever, "
    "xh.graph.docstore, xh.model.qtype, xh.inference, transformers, safetensors.torch, tokenizers, Stemmer"
)


def test_requirements_pin_the_installed_public_versions_without_local_labels():
    pins = dict(line.split("==") for line in pip_requirements())
    assert {"torch", "transformers", "mlflow", "safetensors", "PyStemmer", project_distribution()} <= set(pins)
    for name, pinned in pins.items():
        assert re.fullmatch(r"\d+(\.\d+)*((a|b|rc)\d+)?(\.post\d+)?(\.dev\d+)?", pinned), f"{name}=={pinned}"
        assert pinned == Version(version(name)).public


def _closure(names: list[str]) -> set[str]:
    """The distributions `names` install: themselves and their requirements (no extras), transitively."""
    seen, todo = set(), [canonicalize_name(n) for n in names]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for line in distribution(name).requires or []:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                try:
                    distribution(req.name)
                except Exception:  # noqa: BLE001 (an optional requirement not installed here)
                    continue
                todo.append(canonicalize_name(req.name))
    return seen


def test_every_package_the_loader_imports_is_pinned_or_comes_with_a_pinned_one():
    # each imported module's file looked up in the installed distributions' file lists (namespace packages
    # such as `google` span several distributions)
    script = (
        f"{LOADER_IMPORTS}\nimport json, os, sys\nfrom importlib.metadata import distributions\n"
        "owner = {os.path.abspath(d.locate_file(f)): name for d in distributions() "
        "for name in [d.metadata['Name']] for f in (d.files or []) if str(f).endswith('.py')}\n"
        "files = {os.path.abspath(m.__file__) for m in list(sys.modules.values()) if getattr(m, '__file__', None)}\n"
        "print(json.dumps(sorted({owner[f] for f in files if f in owner})))"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    imported = {canonicalize_name(d) for d in json.loads(done.stdout.splitlines()[-1])}
    pinned = [line.split("==")[0] for line in pip_requirements()]
    # beside the project, the loader's packages alone must cover what it imports (not only the project's deps)
    direct = _closure([n for n in pinned if n != project_distribution()])
    assert imported - direct <= {canonicalize_name(project_distribution())}, imported - direct
