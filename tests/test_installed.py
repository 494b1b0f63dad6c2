"""rules/installed.py and `module = "..."` specs: kernels of an installed package, built without copying them,
keyed by what they execute within their distribution."""
import sys
import textwrap

import pytest

from kforge import installed
from tests.support import doit, make_project, statuses

PACKAGE = "kforge_testlib"

FILES = {
    # the top-level __init__ imports every op, as libraries do: editing one op must not rebuild the others
    "__init__.py": "from kforge_testlib.ops import scale, shift  # noqa: F401\n",
    "ops/__init__.py": "",
    "ops/consts.py": "import triton.language as tl\n\nFACTOR = tl.constexpr(3)\n",
    "ops/scale.py": '''
        import triton
        import triton.language as tl

        from .consts import FACTOR


        @triton.autotune(configs=[triton.Config({"BLOCK": 128}, num_warps=4)], key=["n"])
        @triton.heuristics({"EVEN": lambda args: args["n"] % args["BLOCK"] == 0})
        @triton.jit
        def scale_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr, EVEN: tl.constexpr):
            i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            m = i < n
            tl.store(y_ptr + i, tl.load(x_ptr + i, mask=m) * FACTOR, mask=m)
        ''',
    "ops/shift.py": '''
        import triton
        import triton.language as tl


        @triton.jit
        def shift_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
            i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            m = i < n
            tl.store(y_ptr + i, tl.load(x_ptr + i, mask=m) + 1, mask=m)
        ''',
}


def install(site):
    """The package as pip leaves it in site-packages: its files and a dist-info naming it."""
    for rel, text in FILES.items():
        path = site / PACKAGE / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    info = site / "kforge_testlib-1.2.3.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: kforge-testlib\nVersion: 1.2.3\n\nA test library.\n")
    (info / "top_level.txt").write_text(f"{PACKAGE}\n")
    return site


def spec(name, module, entry, extra_args=""):
    return textwrap.dedent(f'''
        [kernel]
        name = "{name}"
        module = "{module}"
        entry = "{entry}"
        toolchain = "triton"
        archs = ["sm_90a", "gfx942"]
        id = "b{{BLOCK}}"

        [signature]
        x_ptr = "*fp32"
        y_ptr = "*fp32"
        n = "i32"
        BLOCK = "constexpr"
        {extra_args}

        [sweep]
        BLOCK = [128, 256]
        ''')


@pytest.fixture
def site(tmp_path, monkeypatch):
    found = install(tmp_path / "site")
    monkeypatch.syspath_prepend(str(found))
    return found


def test_a_module_is_found_on_the_path_without_importing_it(site):
    module = installed.find(f"{PACKAGE}.ops.scale")
    assert module.path == site / PACKAGE / "ops" / "scale.py" and module.base == site
    assert PACKAGE not in sys.modules
    assert module.distribution() == ("kforge-testlib", "1.2.3")


def test_the_closure_follows_imports_within_the_package_but_not_what_its_init_files_import(site):
    closure = {str(p.relative_to(site)) for p in installed.find(f"{PACKAGE}.ops.scale").closure()}
    assert closure == {f"{PACKAGE}/__init__.py", f"{PACKAGE}/ops/__init__.py", f"{PACKAGE}/ops/scale.py",
                       f"{PACKAGE}/ops/consts.py"}   # not shift.py, which the top-level __init__ imports
    assert not any("triton" in p for p in closure)


@pytest.mark.parametrize("name", ["no_such_package.ops", "kforge_testlib.ops.absent", "../etc/passwd", "a..b"])
def test_a_module_that_is_not_installed_is_refused_saying_so(site, name):
    with pytest.raises(installed.NotInstalled):
        installed.find(name)


def test_a_spec_naming_a_missing_module_or_both_source_and_module_is_one_clear_line(site, tmp_path):
    root = make_project(tmp_path / "p", specs={"bad": spec("bad", f"{PACKAGE}.ops.nothing", "scale_kernel")})
    proc = doit(root, "list", check=False, env={"PYTHONPATH": str(site)})
    assert proc.returncode == 2 and "specs/bad.toml: [kernel] module: no kforge_testlib.ops.nothing" in proc.stderr
    both = spec("both", f"{PACKAGE}.ops.shift", "shift_kernel").replace('module =', 'source = "tk/scale.py"\nmodule =')
    (root / "specs" / "bad.toml").write_text(both)
    proc = doit(root, "list", check=False, env={"PYTHONPATH": str(site)})
    assert proc.returncode == 2 and "give exactly one of `source`" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_an_installed_librarys_kernels_build_and_an_edit_rebuilds_only_its_own_targets(site, tmp_path):
    """Autotuned and heuristics-wrapped entries included: the spec's config gives the values they choose."""
    specs = {"lib_scale": spec("lib_scale", f"{PACKAGE}.ops.scale", "scale_kernel", 'EVEN = "constexpr"')
             + "\n[constants]\nEVEN = true\n",
             "lib_shift": spec("lib_shift", f"{PACKAGE}.ops.shift", "shift_kernel")}
    root = make_project(tmp_path / "p", specs=specs, kernels={})
    env = {"PYTHONPATH": str(site)}
    doit(root, "-n", "2", env=env)
    assert len(statuses(root, "built")) == 8
    doit(root, env=env)
    assert statuses(root, "built") == set()
    shift = site / PACKAGE / "ops" / "shift.py"
    shift.write_text(shift.read_text().replace("+ 1", "+ 2"))
    doit(root, "-n", "2", env=env)
    assert statuses(root, "built") == {f"lib_shift:b{b}@{a}" for b in (128, 256) for a in ("sm_90a", "gfx942")}
    consts = site / PACKAGE / "ops" / "consts.py"   # imported by scale.py only, relatively
    consts.write_text(consts.read_text().replace("(3)", "(5)"))
    doit(root, "-n", "2", env=env)
    assert statuses(root, "built") == {f"lib_scale:b{b}@{a}" for b in (128, 256) for a in ("sm_90a", "gfx942")}
