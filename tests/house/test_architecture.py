"""The arrows that must never exist (ARCHITECTURE.md, "Arrows that must never exist").

Read from the source with `ast`; nothing here is imported. Every import counts,
at module level or inside a function (a lazy import is still an arrow), and so
does ``importlib.import_module("<constant>")``. Each failure names the file, the
line and the import.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SRC = REPO / "src"
LIBRARY = SRC / "replaylab"
APPS = ("training", "export", "evaluation")
HOUSE = ("replaylab", *APPS)  # top-level packages of this repository
# with the tests' own package (tests.helpers, tests.conftest): what the private-name rules read
PACKAGES = (*HOUSE, "tests")
TESTS = REPO / "tests"
APPS_SHARED = LIBRARY / "apps"  # the only place under src/ for MLflow and the environment

# runtime/ is what serving installs (replaylab[serve]: numpy, onnxruntime, tokenizers)
RUNTIME = LIBRARY / "runtime"
RUNTIME_FORBIDDEN = ("torch", "lightgbm", "pandas", "mlflow", "hydra", "omegaconf",
                     "sentence_transformers", "sklearn")
RUNTIME_MAY_IMPORT = ("replaylab.runtime", "replaylab.contracts")

# from-imports of private names allowed: (importing module, imported name); none today
PRIVATE_ALLOWED: set[tuple[str, str]] = set()
# outside the library, the private-name rules hold too (they import it as any user does)
OUTSIDE = ("tests", "bench", "scripts")
SELF = ("self", "cls")
# private names of other libraries' objects, never read as a class's of this repository
FOREIGN_PRIVATE = frozenset({"_meta"})  # a dask collection's empty frame of its columns

# The floors of docs/ARCHITECTURE.md, bottom up: a package imports only packages on lower
# floors (never one on its own floor or above). A new package must be placed here.
FLOORS: tuple[tuple[str, ...], ...] = (
    ("replaylab", "contracts", "data"),   # 0: the data contracts (and the package's version)
    ("runtime",),                         # 1: serving
    ("config", "stats", "jsonsafe", "verdict"),  # 2: helpers written once
    ("compute",),                         # 3: the engine: where partitions are processed
    ("sources", "projection"),            # 4: ledgers in; dispatch-time features and splits
    ("demand",),                          # 5: the demand model
    ("tracking",),                        # 6: reports and figures
    ("forecast", "hints"),                # 7: archetype forecasts; demand hints offline
    ("router", "fleet"),                  # 8: the router library; the offline fleet
    ("artifacts",),                       # 9: the export side of every artifact kind
    ("pipelines",),                       # 10: one library call per pipeline
    ("fleet.experiments",),               # 11: the fleet experiments
    ("apps",),                            # 12: MLflow, environment, the registry
    APPS,                                 # 13: the entry points
)

ENV_NAMES = ("environ", "environb", "getenv", "getenvb", "putenv", "unsetenv")


# ---------------------------------------------------------------- reading the source
@dataclass(frozen=True)
class Import:
    """One import statement's target: ``module`` (absolute), ``name`` for a from-import."""

    path: Path
    line: int
    module: str
    name: str | None
    text: str

    def where(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}: {self.text}"


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


@cache
def _module_file(dotted: str) -> Path | None:
    """The file of a module of this repository (None for another library's)."""
    parts = dotted.split(".")
    if parts[0] not in PACKAGES:
        return None
    root = SRC if parts[0] == "replaylab" else REPO
    for candidate in (root.joinpath(*parts).with_suffix(".py"),
                      root.joinpath(*parts, "__init__.py")):
        if candidate.is_file():
            return candidate
    return None


def _module_name(path: Path) -> str:
    rel = path.relative_to(SRC if path.is_relative_to(SRC) else REPO).with_suffix("")
    parts = list(rel.parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _files(*roots: Path) -> list[Path]:
    return sorted(p for r in roots for p in r.rglob("*.py"))


@cache
def _source(path: Path) -> str:
    return path.read_text(encoding="utf-8")


@cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(_source(path), filename=str(path))


def _text(path: Path, node: ast.AST) -> str:
    seg = ast.get_source_segment(_source(path), node) or ast.dump(node)
    return " ".join(seg.split())


def imports(path: Path) -> Iterator[Import]:
    """Every import in the file: statements (relative ones resolved) and
    ``importlib.import_module`` / ``__import__`` calls with a constant name."""
    me = _module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(path, node.lineno, alias.name, None, _text(path, node))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([node.module] if node.module else []))
            for alias in node.names:
                yield Import(path, node.lineno, base, alias.name,
                             f"from {base} import {alias.name}")
        elif (isinstance(node, ast.Call) and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
              and (isinstance(node.func, ast.Attribute) and node.func.attr == "import_module"
                   or isinstance(node.func, ast.Name)
                   and node.func.id in ("import_module", "__import__"))):
            yield Import(path, node.lineno, node.args[0].value, None, _text(path, node))


def _source_module(imp: Import) -> str:
    """The module a from-import takes its name from (``a.b`` for ``from a import b`` when
    a/b.py exists: then the name is the module itself)."""
    if imp.name and _module_file(f"{imp.module}.{imp.name}"):
        return f"{imp.module}.{imp.name}"
    return imp.module


def _module_aliases(path: Path) -> dict[str, str]:
    """Names bound to a module of this repository (or to os) by the file's imports."""
    out: dict[str, str] = {}
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.asname:
                    out[a.asname] = a.name
                else:
                    out[a.name.split(".")[0]] = a.name.split(".")[0]
    for imp in imports(path):
        if imp.name and imp.name != "*" and _module_file(f"{imp.module}.{imp.name}"):
            out[imp.name] = f"{imp.module}.{imp.name}"
    return {k: v for k, v in out.items() if _module_file(v) or v == "os"}


def _attribute_chains(path: Path) -> Iterator[tuple[int, str, list[str], str]]:
    """(line, module, attributes, text) for each ``alias.a.b`` on a module alias."""
    aliases = _module_aliases(path)
    nodes = [n for n in ast.walk(_tree(path)) if isinstance(n, ast.Attribute)]
    inner = {id(n.value) for n in nodes}  # a.b inside a.b.c: read once, as a.b.c
    for node in nodes:
        if id(node) in inner:
            continue
        chain, value = [node.attr], node.value
        while isinstance(value, ast.Attribute):
            chain.insert(0, value.attr)
            value = value.value
        if isinstance(value, ast.Name) and value.id in aliases:
            yield node.lineno, aliases[value.id], chain, _text(path, node)


def private_name_imports(files: list[Path]) -> list[str]:
    """Private names (``_x``) taken from another module of this repository."""
    bad = set()
    for path in files:
        me = _module_name(path)
        for imp in imports(path):
            if imp.module.split(".")[0] not in PACKAGES:
                continue
            if imp.name is None:  # import a._b / import_module("a._b")
                if any(_is_private(p) for p in imp.module.split(".")):
                    bad.add(f"{imp.where()} (a private module)")
                continue
            if _is_private(imp.name) and _source_module(imp) != me \
                    and (me, imp.name) not in PRIVATE_ALLOWED:
                bad.add(f"{imp.where()} (private name from another module)")
        for line, module, chain, text in _attribute_chains(path):
            for attr in chain:  # walk down submodules to the first non-module attribute
                if _module_file(f"{module}.{attr}"):
                    module = f"{module}.{attr}"
                    continue
                if _is_private(attr) and module != me and _module_file(module):
                    bad.add(f"{path.relative_to(REPO)}:{line}: {text} "
                            f"(private name of {module})")
                break
    return sorted(bad)


def _assigned(node: ast.AST) -> Iterator[ast.expr]:
    """The targets an assignment binds, tuples unpacked."""
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    todo = list(targets)
    while todo:
        target = todo.pop()
        if isinstance(target, ast.Tuple | ast.List | ast.Starred):
            todo.extend(target.elts if not isinstance(target, ast.Starred) else [target.value])
        else:
            yield target


@cache
def _class_privates(path: Path) -> frozenset[str]:
    """Private names the file's classes define: methods and class attributes (``def _x``,
    ``_x = ...`` in a class body) and instance attributes (``self._x = ...``)."""
    out = set()
    assigns = (ast.Assign, ast.AnnAssign, ast.AugAssign)
    for cls in ast.walk(_tree(path)):
        if not isinstance(cls, ast.ClassDef):
            continue
        for node in cls.body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                out.add(node.name)
            elif isinstance(node, assigns):
                out.update(t.id for t in _assigned(node) if isinstance(t, ast.Name))
        for node in ast.walk(cls):
            if isinstance(node, assigns):
                out.update(t.attr for t in _assigned(node) if isinstance(t, ast.Attribute)
                           and isinstance(t.value, ast.Name) and t.value.id in SELF)
    return frozenset(n for n in out if _is_private(n))


@cache
def _private_owners() -> dict[str, tuple[str, ...]]:
    """Each private name a class of the library or an entry point defines -> its modules."""
    owners: dict[str, set[str]] = {}
    for path in _files(SRC, *(REPO / a for a in APPS)):
        for name in _class_privates(path):
            owners.setdefault(name, set()).add(_module_name(path))
    return {name: tuple(sorted(modules)) for name, modules in owners.items()}


def private_attribute_uses(files: list[Path]) -> list[str]:
    """``obj._x`` where ``_x`` is a private method or attribute that only classes of other
    modules of this repository define (``head._run(...)`` on another module's head).
    ``self._x``, ``cls._x`` and ``super()._x`` are the class's own; a name the file's own
    classes define is read as theirs; another library's privates (``sys._getframe``) are
    not ours to check, being defined nowhere in src/."""
    owners = _private_owners()
    bad = set()
    for path in files:
        mine, aliases = _class_privates(path), _module_aliases(path)
        for node in ast.walk(_tree(path)):
            if not isinstance(node, ast.Attribute) or node.attr not in owners \
                    or node.attr in mine or node.attr in FOREIGN_PRIVATE:
                continue
            value = node.value
            if isinstance(value, ast.Name) and (value.id in SELF or value.id in aliases):
                continue  # its own; or a module's private: private_name_imports reports it
            if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) \
                    and value.func.id == "super":
                continue
            bad.add(f"{path.relative_to(REPO)}:{node.lineno}: {_text(path, node)} "
                    f"(private name of a class in {', '.join(owners[node.attr])})")
    return sorted(bad)


# ---------------------------------------------------------------- the arrows
def test_no_private_name_crosses_a_module_in_the_library():
    files = _files(SRC)
    bad = private_name_imports(files) + private_attribute_uses(files)
    assert not bad, "private names used across modules:\n" + "\n".join(bad)


def test_no_private_name_crosses_a_module_in_the_apps():
    files = _files(*(REPO / a for a in APPS))
    bad = private_name_imports(files) + private_attribute_uses(files)
    assert not bad, "private names used across modules:\n" + "\n".join(bad)


def test_no_private_name_of_the_house_in_tests_bench_or_scripts():
    """Tests, benchmarks and scripts use the library's public names only: no private
    import from it, no ``obj._x`` on its objects (a test that needs a value gets it a
    public name or reads it through the public API). The same holds between the tests'
    own modules: a helper of tests/helpers/ or conftest.py is imported by its public name."""
    files = _files(*(REPO / d for d in OUTSIDE))
    bad = private_name_imports(files) + private_attribute_uses(files)
    assert not bad, "private names of src/ used outside it:\n" + "\n".join(bad)


def test_tests_share_code_through_helpers_never_through_another_test_module():
    """A test module imports no other test module (``tests.test_*``): what several share is
    a public name of tests/helpers/ (fixtures: conftest.py), so that moving or deleting
    one test file never breaks another. Nothing under tests/ (helpers/ and conftest.py
    included) imports a test module."""
    bad = []
    for path in _files(TESTS):
        me = _module_name(path)
        for imp in imports(path):
            target = _source_module(imp)
            if target.split(".")[0] == "tests" and target.split(".")[-1].startswith("test_") \
                    and target != me:
                bad.append(f"{imp.where()} (imports the test module {target})")
    assert not bad, "test modules importing each other:\n" + "\n".join(bad)


def test_entry_points_never_import_each_other():
    bad = [f"{imp.where()} ({app} imports {imp.module.split('.')[0]})"
           for app in APPS for path in _files(REPO / app) for imp in imports(path)
           if imp.module.split(".")[0] in APPS and imp.module.split(".")[0] != app]
    assert not bad, "entry points importing each other:\n" + "\n".join(bad)


def test_the_library_never_imports_an_entry_point():
    bad = [imp.where() for path in _files(SRC) for imp in imports(path)
           if imp.module.split(".")[0] in APPS]
    assert not bad, "src/ importing training, export or evaluation:\n" + "\n".join(bad)


def _runtime_strings(path: Path) -> Iterator[Import]:
    """Module names written as strings in runtime/ (its lazy ``_LAZY`` table)."""
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and node.value.startswith("replaylab.") and _module_file(node.value):
            yield Import(path, node.lineno, node.value, None, repr(node.value))


def _parents(module: str) -> list[str]:
    """Packages Python imports before module: replaylab.a.b -> replaylab, replaylab.a."""
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def test_runtime_imports_only_runtime_contracts_and_light_libraries():
    bad, seen = [], set()
    todo = [(p, "") for p in _files(RUNTIME)]
    while todo:  # everything serving loads: runtime/, then what it reaches in the house
        path, via = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        me = _module_name(path)
        in_runtime = path.is_relative_to(RUNTIME)
        via = "" if in_runtime else via
        for imp in [*imports(path), *(_runtime_strings(path) if in_runtime else ())]:
            top, target = imp.module.split(".")[0], _source_module(imp)
            if top in RUNTIME_FORBIDDEN:
                bad.append(f"{imp.where()} ({top} is not installed for serving{via})")
            elif top in HOUSE and _module_file(target):
                if not (any(
                        target == p or target.startswith(p + ".") for p in RUNTIME_MAY_IMPORT)):
                    bad.append(f"{imp.where()} (runtime/ may import only runtime/ and "
                               f"contracts/; {target} is not allow-listed{via})")
                    continue  # reported here; what it would pull in follows from that
                for module in (*_parents(target), target):
                    if module != me:
                        todo.append((_module_file(module), f"; reached via {me}"))
    assert not bad, "runtime/ imports beyond its install:\n" + "\n".join(sorted(set(bad)))


def test_mlflow_and_the_environment_only_in_apps():
    bad = []
    for path in _files(SRC):
        if path.is_relative_to(APPS_SHARED):
            continue
        for imp in imports(path):
            if imp.module.split(".")[0] == "mlflow":
                bad.append(f"{imp.where()} (MLflow outside src/replaylab/apps/)")
            elif imp.module == "os" and imp.name in ENV_NAMES:
                bad.append(f"{imp.where()} (environment read outside src/replaylab/apps/)")
        for line, module, chain, text in _attribute_chains(path):
            if module == "os" and chain[0] in ENV_NAMES:
                bad.append(f"{path.relative_to(REPO)}:{line}: {text} "
                           "(environment read outside src/replaylab/apps/)")
    assert not bad, "MLflow or the environment under src/:\n" + "\n".join(sorted(set(bad)))


# ---------------------------------------------------------------- import cycles
# Cycles among the library's modules (every import counts, a lazy one too). The last one,
# the six-module circle around the old fleet/experiments.py, went with issue 14. Lower
# this number when a cycle goes; never raise it.
KNOWN_CYCLES = 0
FLEET_EXPERIMENTS = "replaylab.fleet.experiments"
FLEET_HARNESS = (f"{FLEET_EXPERIMENTS}.harness", f"{FLEET_EXPERIMENTS}.workloads")


def import_graph(files: list[Path]):
    """networkx DiGraph: module -> each module of this repository it imports (edge
    attribute `where`: the first import statement)."""
    import networkx as nx

    graph = nx.DiGraph()
    for path in files:
        me = _module_name(path)
        graph.add_node(me)
        for imp in imports(path):
            target = _source_module(imp)
            if target != me and target.split(".")[0] in HOUSE and _module_file(target) \
                    and not graph.has_edge(me, target):
                graph.add_edge(me, target, where=imp.where())
    return graph


def test_no_import_cycle_in_the_library():
    import networkx as nx

    graph = import_graph(_files(LIBRARY))
    cycles = sorted(sorted(c) for c in nx.strongly_connected_components(graph) if len(c) > 1)
    shown = [" <-> ".join(c) + "\n    " + "\n    ".join(
        graph.edges[a, b]["where"] for a in c for b in c if graph.has_edge(a, b))
        for c in cycles]
    assert len(cycles) <= KNOWN_CYCLES, (f"{len(cycles)} import cycles (at most "
                                         f"{KNOWN_CYCLES}):\n" + "\n".join(shown))


def test_each_fleet_experiment_imports_only_the_harness():
    """The experiment package: harness/ and workloads.py know no experiment by name;
    each experiment (a module, or a package such as autoscaling/ whose modules may import
    one another) imports the harness and no other experiment."""
    package = LIBRARY / "fleet" / "experiments"

    def experiment(module: str) -> str:
        return module.removeprefix(FLEET_EXPERIMENTS + ".").split(".")[0]

    bad = []
    for path in _files(package):
        me = _module_name(path)
        for imp in imports(path):
            target = _source_module(imp)
            if target.startswith(FLEET_EXPERIMENTS + ".") and target not in FLEET_HARNESS \
                    and experiment(target) != experiment(me):
                bad.append(f"{imp.where()} ({me} imports the experiment {target})")
    assert not bad, "fleet experiments importing each other:\n" + "\n".join(bad)


def _package(module: str) -> str:
    """The house package a module belongs to (its floor's unit)."""
    parts = module.split(".")
    if parts[0] != "replaylab":
        return parts[0]
    if parts[1:3] == ["fleet", "experiments"]:
        return "fleet.experiments"
    return parts[1] if len(parts) > 1 else "replaylab"


def test_arrows_point_down_between_floors():
    """0 back-arrows: each import between two packages goes to a strictly lower floor."""
    floor = {package: i for i, row in enumerate(FLOORS) for package in row}
    files = [*_files(LIBRARY), *(p for app in APPS for p in _files(REPO / app))]
    unplaced = sorted({_package(_module_name(p)) for p in files} - floor.keys())
    assert not unplaced, f"packages with no floor in FLOORS: {unplaced}"
    bad = []
    for path in files:
        me = _package(_module_name(path))
        for imp in imports(path):
            target = _source_module(imp)
            if target.split(".")[0] not in HOUSE or not _module_file(target):
                continue
            there = _package(target)
            if there != me and floor[there] >= floor[me]:
                bad.append(f"{imp.where()} ({me}, floor {floor[me]} -> {there}, "
                           f"floor {floor[there]})")
    assert not bad, f"{len(bad)} arrows that do not point down:\n" + "\n".join(bad)


# tests/ mirrors the source: one folder per package (tests/router/ for replaylab.router,
# ...), plus house/ (checks of the whole repository), common/ (config, stats, jsonsafe),
# scorers/ (the Rust crate), helpers/ (shared code) and data/ (committed slices)
TEST_FOLDERS_BESIDE_PACKAGES = {"house", "common", "scorers", "helpers", "data", "screenshots"}


def test_tests_mirror_the_source_one_folder_per_package():
    packages = {p.name for p in LIBRARY.iterdir() if (p / "__init__.py").is_file()}
    loose = sorted(p.name for p in TESTS.glob("test_*.py"))
    assert not loose, f"test modules outside a package folder: {loose}"
    bad = []
    for folder in sorted(p for p in TESTS.iterdir() if p.is_dir() and p.name != "__pycache__"):
        if folder.name not in packages | TEST_FOLDERS_BESIDE_PACKAGES:
            bad.append(f"tests/{folder.name}/ is no package of src/replaylab")
        elif any(folder.glob("test_*.py")) and not (folder / "__init__.py").is_file():
            bad.append(f"tests/{folder.name}/ has no __init__.py")
    assert not bad, "\n".join(bad)


# ---------------------------------------------------------------- issue 44: one engine
# No Dask twin is left in pipelines/, and only the engine package (`replaylab.compute`)
# imports dask, distributed or lightgbm.dask (every import counts, lazy ones too).

ENGINE = LIBRARY / "compute"
DASK_MODULES = ("dask", "distributed", "lightgbm.dask")


def is_dask_import(module: str, name: str | None) -> bool:
    full = f"{module}.{name}" if name else module
    return any(module == m or module.startswith(m + ".") or full == m for m in DASK_MODULES)


def test_no_dask_twin_is_left_in_pipelines():
    twins = sorted(str(p.relative_to(REPO)) for p in (LIBRARY / "pipelines").rglob("*_dask.py"))
    assert twins == [], f"Dask twins still in pipelines/: {twins}"


def test_only_the_engine_imports_dask():
    outside = [imp.where() for path in sorted(LIBRARY.rglob("*.py"))
               if not path.is_relative_to(ENGINE)
               for imp in imports(path) if is_dask_import(imp.module, imp.name)]
    assert outside == [], "dask imported outside replaylab.compute:\n" + "\n".join(outside)
