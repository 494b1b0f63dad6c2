"""Kernel sources: entry parameters and the local-import closure, read without importing."""
from kforge.load import sources


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


def test_installed_packages_hidden_dirs_and_out_are_never_project_source(tmp_path):
    """README's set-up makes .venv inside the checkout: its packages are dependencies, never keyed or walked."""
    venv_site = tmp_path / "venv" / "lib" / "python3.11" / "site-packages"
    for folder in (tmp_path / "kernels", tmp_path / ".hidden", tmp_path / "out" / "x", venv_site / "torch"):
        folder.mkdir(parents=True)
    (tmp_path / "venv" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    for name in ("torch.py", "helper.py"):   # a project module named like an installed package is still project
        (tmp_path / "kernels" / name).write_text("")
    (tmp_path / "kernels" / "k.py").write_text("from kernels import helper\nimport venv.lib\nimport out.x.gen\n"
                                               "from .hidden import h\nimport torch\n")
    (tmp_path / "out" / "x" / "gen.py").write_text("")
    (tmp_path / ".hidden" / "h.py").write_text("")
    (venv_site / "torch" / "__init__.py").write_text("")
    (tmp_path / "venv" / "lib" / "__init__.py").write_text("")
    closure = sources.local_closure(tmp_path / "kernels" / "k.py", tmp_path)
    assert sorted(p.name for p in closure) == ["helper.py", "k.py"]
    problem = sources.project_source_problem
    assert problem(tmp_path / "kernels" / "k.py", tmp_path) is None
    assert "virtualenv venv/" in problem(venv_site / "torch" / "__init__.py", tmp_path)
    assert "hidden directory .hidden/" in problem(tmp_path / ".hidden" / "h.py", tmp_path)
    assert "out/" in problem(tmp_path / "out" / "x" / "gen.py", tmp_path)
    assert "outside the project" in problem(tmp_path.parent / "elsewhere.py", tmp_path)


def test_a_run_time_import_puts_its_whole_top_level_package_in_the_closure(tmp_path):
    """importlib.import_module("pkg." + name) cannot be read: every module of the package counts, so editing
    the one it loads rebuilds (a binary is never kept as up to date after what it was built from changed)."""
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    for rel in ("pkg/__init__.py", "pkg/consts.py", "pkg/sub/__init__.py", "pkg/sub/more.py", "other.py"):
        (tmp_path / rel).write_text("X = 1\n")
    (tmp_path / "pkg" / "k.py").write_text('import importlib\nSCALE = importlib.import_module("pkg." + "consts")\n')
    (tmp_path / "pkg" / "static.py").write_text("import os\n")
    names = lambda p: [str(f.relative_to(tmp_path)) for f in sources.local_closure(tmp_path / p, tmp_path)]
    assert names("pkg/k.py") == ["pkg/__init__.py", "pkg/consts.py", "pkg/k.py", "pkg/static.py",
                                 "pkg/sub/__init__.py", "pkg/sub/more.py"]
    assert names("pkg/static.py") == ["pkg/__init__.py", "pkg/static.py"]   # no run-time import: as before


def test_an_entry_is_what_the_module_holds_under_its_name_guarded_or_built_by_calls(tmp_path):
    path = tmp_path / "ops.py"
    path.write_text(
        "import triton\n"
        "try:\n"
        "    import extra\n"
        "except ImportError:\n"
        "    if True:\n"
        "        @triton.jit\n"
        "        def guarded(a, b, BLOCK):\n"
        "            pass\n"
        "def _k(x, y, n, BLOCK=128):\n"
        "    pass\n"
        "built = triton.autotune(configs=[], key=['n'])(triton.heuristics({})(triton.jit(_k)))\n"
        "plain = triton.jit(_k)\n")
    assert sources.function_params(path, "guarded") == ("a", "b", "BLOCK")
    assert sources.function_params(path, "built") == ("x", "y", "n", "BLOCK")
    assert sources.function_defaults(path, "built") == {"BLOCK": 128}
    node, calls = sources.entry_def(path, "built")
    assert node.name == "_k" and calls == ("autotune", "heuristics", "jit")
    assert sources.entry_def(path, "plain")[1] == ("jit",)
    assert sources.entry_def(path, "missing") == (None, ())
    assert "guarded" in sources.function_names(path)


def test_a_default_named_from_a_module_of_the_package_is_read_past_star_imports_that_cannot_rebind_it(tmp_path):
    """`from .util import *` beside `from .consts import BLOCK` counted as a second binding of BLOCK, so the default
    was refused (gemlite's GEMM modules, an outside review): a star import of the package's own module rebinds
    only what that module exports; one of another package's may rebind anything."""
    pkg = tmp_path / "lib"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "consts.py").write_text("BLOCK = 128\n")
    (pkg / "util.py").write_text("HELPER = 1\n_BLOCK = 2\nfrom .more import *\n")
    (pkg / "more.py").write_text("OTHER = 3\n")
    (pkg / "listed.py").write_text("__all__ = ['BLOCK']\nBLOCK = 64\n")
    (pkg / "extended.py").write_text("__all__ = []\n__all__ += ['BLOCK']\nBLOCK = 64\n")
    # what Python binds BLOCK to through these modules' star imports: each another value, so never read as 128
    for name, text in (("tuple", "BLOCK, OTHER = 256, 1\n"), ("loop", "for BLOCK in (32, 64):\n    pass\n"),
                       ("appended", "__all__ = ['X']\nX = 1\nBLOCK = 256\n__all__.append('BLOCK')\n"),
                       ("dynamic", "globals()['BLOCK'] = 256\n"),
                       ("matched", "match 256:\n    case BLOCK:\n        pass\n"),
                       ("by_setattr", "import sys\nsetattr(sys.modules[__name__], 'BLOCK', 256)\n"),
                       ("other_setattr", "class C:\n    pass\nsetattr(C, 'BLOCK', 256)\nOTHER = vars(C)\n"),
                       ("in_function", "def f():\n    global BLOCK\n    BLOCK = 256\nf()\n"),
                       ("cycle", "from .cycle2 import *\n"), ("cycle2", "from .cycle import *\nOTHER = 1\n")):
        (pkg / f"{name}.py").write_text(text)
    kernel = "\ndef k(x, BLOCK=BLOCK):\n    pass\n"
    defaults = {}
    for name, star in (("star", "from .util import *"), ("rebinds", "from .listed import *"),
                       ("extends", "from .extended import *"), ("foreign", "from os.path import *"),
                       ("again", "from .consts import *"), ("tuple", "from .tuple import *"),
                       ("loop", "from .loop import *"), ("appended", "from .appended import *"),
                       ("dynamic", "from .dynamic import *"), ("in_function", "from .in_function import *"),
                       ("cycle", "from .cycle import *"), ("by_setattr", "from .by_setattr import *"),
                       ("matched", "from .matched import *"),
                       ("other_setattr", "from .other_setattr import *")):
        (pkg / f"k_{name}.py").write_text(f"from .consts import BLOCK\n{star}\n{kernel}")
        defaults[name] = sources.function_defaults(pkg / f"k_{name}.py", "k")
    bound = {name: {} for name in defaults}
    # a loop of stars binds no BLOCK, nor an attribute set on a class
    assert defaults == {**bound, "star": {"BLOCK": 128}, "cycle": {"BLOCK": 128}, "other_setattr": {"BLOCK": 128}}
    (pkg / "own.py").write_text("BLOCK, OTHER = 256, 1\nBLOCK = 128\n" + kernel)   # the module's own rebinding
    assert sources.function_defaults(pkg / "own.py", "k") == {}


def test_a_file_nested_too_deeply_to_parse_is_a_syntax_error_naming_it(tmp_path):
    """`X = ----...1` thousands deep: ast.parse raised RecursionError (MemoryError deeper), a traceback from
    `doit list`; every caller of parse handles SyntaxError."""
    for depth in (3000, 8000):
        f = tmp_path / f"deep{depth}.py"
        f.write_text("X = " + "-" * depth + "1\n")
        try:
            sources.parse(f)
        except SyntaxError as e:
            assert e.filename == str(f) and "nested too deeply" in e.msg
        else:
            raise AssertionError("parsed")


def test_star_imports_layered_so_that_paths_multiply_read_each_module_once(tmp_path, monkeypatch):
    """Eight layers of six modules, each star-importing all six of the next: 6^8 paths, 48 modules. Each path was
    walked (a 6-wide package took 36 s, an 8-wide one hung `doit list`, a hostile-input review); each module is
    asked once now, and past STAR_MODULES modules the name is taken as rebound."""
    pkg = tmp_path / "lib"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "consts.py").write_text("BLOCK = 128\n")
    for layer in range(8):
        for i in range(6):
            below = "".join(f"from .m{layer + 1}_{j} import *\n" for j in range(6)) if layer < 7 else ""
            (pkg / f"m{layer}_{i}.py").write_text(below + f"OTHER_{layer}_{i} = 1\n")
    (pkg / "k.py").write_text("from .consts import BLOCK\nfrom .m0_0 import *\n\ndef k(x, BLOCK=BLOCK):\n    pass\n")
    asked = []
    star_binds = sources._star_binds
    monkeypatch.setattr(sources, "_star_binds", lambda *a: asked.append(a[0]) or star_binds(*a))
    assert sources.function_defaults(pkg / "k.py", "k") == {"BLOCK": 128}
    assert len(asked) < 400, len(asked)   # the star-import statements read, each once: 1 + 48 x 6 at the most
