"""Two locked environments: requirements.lock (the runtime: the package and its server and offline extras,
for the image and the cluster) and requirements-dev.lock (that and the test and benchmark extras, for make
and CI) pin every package to one version with its hashes, for CPython 3.11 and 3.12 on Linux x86_64; every
install takes one of them (torch apart: installed first and pinned, its build chosen by the machine's
index), and nothing resolves a range anew."""

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

from xh.registry.register import pip_requirements

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "requirements.lock"
DEV_LOCK = ROOT / "requirements-dev.lock"
# what the locks were resolved for (`make lock`): CPython 3.11 and 3.12 on Linux x86_64
LINUX = {**default_environment(), "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64"}
TARGETS = [
    {**LINUX, "python_version": v, "python_full_version": f"{v}.0", "implementation_name": "cpython"}
    for v in ("3.11", "3.12")
]
TARGET = TARGETS[0]
# the runtime lock's extras; every other extra is the dev lock's alone
RUNTIME_EXTRAS = ("server", "offline")
# test and benchmark packages, and what only they bring: never in the image (numba is the runtime's own:
# the BM25 kernel, xh/retrieval/bm25_kernel.py)
NOT_RUNTIME = (
    "pytest", "pytest-timeout", "pytest-xdist", "moto", "cfn-lint", "kubernetes-validate",
    "rank-bm25", "bm25s", "ruff", "responses", "py-partiql-parser", "aws-xray-sdk",
)  # fmt: skip


def _lock(path: Path = DEV_LOCK, target: dict = TARGET) -> dict[str, tuple[str, list[str]]]:
    """{canonical name: (pinned version, its sha256 hashes)} of the entries whose marker holds on `target`;
    fails on any entry that is not `name==version`, or on two entries of one name for one target."""
    entries: dict[str, tuple[str, list[str]]] = {}
    text = re.sub(r"\\\n", " ", path.read_text())  # one logical line per entry
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        spec, *options = line.split(" --hash=")
        req = Requirement(spec)
        pins = [s for s in req.specifier if s.operator == "=="]
        assert len(pins) == 1 and len(req.specifier) == 1 and not req.url, f"not an exact pin: {line[:80]}"
        if req.marker is not None and not req.marker.evaluate(target):
            continue
        name = canonicalize_name(req.name)
        assert name not in entries, f"{path.name}: {name} twice for Python {target['python_version']}"
        entries[name] = (pins[0].version, [o.strip() for o in options])
    return entries


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _torch_version() -> str:
    return re.search(r"^TORCH_VERSION := (\S+)$", (ROOT / "Makefile").read_text(), flags=re.M).group(1)


def _declared(extras) -> list[Requirement]:
    project = _project()
    return [Requirement(r) for r in project["dependencies"]] + [
        Requirement(r) for extra in extras for r in project["optional-dependencies"][extra]
    ]


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: t["python_version"])
@pytest.mark.parametrize("path,extras", [(DEV_LOCK, None), (LOCK, RUNTIME_EXTRAS)], ids=["dev", "runtime"])
def test_each_lock_pins_what_pyproject_declares_exactly_with_hashes_for_311_and_312(path, extras, target):
    lock = _lock(path, target)
    declared = _declared(extras if extras is not None else _project()["optional-dependencies"])
    assert len(declared) > 15
    for req in declared:
        name = canonicalize_name(req.name)
        if name == "torch":
            assert name not in lock  # installed first, its build per machine (test below)
            continue
        assert name in lock, f"{req} is not in {path.name} for Python {target['python_version']}: run `make lock`"
        assert req.specifier.contains(lock[name][0], prereleases=True), f"{req}: {path.name} has {lock[name][0]}"
    for name, (pinned, hashes) in lock.items():
        assert hashes and all(re.fullmatch(r"sha256:[0-9a-f]{64}", h) for h in hashes), f"{name}=={pinned}"
    assert "\n#    make lock\n" in path.read_text(), f"{path.name}'s header names another command than `make lock`"


def test_the_runtime_lock_holds_no_test_or_benchmark_package_and_is_the_dev_locks_versions():
    for target in TARGETS:
        runtime, dev = _lock(LOCK, target), _lock(DEV_LOCK, target)
        assert not set(NOT_RUNTIME) & set(runtime), sorted(set(NOT_RUNTIME) & set(runtime))
        assert set(NOT_RUNTIME) <= set(dev), sorted(set(NOT_RUNTIME) - set(dev))
        assert {n: v for n, (v, _) in runtime.items()} == {n: dev[n][0] for n in runtime if n in dev}
        assert set(runtime) < set(dev)
    runtime_declared = {canonicalize_name(r.name) for r in _declared(RUNTIME_EXTRAS)}
    assert (
        "rank-bm25" not in runtime_declared
    )  # a test reference (tests/unit/retrieval/test_bm25.py), not the package's


def test_the_lock_check_refuses_a_pin_twice_for_one_python():
    """Two versions of one package both holding on one target is what a careless merge of per-version locks
    gives; the parser above fails on it."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        bad = Path(tmp) / "bad.lock"
        bad.write_text(
            "numpy==2.4.6 ; python_full_version < '3.13' \\\n    --hash=sha256:" + "0" * 64 + "\nnumpy==2.5.5\n"
        )
        with pytest.raises(AssertionError, match="twice"):
            _lock(bad, TARGET)


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


@pytest.mark.parametrize("path", [DEV_LOCK, LOCK], ids=["dev", "runtime"])
def test_the_lock_forces_no_cuda_build_and_leaves_torch_to_the_machine(path):
    lock = _lock(path)
    assert "torch" not in lock
    cuda = sorted(n for n in lock if n.startswith("nvidia-") or n in ("triton", "cuda-toolkit", "cuda-bindings"))
    assert not cuda, f"the lock names CUDA packages {cuda}: it would force a CUDA build on CPU machines"
    torch = _torch_version()
    assert any(Requirement(r).specifier.contains(torch) for r in _project()["dependencies"] if r.startswith("torch"))
    for name in ("sympy", "networkx", "filelock", "jinja2", "fsspec", "typing-extensions"):
        assert name in lock, f"torch's dependency {name} is not locked"


def _install_commands(text: str) -> list[list[str]]:
    """Every `pip install` / `uv pip install` command in a Makefile, Dockerfile, shell or YAML text, as words."""
    text = re.sub(r"^\s*#.*$", "", re.sub(r"\\\n", " ", text), flags=re.M)
    commands = []
    for match in re.finditer(r"(?:^|[\s;&|(-])pip install ([^\n;&|]*)", text):
        words = shlex.split(match.group(1).replace("$(", "${").replace(")", "}"), comments=False)
        commands.append(words)
    return commands


def _check_install(words: list[str], where: str, torch: str) -> str:
    """What one install command installs: 'torch', 'uv', 'runtime lock', 'dev lock' or 'project'; anything
    else fails."""
    args = [w for w in words if not w.startswith("-")]
    args = [a for a in args if a not in ("${TORCH_INDEX_URL}", "${PY}", "${TORCH_INDEX_ARGS}")]
    options = set(words)
    if "-r" in words:
        path = words[words.index("-r") + 1].strip('"')
        assert {"--no-deps", "--require-hashes"} <= options, f"{where}: the lock installed with resolution: {words}"
        if path.endswith("requirements-dev.lock") or path == "${DEV_LOCK}":
            return "dev lock"
        assert path.endswith("requirements.lock") or path == "${LOCK}", f"{where}: {words}"
        return "runtime lock"
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
    # make (so CI) the dev lock; the image and the cluster the runtime lock, without the test packages
    wanted = {"Makefile": "dev lock", "infra/Dockerfile": "runtime lock", "infra/aws/cluster.yaml": "runtime lock"}
    for where, lock in wanted.items():
        assert kinds[where][0] == "torch" or kinds[where][:2] == ["uv", "torch"], f"{where}: torch first"
        assert {"torch", lock, "project"} <= set(kinds[where]), f"{where}: {kinds[where]}"
        assert not {"runtime lock", "dev lock"} - {lock} & set(kinds[where]), f"{where}: {kinds[where]}"
    assert "LOCK := requirements.lock" in makefile and "DEV_LOCK := requirements-dev.lock" in makefile
    # make's install reruns when the dev lock changes; `make lock` writes both; the image copies the runtime one
    assert re.search(r"^\$\(STAMP\): .*\$\(DEV_LOCK\)", makefile, flags=re.M)
    assert re.search(r"^lock: ", makefile, flags=re.M) and "pip compile" in makefile
    assert "-o $(DEV_LOCK)" in makefile and "-c $(DEV_LOCK) -o $(LOCK)" in makefile
    assert re.search(r"^COPY .*requirements\.lock", places["infra/Dockerfile"], flags=re.M)
    dockerignore = (ROOT / ".dockerignore").read_text().split()
    assert "requirements.lock" not in dockerignore and "requirements-dev.lock" in dockerignore
    # CI installs through make (the dev lock) and builds the image's install steps (make image-check)
    assert kinds[".ci/run"] == [] and re.search(r"^make test$", places[".ci/run"], flags=re.M)
    assert re.search(r"^make image-check$", places[".ci/run"], flags=re.M)
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
    assert pins.pop("transformer-xh-ray") == tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    for name, pinned in pins.items():
        if canonicalize_name(name) != "torch":
            assert pinned == lock[canonicalize_name(name)][0], f"{name}=={pinned}: the lock has another version"
