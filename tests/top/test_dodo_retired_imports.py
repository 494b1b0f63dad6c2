"""A dodo.py written for an older kforge (rules/__init__.py's finder of retired module names): one line, not doit's traceback."""
import subprocess
import sys

import pytest


@pytest.mark.parametrize("dodo", ["from kforge import doit_edge", "from kforge.doit_edge import *",
                                  "import kforge.catalog"])
def test_a_dodo_that_imports_a_retired_module_is_one_line_naming_it_and_the_fix(tmp_path, dodo):
    (tmp_path / "dodo.py").write_text(dodo + "\n")
    run = subprocess.run([sys.executable, "-m", "doit", "list"], cwd=tmp_path, capture_output=True, text=True)
    name = "kforge.catalog" if "catalog" in dodo else "kforge.doit_edge"
    assert run.returncode == 3
    assert run.stderr.splitlines() == [f"ERROR: {name} was a module of an older kforge (its modules now lie in the "
                                       f"stations base, load, declare, store, plan, share, compile, ship, tune, "
                                       f"report, edge); a project's dodo.py is one line, `from kforge.dodo import *` "
                                       f"(README.md)"]


def test_a_name_kforge_never_had_is_pythons_own_error():
    with pytest.raises(ModuleNotFoundError, match=r"^No module named 'kforge.no_such_module'$"):
        import kforge.no_such_module  # noqa: F401
