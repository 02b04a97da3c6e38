"""A local wheel folder that stands in for the team's package index (offline): the project's own wheel, built
from the checkout, and a wheel of every other installed distribution a set of requirements needs, repacked
from this environment's installed files (their RECORD), so that `pip install --no-index --find-links DIR`
rebuilds the environment a registered version names without reaching any index."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import subprocess
import sys
import zipfile
from importlib.metadata import Distribution, distribution
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

SKIPPED = {"INSTALLER", "REQUESTED", "direct_url.json", "RECORD"}


def closure(requirements: list[str]) -> dict[str, Distribution]:
    """The installed distributions `requirements` install, with their extras, transitively."""
    found: dict[str, Distribution] = {}
    todo = [Requirement(r) for r in requirements]
    seen: set[tuple[str, frozenset]] = set()
    while todo:
        req = todo.pop()
        key = (canonicalize_name(req.name), frozenset(req.extras))
        if key in seen:
            continue
        seen.add(key)
        try:
            dist = distribution(req.name)
        except Exception:  # noqa: BLE001 (an optional requirement not installed here: pip will not ask for it)
            continue
        found[key[0]] = dist
        for line in dist.requires or []:
            sub = Requirement(line)
            envs = [{"extra": e} for e in req.extras] or [{"extra": ""}]
            if sub.marker is None or any(sub.marker.evaluate(env) for env in envs):
                todo.append(sub)
    return found


def _digest(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def wheel_tag(info: Path) -> str:
    """The compressed tag set of an installed wheel (its WHEEL file's `Tag:` lines), e.g. `py2.py3-none-any`."""
    lines = (info / "WHEEL").read_text().splitlines()
    tags = [line.split(":", 1)[1].strip() for line in lines if line.startswith("Tag:")]
    parts = [list(dict.fromkeys(t.split("-")[i] for t in tags)) for i in range(3)]
    return "-".join(".".join(p) for p in parts)


def repack(dist: Distribution, folder: Path) -> Path:
    """An installed distribution as a wheel in `folder` (stored, not compressed: it is read once, locally)."""
    info = Path(str(dist._path))  # noqa: SLF001 (the .dist-info folder: importlib has no public name for it)
    name = canonicalize_name(dist.metadata["Name"]).replace("-", "_")
    target = folder / f"{name}-{dist.version}-{wheel_tag(info)}.whl"
    if target.exists():
        return target
    site = info.parent
    rows = []
    partial = target.with_suffix(".part")
    with zipfile.ZipFile(partial, "w", zipfile.ZIP_STORED) as wheel:
        for f in dist.files or []:
            relative = str(f)
            if relative.startswith("..") or "__pycache__" in relative or Path(relative).name in SKIPPED:
                continue
            path = site / relative
            if not path.is_file():
                continue
            data = path.read_bytes()
            wheel.writestr(relative, data)
            rows.append([relative, _digest(data), str(len(data))])
        record = f"{info.name}/RECORD"
        out = io.StringIO()
        csv.writer(out, lineterminator="\n").writerows([*rows, [record, "", ""]])
        wheel.writestr(record, out.getvalue())
    partial.rename(target)
    return target


def project_wheel(root: Path, folder: Path) -> Path:
    """The project's own wheel, built from the checkout (no build isolation: setuptools is installed)."""
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(folder), str(root)],
        check=True,
        capture_output=True,
        timeout=600,
    )
    return next(folder.glob("transformer_xh_ray-*.whl"))


# What MLflow's virtualenv manager installs before a version's requirements (its python_env.yaml)
BUILD_PACKAGES = ("pip", "setuptools", "wheel")


def wheelhouse(root: Path, requirements: list[str], folder: Path, project: str) -> Path:
    """`folder` holding a wheel of each requirement and of what it installs, and of the build packages; the
    project's from `root`. A build package not installed here (`wheel`, which a Python 3.11 venv lacks) is
    fetched by pip from the indexes this machine's pip is configured with."""
    folder.mkdir(parents=True, exist_ok=True)
    project_wheel(root, folder)
    for key, dist in closure([*requirements, *BUILD_PACKAGES]).items():
        if key != canonicalize_name(project):
            repack(dist, folder)
    for name in BUILD_PACKAGES:
        if not any(canonicalize_name(f.name.split("-")[0]) == name for f in folder.glob("*.whl")):
            subprocess.run(
                [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(folder), name],
                check=True,
                capture_output=True,
                timeout=300,
            )
    return folder
