"""kforge's own modules import each other without cycles, late (in-function) imports included: a cycle means
two modules share one job, or one reaches back up."""
import ast
import re
from pathlib import Path

from kforge import STATIONS
from tests.support import REPO


PACKAGES = {"kforge": REPO / "rules", "kforge_runtime": REPO / "rules" / "runtime"}   # pyproject's package-dir


def module_name(path: Path) -> str:
    """rules/x.py -> kforge.x, rules/runtime/y.py -> kforge_runtime.y (as installed)."""
    package, folder = max(((p, f) for p, f in PACKAGES.items() if f in path.parents), key=lambda pf: len(pf[1].parts))
    return ".".join((package, *path.relative_to(folder).with_suffix("").parts)).removesuffix(".__init__")


def imports_of(path: Path) -> set[str]:
    """Modules of kforge that the file imports anywhere in it (module level or inside functions, relative too)."""
    here = module_name(path).rsplit(".", 1)[0] if path.name != "__init__.py" else module_name(path)
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] in PACKAGES}
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                module = ".".join(filter(None, [here.rsplit(".", node.level - 1)[0] if node.level > 1 else here, module]))
            if module.split(".")[0] in PACKAGES:
                found.add(module)
                found |= {f"{module}.{a.name}" for a in node.names}   # `from kforge.store import artifact`
    return found


def named_in_strings(path: Path) -> set[str]:
    """kforge modules a file names in a string that is exactly a module path (`"kforge.tune.gpu_bench"` for
    `python -m`, `"kforge.x:attr"` for importlib or an entry point): imports all the same. Docstrings and
    messages are prose, not names, and do not count."""
    tree = ast.parse(path.read_text())
    prose = {id(n.body[0].value) for n in ast.walk(tree)
             if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and n.body
             and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    return {n.value.split(":")[0] for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in prose
            and re.fullmatch(r"kforge(\.\w+)+(:\w+)?", n.value)}


def module_graph() -> dict[str, set[str]]:
    files = {module_name(p): p for p in PACKAGES["kforge"].rglob("*.py") if "__pycache__" not in p.parts}
    # a module's own enclosing packages are imported before it by Python itself: no edge of its choosing
    return {name: {m for m in imports_of(path) | named_in_strings(path)
                   if m in files and m != name and not name.startswith(m + ".")}
            for name, path in files.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    found, state, stack = [], {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                found.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = "done"
    for node in sorted(graph):
        if node not in state:
            visit(node)
    return found


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_kforge_has_no_import_cycles():
    graph = module_graph()
    assert graph["kforge.edge.dodo_tasks"] and "kforge_runtime.schema" in graph["kforge.store.artifact"]   # really read
    assert "kforge_runtime.schema" in graph["kforge_runtime.bundle"]   # relative imports read too
    assert cycles(graph) == []


def station_of(module: str) -> str | None:
    """kforge.plan.keys -> "plan"; None for kforge's top-level entry modules and for kforge_runtime."""
    parts = module.split(".")
    return parts[1] if parts[0] == "kforge" and len(parts) > 1 and parts[1] in STATIONS else None


def against_the_order(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(importer, imported) pairs where a station's module imports a later station or a top-level entry module,
    or kforge_runtime imports kforge."""
    wrong = []
    for module, imported in graph.items():
        if module.startswith("kforge_runtime"):
            wrong += [(module, m) for m in imported if m.split(".")[0] == "kforge"]
        elif (here := station_of(module)) is not None:
            for m in filter(lambda m: m.startswith("kforge."), imported):
                there = station_of(m)
                if there is None or STATIONS.index(there) > STATIONS.index(here):
                    wrong.append((module, m))
    return sorted(wrong)


def test_the_stations_follow_the_data():
    """A target's data: the vocabulary, then loading code, what is declared, the store it lands in, the plan of
    targets and keys, the caches that share artifacts by key, the compile, then shipping, tuning, reporting and
    doit's edge. The plan comes before share and compile: both take its keys, neither is taken by it."""
    assert STATIONS == ("base", "load", "declare", "store", "plan", "share", "compile", "ship", "tune", "report",
                        "edge")


def test_each_station_imports_only_the_stations_before_it():
    """rules/ is a few station packages in the data's order (kforge.STATIONS); a module of one imports its
    own station's modules and those of earlier stations, never a later one nor a top-level entry module
    (module names given to importlib or `python -m` as strings count). kforge_runtime, which bundles ship,
    imports no kforge at all."""
    graph = module_graph()
    wrong = against_the_order(graph)
    assert not wrong, "imports against the stations' order: " + ", ".join(f"{a} -> {b}" for a, b in wrong)
    assert "kforge.tune.gpu_bench" in graph["kforge.tune.tasks"]   # the `python -m` string is counted


def test_the_station_order_check_catches_an_upward_import():
    graph = {"kforge.store.artifact": {"kforge.base.layout", "kforge.plan.keys", "kforge.dodo"},
             "kforge.plan.keys": {"kforge.store.artifact", "kforge_runtime.schema"},
             "kforge_runtime.bundle": {"kforge.base.archs"}, "kforge.dodo": {"kforge.edge.config"}}
    assert against_the_order(graph) == [("kforge.store.artifact", "kforge.dodo"),
                                        ("kforge.store.artifact", "kforge.plan.keys"),
                                        ("kforge_runtime.bundle", "kforge.base.archs")]


def test_rules_top_level_stays_small_and_every_station_says_its_job():
    top = [p.name for p in PACKAGES["kforge"].glob("*.py")]
    assert len(top) <= 12, top
    assert sorted(p.name for p in PACKAGES["kforge"].iterdir() if (p / "__init__.py").exists()) == sorted(
        [*STATIONS, "runtime"])
    for station in STATIONS:
        doc = ast.get_docstring(ast.parse((PACKAGES["kforge"] / station / "__init__.py").read_text()))
        assert doc and "May import:" in doc, station


def test_every_package_of_the_code_is_installed_and_the_example_kernels_are_not():
    """Every folder of rules/ that holds Python code is an installed package, under the import name pyproject
    maps it to; kforge's example kernels (kernels/) are the checkout's, never a top-level `kernels` package."""
    import tomllib
    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert setuptools["package-dir"] == {name: str(folder.relative_to(REPO)) for name, folder in PACKAGES.items()}
    found = {module_name(p).removesuffix("." + p.stem) if p.name != "__init__.py" else module_name(p)
             for p in PACKAGES["kforge"].rglob("*.py") if "__pycache__" not in p.parts}
    assert found == set(setuptools["packages"])
    assert not any(name.split(".")[0] == "kernels" for name in setuptools["packages"])


def test_tests_and_benchmarks_do_not_import_each_other():
    """Tests stand on kforge alone, benchmarks too: neither reaches into the other's helpers."""
    for folder, other in (("tests", "bench"), ("bench", "tests")):
        for path in sorted((REPO / folder).glob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                         [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
                assert not any(n.split(".")[0] == other for n in names), f"{path.relative_to(REPO)} imports {other}"


def test_the_tests_mirror_the_stations_one_file_per_module_named_after_it():
    """tests/<station>/test_<module>[_<what>].py for rules/<station>/<module>.py; tests/runtime/ for rules/runtime/,
    tests/kernels/ep/ for kernels/ep/; the few others in folders named for what they test. None at tests/'s top."""
    tests = REPO / "tests"
    code = {station: REPO / "rules" / station for station in STATIONS}
    code |= {"runtime": REPO / "rules" / "runtime", "kernels/ep": REPO / "kernels" / "ep", "top": REPO / "rules"}
    others = {"bench", "examples", "repo"}
    assert not list(tests.glob("test_*.py"))
    for path in sorted(tests.glob("**/test_*.py")):
        folder = path.parent.relative_to(tests).as_posix()
        assert folder in code or folder in others, path
        if folder in code:
            modules = {p.stem for p in code[folder].glob("*.py")} - {"__init__"}
            name = path.stem.removeprefix("test_")
            assert any(name == m or name.startswith(m + "_") for m in modules), \
                f"{path.relative_to(REPO)} names no module of {code[folder].relative_to(REPO)}"
