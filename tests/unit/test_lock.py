"""One locked environment: requirements.lock pins every package pyproject.toml needs (every extra) to one
version with its hashes; make, CI, the image and the AWS cluster launcher install exactly it (torch apart:
installed first and pinned, its build chosen by the machine's index), and nothing resolves a range anew."""

import re
import shlex
import tomllib
from importlib.metadata import PackageNotFoundError, requires, version
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from xh.registry import pip_requirements

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "requirements.lock"
# what the lock was resolved for (`make lock`): CPython 3.11 on Linux x86_64
TARGET = {**default_environment(), "python_version": "3.11", "sys_platform": "linux", "platform_machine": "x86_64"}


def _lock() -> dict[str, tuple[str, list[str]]]:
    """{canonical name: (pinned version, its sha256 hashes)}; fails on any entry that is not `name==version`."""
    entries: dict[str, tuple[str, list[str]]] = {}
    text = re.sub(r"\\\n", " ", LOCK.read_text())  # one logical line per entry
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        spec, *options = line.split(" --hash=")
        req = Requirement(spec)
        pins = [s for s in req.specifier if s.operator == "=="]
        assert len(pins) == 1 and len(req.specifier) == 1 and not req.url, f"not an exact pin: {line[:80]}"
        assert not req.marker, f"{req.name}: the lock is for one target, without markers"
        entries[canonicalize_name(req.name)] = (pins[0].version, [o.strip() for o in options])
    return entries


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _torch_version() -> str:
    return re.search(r"^TORCH_VERSION := (\S+)$", (ROOT / "Makefile").read_text(), flags=re.M).group(1)


def test_the_lock_pins_every_dependency_and_extra_of_pyproject_exactly_with_hashes():
    lock = _lock()
    project = _project()
    declared = [Requirement(r) for r in project["dependencies"]]
    declared += [Requirement(r) for extra in project["optional-dependencies"].values() for r in extra]
    assert len(declared) > 20
    for req in declared:
        name = canonicalize_name(req.name)
        if name == "torch":
            assert name not in lock  # installed first, its build per machine (test below)
            continue
        assert name in lock, f"{req} is not in requirements.lock: run `make lock`"
        assert req.specifier.contains(lock[name][0], prereleases=True), f"{req}: the lock has {lock[name][0]}"
    for name, (pinned, hashes) in lock.items():
        assert hashes and all(re.fullmatch(r"sha256:[0-9a-f]{64}", h) for h in hashes), f"{name}=={pinned}"


def test_the_extras_of_locked_requirements_are_locked_too():
    """`ray[data,train,serve,default]` needs what those extras of the locked ray name (read from the package's
    own metadata where the installed version is the locked one, as in CI); `moto[server]` likewise."""
    lock = _lock()
    checked = 0
    project = _project()
    declared = project["dependencies"] + [r for extra in project["optional-dependencies"].values() for r in extra]
    for req in (Requirement(r) for r in declared):
        name = canonicalize_name(req.name)
        if not req.extras or name == "torch":
            continue
        try:
            installed = version(req.name)
        except PackageNotFoundError:
            continue
        if Version(installed).public != lock[name][0]:
            continue
        for sub in (Requirement(r) for r in requires(req.name) or []):
            if sub.marker is not None and not any(sub.marker.evaluate({**TARGET, "extra": e}) for e in req.extras):
                continue
            sub_name = canonicalize_name(sub.name)
            assert sub_name in lock, f"{req.name}[{','.join(sorted(req.extras))}] needs {sub}: not locked"
            assert sub.specifier.contains(lock[sub_name][0], prereleases=True), f"{sub}: locked {lock[sub_name][0]}"
            checked += 1
    assert checked > 5


def test_the_lock_forces_no_cuda_build_and_leaves_torch_to_the_machine():
    lock = _lock()
    assert "torch" not in lock
    cuda = sorted(n for n in lock if n.startswith("nvidia-") or n in ("triton", "cuda-toolkit", "cuda-bindings"))
    assert not cuda, f"the lock names CUDA packages {cuda}: it would force a CUDA build on CPU machines"
    torch = _torch_version()
    assert any(Requirement(r).specifier.contains(torch) for r in _project()["dependencies"] if r.startswith("torch"))
    for name in ("sympy", "networkx", "filelock", "jinja2", "fsspec", "typing-extensions"):
        assert name in lock, f"torch's dependency {name} is not locked"
    assert "\n#    make lock\n" in LOCK.read_text(), "the lock's header names another command than `make lock`"


def _install_commands(text: str) -> list[list[str]]:
    """Every `pip install` / `uv pip install` command in a Makefile, Dockerfile, shell or YAML text, as words."""
    text = re.sub(r"^\s*#.*$", "", re.sub(r"\\\n", " ", text), flags=re.M)
    commands = []
    for match in re.finditer(r"(?:^|[\s;&|(-])pip install ([^\n;&|]*)", text):
        words = shlex.split(match.group(1).replace("$(", "${").replace(")", "}"), comments=False)
        commands.append(words)
    return commands


def _check_install(words: list[str], where: str, torch: str) -> str:
    """What one install command installs: 'torch', 'uv', 'lock' or 'project'; anything else fails."""
    args = [w for w in words if not w.startswith("-")]
    args = [a for a in args if a not in ("${TORCH_INDEX_URL}", "${PY}", "${TORCH_INDEX_ARGS}")]
    options = set(words)
    if "-r" in words:
        assert words[words.index("-r") + 1].endswith("requirements.lock") or "${LOCK}" in words, f"{where}: {words}"
        assert {"--no-deps", "--require-hashes"} <= options, f"{where}: the lock installed with resolution: {words}"
        return "lock"
    if args and args[0].startswith("torch=="):
        assert args == [f"torch=={torch}"] or args == ["torch==${TORCH_VERSION}"], f"{where}: {words}"
        return "torch"
    if args and args[0].startswith("uv=="):
        assert re.fullmatch(r"uv==(\d+\.\d+\.\d+|\$\{UV_VERSION\})", args[0]) and len(args) == 1, f"{where}: {words}"
        return "uv"
    assert "--no-deps" in options, f"{where}: installs {args} with their dependencies resolved anew"
    assert len(args) == 1 and re.fullmatch(r'\.|"?\$HOME/transformer-xh"?', args[0]), f"{where}: installs {args}"
    return "project"


def test_make_the_image_ci_and_the_cluster_launcher_install_the_lock_and_nothing_resolved_anew():
    torch = _torch_version()
    makefile = (ROOT / "Makefile").read_text()
    places = {
        "Makefile": makefile,
        "infra/Dockerfile": (ROOT / "infra" / "Dockerfile").read_text(),
        "infra/aws/cluster.yaml": (ROOT / "infra" / "aws" / "cluster.yaml").read_text(),
        ".ci/run": (ROOT / ".ci" / "run").read_text(),
    }
    kinds = {}
    for where, text in places.items():
        kinds[where] = [_check_install(words, where, torch) for words in _install_commands(text)]
    for where in ("Makefile", "infra/Dockerfile", "infra/aws/cluster.yaml"):
        assert kinds[where][0] == "torch" or kinds[where][:2] == ["uv", "torch"], f"{where}: torch first"
        assert {"torch", "lock", "project"} <= set(kinds[where]), f"{where}: {kinds[where]}"
    assert "LOCK := requirements.lock" in makefile
    # make's install reruns when the lock changes; `make lock` exists; the image copies the lock in
    assert re.search(r"^\$\(STAMP\): .*\$\(LOCK\)", makefile, flags=re.M)
    assert re.search(r"^lock: ", makefile, flags=re.M) and "pip compile" in makefile
    assert re.search(r"^COPY .*requirements\.lock", places["infra/Dockerfile"], flags=re.M)
    # CI installs through make (the lock) and nothing else
    assert kinds[".ci/run"] == [] and re.search(r"^make test$", places[".ci/run"], flags=re.M)
    dockerfile_torch = re.search(r"^ARG TORCH_VERSION=(\S+)$", places["infra/Dockerfile"], flags=re.M).group(1)
    assert dockerfile_torch == torch


def test_a_range_or_a_resolving_install_is_refused_by_the_check():
    """The check above fails on what the old installs did (a range, the project with its dependencies)."""
    torch = _torch_version()
    for bad in (
        'RUN pip install ".[offline]" "psycopg2-binary==2.9.13" "boto3>=1.40,<2"',
        "\t$(PY) -m pip install --quiet -e '.[dev,offline]'",
        "  - pip install -r requirements.lock",
        "  - pip install torch",
    ):
        [words] = _install_commands(bad)
        with pytest.raises(AssertionError):
            _check_install(words, "example", torch)


def test_the_registered_models_requirements_are_the_locked_versions():
    """A registered version's requirements.txt (what `mlflow models serve` installs) pins what the lock pins,
    torch what make and the image install: in an environment installed from the lock, as CI's is."""
    lock = _lock()
    pins = dict(line.split("==") for line in pip_requirements())
    assert pins["torch"] == _torch_version()
    for name, pinned in pins.items():
        if canonicalize_name(name) != "torch":
            assert pinned == lock[canonicalize_name(name)][0], f"{name}=={pinned}: the lock has another version"
