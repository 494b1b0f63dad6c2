"""kforge's own modules import each other without cycles, late (in-function) imports included: a cycle means
two modules share one job, or one reaches back up."""
import ast
from pathlib import Path

from tests.support import REPO


def imports_of(path: Path, package: str) -> set[str]:
    """Modules of `package` that the file imports anywhere in it (module level or inside functions)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == package}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == package:
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}   # `from rules import artifact`
    return found


def module_graph(package: str = "rules") -> dict[str, set[str]]:
    files = {".".join(p.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__"): p
             for p in (REPO / package).rglob("*.py")}
    return {name: {m for m in imports_of(path, package) if m in files and m != name}
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


def test_rules_has_no_import_cycles():
    graph = module_graph()
    assert "rules.artifact" in graph and graph["rules.project"]   # the graph was really read
    assert cycles(graph) == []


def test_every_package_of_the_code_is_installed():
    """pyproject's package list names every directory of rules/ and kernels/ that holds Python code (a
    non-editable install once lacked kernels.ep)."""
    import tomllib
    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(REPO).parts) for top in ("rules", "kernels")
             for p in (REPO / top).rglob("*.py") if "__pycache__" not in p.parts}
    assert found <= listed, f"not installed: {sorted(found - listed)}"
