"""Kernel sources: entry parameters and the local-import closure, read without importing."""
from rules import sources


def test_closure_follows_local_imports_only(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "main.py").write_text("import os\nimport triton\nfrom pkg import helper\nfrom .util import f\n")
    (tmp_path / "pkg" / "helper.py").write_text("import pkg.deep\n")
    (tmp_path / "pkg" / "deep.py").write_text("X = 1\n")
    (tmp_path / "pkg" / "util.py").write_text("def f(): pass\n")
    (tmp_path / "pkg" / "unused.py").write_text("")
    closure = sources.local_closure(tmp_path / "pkg" / "main.py", tmp_path)
    names = sorted(p.name for p in closure)
    assert names == ["__init__.py", "deep.py", "helper.py", "main.py", "util.py"]


def test_function_params(tmp_path):
    f = tmp_path / "k.py"
    f.write_text("def k(a, b, *, C=1):\n    pass\nx = 1\n")
    assert sources.function_params(f, "k") == ("a", "b", "C")
    assert sources.function_params(f, "nope") is None
    assert sources.module_name(f, tmp_path) == "k"
