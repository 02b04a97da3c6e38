"""The layout holds: the library never imports its drivers, no module imports itself back, and the
lower layers never import the ones above them (`LAYERS`).

Every import counts, module-level or inside a function: a cycle hidden in a function is still a cycle
a reader has to untangle. An edge goes to the module an import names (`from xh.wiki import titles`
names `xh.wiki.titles` when that is a module, else `xh.wiki`).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("xh", "workflows")
# A package and the packages above it, which it must never import: evidence graphs are the model's
# input, so the graph code knows nothing of the model, training or inference that read them.
LAYERS = {"xh.graph": ("xh.model", "xh.train", "xh.inference")}


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def import_graph(type_hints: bool = False) -> dict[str, set[str]]:
    """Module -> the modules it imports; `type_hints`: imports under `if TYPE_CHECKING:` count too."""
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        tree = ast.parse(path.read_text(), str(path))
        # imports for type hints only (`if TYPE_CHECKING:`) never run: no import cycle
        type_only = {
            id(inner)
            for block in ast.walk(tree)
            if not type_hints and isinstance(block, ast.If) and getattr(block.test, "id", None) == "TYPE_CHECKING"
            for inner in ast.walk(block)
        }
        for node in ast.walk(tree):
            if id(node) in type_only:
                continue
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: resolve against this module's package
                    anchor = name.split(".") if is_package else name.split(".")[:-1]
                    anchor = anchor[: len(anchor) - (node.level - 1)]
                    base = ".".join(anchor + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            for target in targets:
                while target and target not in modules:  # `import xh.wiki.titles.x` -> the module part
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_library_never_imports_the_drivers():
    backwards = {
        m: sorted(t for t in targets if t.split(".")[0] == "workflows")
        for m, targets in import_graph().items()
        if m.split(".")[0] == "xh"
    }
    assert not {m: t for m, t in backwards.items() if t}


def upward_imports(graph: dict[str, set[str]]) -> dict[str, list[str]]:
    """Per module of a lower layer, the modules of the layers above it that it imports."""

    def within(module: str, package: str) -> bool:
        return module == package or module.startswith(package + ".")

    found = {}
    for lower, uppers in LAYERS.items():
        for module, targets in graph.items():
            if within(module, lower):
                upward = sorted(t for t in targets if any(within(t, upper) for upper in uppers))
                if upward:
                    found[module] = upward
    return found


def test_no_upward_import_from_the_graphs_into_the_model():
    assert upward_imports(import_graph()) == {}


# The model classes; only xh.model.variants may tell them apart (by the name each carries).
MODEL_CLASSES = {"XHModel", "DocHopper", "RoutedModel"}


def model_class_checks() -> list[str]:
    """`isinstance(x, <model class>)` outside xh/model/variants.py, as "path:line"."""
    found = []
    for path in sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py")):
        if path == ROOT / "xh" / "model" / "variants.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance" and len(node.args) == 2:
                classes = node.args[1].elts if isinstance(node.args[1], ast.Tuple) else [node.args[1]]
                if any(getattr(c, "id", getattr(c, "attr", None)) in MODEL_CLASSES for c in classes):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_only_the_variants_module_tells_the_architectures_apart():
    assert model_class_checks() == []


def test_no_module_imports_itself_back():
    assert cycles(import_graph()) == []


def mutual_pairs(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Pairs of modules that import each other, each pair once."""
    return sorted((a, b) for a, targets in graph.items() for b in targets if a < b and a in graph.get(b, ()))


def test_no_two_modules_import_each_other_type_hints_included():
    # a type hint's import is still an arrow a reader follows: one side must own the shared piece
    assert mutual_pairs(import_graph(type_hints=True)) == []
    assert mutual_pairs({"xh.a": {"xh.b"}, "xh.b": {"xh.a", "xh.c"}, "xh.c": set()}) == [("xh.a", "xh.b")]


def test_the_cycle_finder_finds_a_cycle_and_a_backwards_arrow():
    graph = {"xh.a": {"xh.b"}, "xh.b": {"xh.c"}, "xh.c": {"xh.a"}, "xh.d": {"xh.a"}}
    assert cycles(graph) == [["xh.a", "xh.b", "xh.c"]]
    assert "workflows.common" in import_graph()["workflows.demo"]
    # xh.storage.tables names the places it works on by a Protocol of its own: no arrow back to the store
    assert (
        "xh.storage.tables" in import_graph()["xh.storage.store"]
        and "xh.storage.store" not in import_graph()["xh.storage.tables"]
    )
    upward = {"xh.graph.hotpot": {"xh.model.gesa", "xh.schemas"}, "xh.model.gesa": {"xh.graph.typed"}}
    assert upward_imports(upward) == {"xh.graph.hotpot": ["xh.model.gesa"]}


# A driver is wiring: config -> Store -> checks -> Ray -> the stage's library call -> summary. The CLI
# module (the typer app) and common.py (joining Ray) are not drivers.
DRIVER_LINES = 80


def test_every_driver_is_wiring_and_leaves_storage_settings_to_the_store():
    drivers = [
        p for p in sorted((ROOT / "workflows").glob("*.py")) if p.name not in ("__init__.py", "cli.py", "common.py")
    ]
    assert len(drivers) >= 11  # synth ... serve, qtype and demo
    long = {p.name: n for p in drivers if (n := len(p.read_text().splitlines())) > DRIVER_LINES}
    assert long == {}, f"drivers over {DRIVER_LINES} lines: move their logic into xh/stages/"
    assert [p.name for p in (ROOT / "workflows").glob("*.py") if "s3_settings" in p.read_text()] == []
    assert not (ROOT / "xh" / "staging.py").exists()  # one commit protocol: xh/storage/tables.py


# The storage layer: a place is a `xh.storage.store.Location` (a URI with the store that reaches it), so only the
# two modules that make Locations ever see S3 settings beside a URI.
STORAGE_MODULES = {"xh/storage/uris.py", "xh/storage/store.py"}


def s3_parameters(source: str, where: str) -> list[str]:
    """Functions of `source` with a parameter named `s3`, as "where:line name"."""
    found = []
    for node in ast.walk(ast.parse(source, where)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            args = node.args
            names = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]
            if "s3" in names:
                found.append(f"{where}:{node.lineno} {getattr(node, 'name', 'lambda')}")
    return found


def test_no_function_outside_the_storage_layer_takes_s3_settings_beside_a_uri():
    found = []
    for package in (*PACKAGES, "bench", "tests"):
        for path in sorted((ROOT / package).rglob("*.py")):
            where = path.relative_to(ROOT).as_posix()
            if where not in STORAGE_MODULES:
                found += s3_parameters(path.read_text(), where)
    assert found == [], "take a Location (xh.storage.store) instead of a (uri, s3) pair"
    # the finder finds one, keyword-only or positional
    assert s3_parameters("def f(uri, s3=None): ...\ndef g(*, s3): ...\nh = lambda s3: s3", "x.py") == [
        "x.py:1 f",
        "x.py:2 g",
        "x.py:3 lambda",
    ]


# A reader finds a module by its package: storage in xh/storage/, inputs in xh/inputs/, the model's in xh/model/.
MAX_LOOSE_MODULES = 10


def test_at_most_ten_modules_loose_at_the_top_of_the_library():
    loose = sorted(p.stem for p in (ROOT / "xh").glob("*.py") if p.name != "__init__.py")
    assert len(loose) <= MAX_LOOSE_MODULES, loose
    assert not (ROOT / "xh" / "store.py").exists() and (ROOT / "xh" / "storage" / "store.py").exists()


# Callers import a name from the module that defines it; a package's `__init__` only says what the package is.
# xh.synth's callers still read `synth.<name>` (20 files, benches among them): its block goes next.
REEXPORTS_LEFT = ["xh/synth/__init__.py"]


def test_no_package_init_re_exports_its_modules():
    found = [
        path.relative_to(ROOT).as_posix()
        for path in sorted((ROOT / "xh").rglob("__init__.py"))
        if any(isinstance(node, (ast.Import, ast.ImportFrom)) for node in ast.parse(path.read_text()).body)
    ]
    assert found == REEXPORTS_LEFT
