"""kforge's own modules import each other without cycles, late (in-function) imports included: a cycle means
two modules share one job, or one reaches back up."""
import ast
from pathlib import Path

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
                found |= {f"{module}.{a.name}" for a in node.names}   # `from kforge import artifact`
    return found


def module_graph() -> dict[str, set[str]]:
    files = {module_name(p): p for p in PACKAGES["kforge"].rglob("*.py") if "__pycache__" not in p.parts}
    return {name: {m for m in imports_of(path) if m in files and m != name} for name, path in files.items()}


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
