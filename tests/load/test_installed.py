"""rules/load/installed.py and `module = "..."` specs: kernels of an installed package, built without copying them,
keyed by what they execute within their distribution."""
import json
import os
import sys
import textwrap

import pytest

from kforge.load import installed, sources
from kforge.base.errors import SpecError
from tests.support import doit, kernel_text, make_project, redirected_package, spec_text, statuses, write_site_package

PACKAGE = "kforge_testlib"

FILES = {
    # the top-level __init__ imports every op, as libraries do: the static key of one op's targets leaves the
    # others out; every compile still reads them (tests/load/test_observe_edits.py)
    "__init__.py": "from kforge_testlib.ops import scale, shift  # noqa: F401\n",
    "ops/__init__.py": "",
    "ops/consts.py": "import triton.language as tl\n\nFACTOR = tl.constexpr(3)\n",
    "ops/scale.py": '''
        import triton
        import triton.language as tl

        from .consts import FACTOR


        @triton.autotune(configs=[triton.Config({"BLOCK": 128}, num_warps=4),
                                  triton.Config({"BLOCK": 256}, num_warps=8)], key=["n"])
        @triton.heuristics({"EVEN": lambda args: args["n"] % args["BLOCK"] == 0})
        @triton.jit
        def scale_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr, EVEN: tl.constexpr):
            i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            m = i < n
            tl.store(y_ptr + i, tl.load(x_ptr + i, mask=m) * FACTOR, mask=m)
        ''',
    "ops/amd.py": '''
        import triton
        import triton.language as tl


        def configs():   # built by code, as libraries do: only importing the module tells what they are
            return [triton.Config({"BLOCK": b, "waves_per_eu": w}, num_warps=4, num_stages=2)
                    for b in (128, 256) for w in (0, 2)]


        @triton.autotune(configs=configs(), key=["n"])
        @triton.jit
        def amd_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
            i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            m = i < n
            tl.store(y_ptr + i, tl.load(x_ptr + i, mask=m) * 2, mask=m)
        ''',
    "ops/bias.py": '''
        import triton
        import triton.language as tl


        @triton.jit
        def bias_kernel(x_ptr, y_ptr, bias_ptr, n, BLOCK: tl.constexpr = 128, SCALE: tl.constexpr = 2.0,
                        MODE: tl.constexpr = "add"):
            i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            m = i < n
            y = tl.load(x_ptr + i, mask=m) * SCALE
            if bias_ptr is not None:
                if MODE == "add":
                    y += tl.load(bias_ptr + i, mask=m)
            tl.store(y_ptr + i, y, mask=m)
        ''',
    "ops/desc.py": '''
        import triton
        import triton.language as tl


        @triton.jit
        def desc_copy_kernel(in_desc, out_desc, BLOCK: tl.constexpr):
            row = tl.program_id(0) * BLOCK
            out_desc.store([row, 0], in_desc.load([row, 0]) * 2)
        ''',
    "ops/acts.py": '''
        import triton
        import triton.language as tl


        @triton.jit
        def double(x):
            return x * 2


        @triton.jit
        def square(x):
            return x * x


        @triton.jit
        def apply_kernel(x_ptr, y_ptr, n, ACT: tl.constexpr, BLOCK: tl.constexpr):
            i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            m = i < n
            tl.store(y_ptr + i, ACT(tl.load(x_ptr + i, mask=m)), mask=m)
        ''',
    "ops/envk.py": '''
        import os

        import triton
        import triton.language as tl

        # read when the module is imported, as libraries read their switches
        BLOCKS = [int(b) for b in os.environ.get("KTL_BLOCKS", "128").split(",")]
        FACTOR = tl.constexpr(int(os.environ.get("KTL_FACTOR", "2")))


        @triton.autotune(configs=[triton.Config({"BLOCK": b}, num_warps=4) for b in BLOCKS], key=["n"])
        @triton.jit
        def env_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
            i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            m = i < n
            tl.store(y_ptr + i, tl.load(x_ptr + i, mask=m) * FACTOR, mask=m)
        ''',
    "ops/wrapped.py": '''
        import triton
        import triton.language as tl
        from triton.runtime.autotuner import Autotuner


        class CachingAutotuner(Autotuner):   # a library's own autotuner (fla's cache_autotune is one)
            pass


        def caching_autotune(configs, key):
            return lambda fn: CachingAutotuner(fn, fn.arg_names, configs, key, None, None)


        def has_bias(args):   # as libraries test an optional input
            import torch
            return isinstance(args["bias_ptr"], torch.Tensor)


        @caching_autotune(configs=[triton.Config({"BLOCK": b}, num_warps=4) for b in (128, 256)], key=["n"])
        @triton.heuristics({"HAS_BIAS": has_bias,
                            "WIDE": lambda args: args["x_ptr"].dtype.itemsize * args["BLOCK"] >= 1024})
        @triton.jit
        def wrapped_kernel(x_ptr, y_ptr, bias_ptr, n, BLOCK: tl.constexpr, HAS_BIAS: tl.constexpr,
                           WIDE: tl.constexpr):
            i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            m = i < n
            y = tl.load(x_ptr + i, mask=m)
            if HAS_BIAS:
                y += tl.load(bias_ptr + i, mask=m)
            tl.store(y_ptr + i, y, mask=m)
        ''',
    "ops/needs.py": '''
        import triton
        import triton.language as tl

        import kforge_no_such_dependency  # noqa: F401  (a dependency the library forgot to declare)


        @triton.autotune(configs=[triton.Config({"BLOCK": 128})], key=["n"])
        @triton.jit
        def needs_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
            pass
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


def test_a_package_linked_onto_the_path_is_found_and_named_where_it_lies(tmp_path, monkeypatch):
    """A link farm (nix, Bazel runfiles, some conda set-ups): site/<package> is a link to the real folder. Its
    files are named under the path entry, as the import finds them, never refused as lying outside it."""
    real = install(tmp_path / "real")
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / PACKAGE).symlink_to(real / PACKAGE)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    module = installed.find(f"{PACKAGE}.ops.scale")
    assert module.path == tmp_path / "site" / PACKAGE / "ops" / "scale.py"
    assert [n for n, _ in sources.digest_files(module.closure(), module.base)] == [
        f"{PACKAGE}/__init__.py", f"{PACKAGE}/ops/__init__.py", f"{PACKAGE}/ops/consts.py", f"{PACKAGE}/ops/scale.py"]


@pytest.fixture
def redirect(tmp_path, monkeypatch):
    """The test library mapped by an import finder appended to sys.meta_path (an editable install's), on no path
    entry; finder answers cached by rules/load/observe.py are dropped before and after."""
    from kforge.load import observe
    from importlib.util import spec_from_file_location
    package = install(tmp_path / "src") / PACKAGE

    class Redirect:
        @staticmethod
        def find_spec(name, path=None, target=None):
            return spec_from_file_location(name, package / "__init__.py", submodule_search_locations=[
                str(package)]) if name == PACKAGE else None
    observe.finder_folder.cache_clear()
    monkeypatch.setattr(sys, "meta_path", [*sys.meta_path, Redirect])
    yield package
    observe.finder_folder.cache_clear()


def test_a_package_an_import_finder_maps_is_found_after_the_path_without_importing_it(redirect, tmp_path, monkeypatch):
    module = installed.find(f"{PACKAGE}.ops.scale")
    assert module.path == redirect / "ops" / "scale.py" and module.base == redirect.parent
    assert PACKAGE not in sys.modules
    shadow = install(tmp_path / "shadow")   # a copy on the path comes first, as the path finder runs first
    monkeypatch.syspath_prepend(str(shadow))
    from kforge.load import observe
    observe.finder_folder.cache_clear()
    found = installed.find(f"{PACKAGE}.ops.scale")
    assert found.base == shadow


@pytest.mark.parametrize("name", ["no_such_package.ops", "kforge_testlib.ops.absent", "../etc/passwd", "a..b"])
def test_a_module_that_is_not_installed_is_refused_saying_so(site, name):
    with pytest.raises(installed.NotInstalled):
        installed.find(name)


def test_a_spec_naming_a_missing_module_or_both_source_and_module_is_one_clear_line(site, tmp_path):
    root = make_project(tmp_path / "p", specs={"bad": spec("bad", f"{PACKAGE}.ops.nothing", "scale_kernel")})
    proc = doit(root, "list", check=False, env={"PYTHONPATH": str(site)})
    assert "kforge: family bad did not load: specs/bad.toml: [kernel] module: no kforge_testlib.ops.nothing" in proc.stderr
    both = spec("both", f"{PACKAGE}.ops.shift", "shift_kernel").replace('module =', 'source = "tk/scale.py"\nmodule =')
    (root / "specs" / "bad.toml").write_text(both)
    proc = doit(root, "list", check=False, env={"PYTHONPATH": str(site)})
    assert "give exactly one of `source`" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


SCALE_SPEC = f'''
[kernel]
name = "lib_scale"
module = "{PACKAGE}.ops.scale"
entry = "scale_kernel"
toolchain = "triton"
archs = ["sm_90a", "gfx942"]
id = "b{{BLOCK}}-w{{num_warps}}-n{{n}}"

[signature]
x_ptr = "*fp32"
y_ptr = "*fp32"
n = "i32"
BLOCK = "constexpr"
EVEN = "constexpr"

[sweep]
n = [1000, 1024]   # a shape hint: the heuristic reads it
'''

AMD_SPEC = f'''
[kernel]
name = "lib_amd"
module = "{PACKAGE}.ops.amd"
entry = "amd_kernel"
toolchain = "triton"
archs = ["gfx942"]
id = "b{{BLOCK}}-e{{waves_per_eu}}"

[signature]
x_ptr = "*fp32"
y_ptr = "*fp32"
n = "i32"
BLOCK = "constexpr"

[sweep]
'''


def scale_targets(arch):
    return {f"lib_scale:b{b}-w{w}-n{n}@{arch}" for b, w in ((128, 4), (256, 8)) for n in (1000, 1024)}


def test_autotune_configs_are_swept_and_heuristics_computed_per_config(site, tmp_path):
    from kforge.plan.catalog import Catalog
    root = make_project(tmp_path / "p", specs={"lib_scale": SCALE_SPEC, "lib_amd": AMD_SPEC}, kernels={})
    targets = {t.name: t for t in Catalog(root, None, 50_000).load().targets}
    assert set(targets) == scale_targets("sm_90a") | scale_targets("gfx942") | {
        f"lib_amd:b{b}-e{e}@gfx942" for b in (128, 256) for e in (0, 2)}
    even = {name: dict(t.constexprs)["EVEN"] for name, t in targets.items() if "@sm_90a" in name}
    assert even == {"lib_scale:b128-w4-n1000@sm_90a": False, "lib_scale:b128-w4-n1024@sm_90a": True,
                    "lib_scale:b256-w8-n1000@sm_90a": False, "lib_scale:b256-w8-n1024@sm_90a": True}
    amd = targets["lib_amd:b256-e2@gfx942"]
    assert dict(amd.options) == {"num_warps": 4, "num_stages": 2, "waves_per_eu": 2}
    assert PACKAGE not in sys.modules   # asked of a child process, never imported here


def test_a_heuristic_reading_a_value_the_spec_does_not_give_is_refused_at_load(site, tmp_path):
    from kforge.plan.catalog import Catalog
    root = make_project(tmp_path / "p", specs={"lib_scale": SCALE_SPEC.replace("n = [1000, 1024]", "")
                                               .replace("-n{n}", "")}, kernels={})
    with pytest.raises(SpecError, match=r"specs/lib_scale.toml: heuristic EVEN of kforge_testlib.ops.scale."
                                        r"scale_kernel reads 'n', which the spec does not give"):
        Catalog(root, None, 50_000).load()


WRAPPED_SPEC = textwrap.dedent('''
    [kernel]
    name = "lib_wrapped"
    module = "kforge_testlib.ops.wrapped"
    entry = "wrapped_kernel"
    toolchain = "triton"
    archs = ["sm_90a"]
    id = "{dtype}-b{BLOCK}"

    [signature]
    x_ptr = "*{dtype}"
    y_ptr = "*{dtype}"
    bias_ptr = "*{dtype}"
    n = "i32"
    BLOCK = "constexpr"
    HAS_BIAS = "constexpr"
    WIDE = "constexpr"

    [sweep]
    dtype = ["fp16", "fp32"]
    ''')


def test_a_librarys_own_autotuner_is_read_and_heuristics_see_pointers_as_tensors_of_their_type(site, tmp_path):
    """A subclass of Triton's Autotuner under another decorator name; heuristics that test a pointer with
    isinstance(..., torch.Tensor) and read its .dtype, as they would at launch; a `none` pointer is None."""
    from kforge.plan.catalog import Catalog
    no_bias = WRAPPED_SPEC.replace('"lib_wrapped"', '"lib_wrapped_nb"').replace('bias_ptr = "*{dtype}"',
                                                                               'bias_ptr = "none"')
    root = make_project(tmp_path / "p", specs={"lib_wrapped": WRAPPED_SPEC, "lib_wrapped_nb": no_bias}, kernels={})
    targets = {t.name: dict(t.constexprs) for t in Catalog(root, None, 50_000).load().targets}
    values = {name: (c["HAS_BIAS"], c["WIDE"]) for name, c in targets.items()}
    assert values == {
        "lib_wrapped:fp16-b128@sm_90a": (True, False), "lib_wrapped:fp16-b256@sm_90a": (True, False),
        "lib_wrapped:fp32-b128@sm_90a": (True, False), "lib_wrapped:fp32-b256@sm_90a": (True, True),
        "lib_wrapped_nb:fp16-b128@sm_90a": (False, False), "lib_wrapped_nb:fp16-b256@sm_90a": (False, False),
        "lib_wrapped_nb:fp32-b128@sm_90a": (False, False), "lib_wrapped_nb:fp32-b256@sm_90a": (False, True)}
    doit(root, "-n", "1", "lib_wrapped", env={"PYTHONPATH": str(site)})   # the compile unwraps the autotuner


@pytest.mark.parametrize("given, message", [
    ("bias_ptr = [1]", r"\[sweep\]"), ("n = [\"big\"]", r"\[sweep\] n: a shape hint for a i32 argument must be an integer"),
    ("n = [1.5]", r"a shape hint for a i32 argument must be an integer, got 1.5")])
def test_a_value_for_a_pointer_or_a_mistyped_shape_hint_is_refused_at_load(site, tmp_path, given, message):
    from kforge.plan.catalog import Catalog
    root = make_project(tmp_path / "p", specs={"lib_wrapped": WRAPPED_SPEC + given + "\n"}, kernels={})
    with pytest.raises(SpecError, match=r"specs/lib_wrapped.toml: .*" + message):
        Catalog(root, None, 50_000).load()
    if given.startswith("bias_ptr"):
        with pytest.raises(SpecError, match=r"bias_ptr is a \*\{dtype\} argument: the entry's heuristics see it as "
                                            r"a stand-in answering its element type alone, so it takes no value"):
            Catalog(root, None, 50_000).load()


def test_a_module_whose_import_fails_in_the_probe_is_one_line_naming_it_and_the_fix(site, tmp_path):
    from kforge.plan.catalog import Catalog
    root = make_project(tmp_path / "p", specs={"lib_needs": spec("lib_needs", "kforge_testlib.ops.needs",
                                                                 "needs_kernel").replace("[sweep]\nBLOCK = [128, 256]\n",
                                                                                          "[sweep]\n")}, kernels={})
    with pytest.raises(SpecError) as e:
        Catalog(root, None, 50_000).load()
    assert str(e.value) == (
        "specs/lib_needs.toml: reading kforge_testlib.ops.needs.needs_kernel's autotune / heuristics (the module "
        "is imported in a child process): ModuleNotFoundError: No module named 'kforge_no_such_dependency' "
        "(in kforge_testlib/ops/needs.py:5); install it in the environment that runs doit, or where it cannot be (a "
        "GPU extension this build lacks), stand in for it in a set-up hook (setup = \"module:function\", "
        "docs/device_model.md)")


def test_an_amd_autotune_option_on_an_nvidia_arch_is_refused_at_load(site, tmp_path):
    """The library's configs set waves_per_eu on every vendor: Triton's launch refuses the keyword on NVIDIA (its
    options have none), so no config runs on sm_90a."""
    from kforge.plan.catalog import Catalog
    root = make_project(tmp_path / "p", specs={"lib_amd": AMD_SPEC.replace('["gfx942"]', '["gfx942", "sm_90a"]')},
                        kernels={})
    with pytest.raises(SpecError) as e:
        Catalog(root, None, 50_000).load()
    assert str(e.value) == (f"specs/lib_amd.toml: {PACKAGE}.ops.amd.amd_kernel's @triton.autotune configs listed on "
                            f"sm_90a set waves_per_eu, an option of another vendor that Triton's launch refuses there "
                            f"(the kernel's every call on sm_90a fails): drop sm_90a from archs, or give that vendor a "
                            f"spec of its own")


@pytest.mark.slow
def test_an_installed_librarys_kernels_build_and_an_edit_rebuilds_the_targets_whose_compile_read_it(site, tmp_path):
    """Autotuned and heuristics-wrapped entries included: configs from the autotuner, values from the heuristics.
    The top-level __init__ imports every op, so every compile reads (runs) each op's file: an edit of one
    rebuilds them all (it could change what the others compile to), as their recorded inputs say."""
    specs = {"lib_scale": SCALE_SPEC, "lib_shift": spec("lib_shift", f"{PACKAGE}.ops.shift", "shift_kernel"),
             "lib_amd": AMD_SPEC}
    root = make_project(tmp_path / "p", specs=specs, kernels={})
    env = {"PYTHONPATH": str(site)}
    doit(root, "-n", "1", env=env)
    assert len(statuses(root, "built")) == 8 + 4 + 4
    doit(root, env=env)
    assert statuses(root, "built") == set()
    every = {t for t in statuses(root, "up-to-date")}
    read = [dict(json.loads(m.read_text())["inputs"]) for m in (root / "out").glob("*/*/*/meta.json")]
    assert len(read) == 16 and all(f"{PACKAGE}/ops/shift.py" in r and f"{PACKAGE}/ops/consts.py" in r for r in read)
    shift = site / PACKAGE / "ops" / "shift.py"
    shift.write_text(shift.read_text().replace("+ 1", "+ 2"))
    doit(root, "-n", "1", env=env)
    assert statuses(root, "built") == every
    consts = site / PACKAGE / "ops" / "consts.py"   # imported by scale.py only, relatively (and run by every import)
    consts.write_text(consts.read_text().replace("(3)", "(5)"))
    doit(root, "-n", "1", env=env)
    assert statuses(root, "built") == every
    meta = json.loads((root / "out" / "sm_90a" / "lib_scale" / "b256-w8-n1024" / "meta.json").read_text())
    assert meta["constexprs"] == {"BLOCK": 256, "EVEN": True} and meta["num_warps"] == 8


BIAS_SPEC = f'''
[kernel]
name = "lib_bias"
module = "{PACKAGE}.ops.bias"
entry = "bias_kernel"
toolchain = "triton"
archs = ["sm_90a", "gfx942"]

[signature]
x_ptr = "*fp32"
y_ptr = "*fp32"
bias_ptr = "none"
n = "i32"
BLOCK = "constexpr"
SCALE = "constexpr"
MODE = "constexpr"

[sweep]
BLOCK = [256]
'''


def test_a_none_argument_and_constexpr_defaults_from_the_source_build(site, tmp_path):
    """bias_ptr is passed as None (compiled as a constexpr None, not an argument of the launch); SCALE and MODE
    take the defaults the source gives them; BLOCK's swept value wins over its default."""
    root = make_project(tmp_path / "p", specs={"lib_bias": BIAS_SPEC}, kernels={})
    doit(root, "-n", "1", env={"PYTHONPATH": str(site)})
    assert len(statuses(root, "built")) == 2
    meta = json.loads(next((root / "out" / "sm_90a" / "lib_bias").glob("*/meta.json")).read_text())
    assert meta["constexprs"] == {"bias_ptr": None, "BLOCK": 256, "SCALE": 2.0, "MODE": "add"}
    assert [a["name"] for a in meta["signature"]] == ["x_ptr", "y_ptr", "n"]


def test_an_extra_pairing_the_specs_own_values_is_built_with_every_autotune_config(site, tmp_path):
    """lmdeploy's fused_moe pairs shapes ([[extra]] giving the spec's own swept values, as libraries.md shows) and
    is autotuned: each such extra was refused for not giving the autotuner's parameters too."""
    from kforge.plan.catalog import load_specs
    from kforge.plan.targets import build_targets
    extras = '\n[[extra]]\nn = 4096\n\n[[extra]]\nn = 8192\n'
    root = make_project(tmp_path / "p", specs={"lib_scale": SCALE_SPEC + extras}, kernels={})
    made = {(dict(t.constexprs)["n"] if "n" in dict(t.constexprs) else dict(t.config)["n"], dict(t.config)["BLOCK"])
            for t in build_targets(load_specs(root), root, ("sm_90a",))}
    assert made == {(n, b) for n in (1000, 1024, 4096, 8192) for b in (128, 256)}, made
    partial = SCALE_SPEC + '\n[[extra]]\nn = 4096\nBLOCK = 128\n'
    root = make_project(tmp_path / "q", specs={"lib_scale": partial}, kernels={})
    with pytest.raises(SpecError, match=r"\[\[extra\]\] #1 must give exactly the swept parameters .*, or those of "
                                        r"\[sweep\] alone \(\['n'\]\): such a pairing is built with every"):
        load_specs(root)
    twice = SCALE_SPEC + '\n[[extra]]\nn = 4096\n\n[[extra]]\nn = 4096\n'
    root = make_project(tmp_path / "r", specs={"lib_scale": twice}, kernels={})
    with pytest.raises(SpecError, match=r"\[\[extra\]\] #2 \{'n': 4096\}: the same as \[\[extra\]\] #1; remove one"):
        load_specs(root)


def test_a_none_argument_given_a_value_is_refused(site, tmp_path):
    from kforge.plan.catalog import load_specs
    root = make_project(tmp_path / "p", specs={"lib_bias": BIAS_SPEC + "\n[constants]\nbias_ptr = 1\n"}, kernels={})
    with pytest.raises(SpecError, match=r"bias_ptr is None \(its \[signature\] type is 'none'\); remove it from "
                                        r"\[constants\]"):
        load_specs(root)


DESC_SPEC = f'''
[kernel]
name = "lib_desc"
module = "{PACKAGE}.ops.desc"
entry = "desc_copy_kernel"
toolchain = "triton"
archs = ["sm_90a"]
id = "{{dtype}}-b{{BLOCK}}"

[signature]
in_desc = "tensordesc<{{dtype}}[{{BLOCK}}, 64]>"
out_desc = "tensordesc<{{dtype}}[{{BLOCK}}, 64]>"
BLOCK = "constexpr"

[sweep]
dtype = ["bfloat16"]
BLOCK = [64, 128]
'''


def test_tensor_descriptor_arguments_build_with_their_block_shape_and_the_compile_s_tma_metadata(site, tmp_path):
    """meta.json and the bundle carry how the compile lowered each descriptor (rules/runtime/tensordesc.py):
    a TMA box per descriptor on sm_90a, the loader's layout a 128-byte map then shape and strides."""
    from kforge_runtime import Bundle
    from kforge_runtime.launch import Arguments
    root = make_project(tmp_path / "p", specs={"lib_desc": DESC_SPEC}, kernels={})
    doit(root, "-n", "1", env={"PYTHONPATH": str(site)})
    assert statuses(root, "built") == {"lib_desc:bf16-b64@sm_90a", "lib_desc:bf16-b128@sm_90a"}
    meta = json.loads((root / "out" / "sm_90a" / "lib_desc" / "bf16-b128" / "meta.json").read_text())
    assert [a["type"] for a in meta["signature"]] == ["tensordesc<bf16[128, 64]>"] * 2
    assert [(m["block_size"], m["elem_size"], m["fp4_padded"]) for m in meta["tensordesc_meta"]] == [
        ([128, 64], 2, False)] * 2
    entry = Bundle(next((root / "out" / "dist").glob("*.whl"))).find("lib_desc", "bf16-b64")
    assert entry["tensordesc_meta"][0]["block_size"] == [64, 64]
    assert Arguments(entry).layout == ["map", "i32", "i32", "i64", "i64"] * 2


@pytest.mark.parametrize("bad", ["tensordesc<bf16[64, 64],NVMMASharedLayout()>", "tensordesc<bf16[]>",
                                 "tensordesc<f17[64]>", "tensordesc<bf16[0, 64]>"])
def test_a_bad_tensor_descriptor_type_is_refused_at_load(site, tmp_path, bad):
    from kforge.plan.catalog import load_specs
    root = make_project(tmp_path / "p", specs={"lib_desc": DESC_SPEC.replace(
        'in_desc = "tensordesc<{dtype}[{BLOCK}, 64]>"', f'in_desc = "{bad}"')}, kernels={})
    with pytest.raises(SpecError, match=r"\[signature\] in_desc"):
        from kforge.plan.targets import build_targets
        build_targets(load_specs(root), root, None)


ACT_SPEC = f'''
[kernel]
name = "lib_act"
module = "{PACKAGE}.ops.acts"
entry = "apply_kernel"
toolchain = "triton"
archs = ["sm_90a", "gfx942"]
id = "{{ACT}}"

[signature]
x_ptr = "*fp32"
y_ptr = "*fp32"
n = "i32"
ACT = "function"
BLOCK = "constexpr"

[constants]
BLOCK = 256

[sweep]
ACT = ["{PACKAGE}.ops.acts:double", "{PACKAGE}.ops.acts:square", "tk.mine:cube"]
'''

CUBE = """import triton


@triton.jit
def cube(x):
    return x * x * x
"""


def test_function_valued_constexprs_build_from_the_library_and_the_project_and_key_their_sources(site, tmp_path):
    from kforge.plan.catalog import Catalog
    spec = ACT_SPEC.replace('id = "{ACT}"', "")
    root = make_project(tmp_path / "p", specs={"lib_act": spec}, kernels={"mine": CUBE})
    doit(root, "-n", "1", env={"PYTHONPATH": str(site)})
    built = statuses(root, "built")
    assert len(built) == 6, built
    meta = json.loads(next((root / "out" / "sm_90a" / "lib_act").glob("*/meta.json")).read_text())
    assert meta["constexprs"]["ACT"].endswith((":double", ":square", ":cube"))
    before = {t.name: t.key for t in Catalog(root, None, 50_000).load().targets}
    mine = root / "tk" / "mine.py"
    mine.write_text(mine.read_text().replace("x * x * x", "x * x * x * 1"))
    after = {t.name: t.key for t in Catalog(root, None, 50_000).load().targets}
    changed = {n for n in before if before[n] != after[n]}
    assert changed and all("cube" in n for n in changed) and len(changed) == 2


@pytest.mark.parametrize("ref, message", [
    ("nomodule", r"a 'function' argument names a @triton.jit function as 'module:function'"),
    ("tk.absent:f", r"function tk.absent:f: no tk.absent on this Python's module path"),
    ("tk.mine:nothing", r"function tk.mine:nothing: tk.mine .* defines no function nothing"),
])
def test_a_bad_function_reference_is_refused_at_load(site, tmp_path, ref, message):
    from kforge.plan.catalog import load_specs
    from kforge.plan.targets import build_targets
    spec = ACT_SPEC.replace('id = "{ACT}"', "").replace(
        f'["{PACKAGE}.ops.acts:double", "{PACKAGE}.ops.acts:square", "tk.mine:cube"]', f'["{ref}"]')
    root = make_project(tmp_path / "p", specs={"lib_act": spec}, kernels={"mine": CUBE})
    with pytest.raises(SpecError, match=message):
        build_targets(load_specs(root), root, None)


ENV_SPEC = f'''
[kernel]
name = "lib_env"
module = "{PACKAGE}.ops.envk"
entry = "env_kernel"
toolchain = "triton"
archs = ["sm_90a"]
id = "b{{BLOCK}}"

[signature]
x_ptr = "*fp32"
y_ptr = "*fp32"
n = "i32"
BLOCK = "constexpr"

[sweep]

[env]
KTL_BLOCKS = "64,256"
KTL_FACTOR = "3"
'''


def test_a_family_environment_is_set_where_its_module_is_read_and_compiled_and_is_in_its_key(site, tmp_path):
    from kforge.plan.catalog import Catalog
    root = make_project(tmp_path / "p", specs={"lib_env": ENV_SPEC}, kernels={})
    targets = {t.name: t for t in Catalog(root, None, 50_000).load().targets}
    assert set(targets) == {"lib_env:b64@sm_90a", "lib_env:b256@sm_90a"}   # the autotune list the env gave
    assert "KTL_BLOCKS" not in os.environ
    doit(root, "-n", "1", env={"PYTHONPATH": str(site)})
    meta = json.loads((root / "out" / "sm_90a" / "lib_env" / "b64" / "meta.json").read_text())
    assert meta["env"] == {"KTL_BLOCKS": "64,256", "KTL_FACTOR": "3"}
    (root / "specs" / "lib_env.toml").write_text(ENV_SPEC.replace('KTL_FACTOR = "3"', 'KTL_FACTOR = "5"'))
    doit(root, "-n", "1", env={"PYTHONPATH": str(site)})
    assert statuses(root, "built") == set(targets)   # another environment, another key


@pytest.mark.parametrize("name", ["PATH", "LD_PRELOAD", "PYTHONPATH", "KFORGE_CACHE", "lower", "TRITON_CACHE_DIR"])
def test_a_reserved_or_malformed_environment_name_is_refused(site, tmp_path, name):
    from kforge.plan.catalog import load_specs
    root = make_project(tmp_path / "p", specs={"lib_env": ENV_SPEC.replace("KTL_FACTOR", name)}, kernels={})
    with pytest.raises(SpecError, match=r"\[env\] .*not a variable a family may set"):
        load_specs(root)


EDITABLE = {   # a library installed with `pip install -e` (a flat layout: its finder maps the package to its folder)
    "__init__.py": "",
    "helpers.py": "import triton\n\n\n@triton.jit\ndef scale(x):\n    return x * 2\n",
    "ops.py": FILES["ops/shift.py"],
}
USES_HELPER = '''
import triton
import triton.language as tl
from edlib.helpers import scale


@triton.jit
def scale_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    tl.store(y_ptr + i, scale(tl.load(x_ptr + i, mask=m)).to(y_ptr.dtype.element_ty), mask=m)
'''


def test_a_library_installed_editable_builds_and_an_edit_rebuilds_exactly_the_targets_that_read_it(tmp_path):
    """The library's package is found through its import finder, not on the path: a project kernel that inlines
    its helper and a `module = "edlib.ops"` family both build; an edit of either file rebuilds its reader only."""
    site = redirected_package(tmp_path / "src" / "edlib", EDITABLE)
    ops = spec("ed_shift", "edlib.ops", "shift_kernel").replace('["sm_90a", "gfx942"]', '["sm_90a"]').replace(
        "[128, 256]", "[128]")
    root = make_project(tmp_path / "p", specs={"scale": spec_text(), "ed_shift": ops}, kernels={"scale": USES_HELPER})
    env = {"PYTHONPATH": str(site)}
    doit(root, "-n", "1", env=env)
    own, library = "scale:fp16-b256-w4@sm_90a", "ed_shift:b128@sm_90a"
    assert statuses(root, "built") == {own, library}
    for edited, reader in (("helpers.py", own), ("ops.py", library)):
        path = tmp_path / "src" / "edlib" / edited
        path.write_text(path.read_text().replace("2", "4").replace("+ 1", "+ 3"))
        doit(root, "-n", "1", env=env)
        assert statuses(root, "built") == {reader}, edited


def test_a_load_walks_a_modules_closure_once_for_all_its_families_and_the_next_load_sees_an_edit(site, tmp_path,
                                                                                                   monkeypatch):
    """Three families of one installed module: one catalog load parses and follows each file of its closure once
    (not once per family); an import added to it in place (mtime put back) and the module it names created since
    are in the next load's closure, and so in its keys."""
    from kforge.plan.catalog import Catalog
    specs = {f"shift{i}": spec(f"shift{i}", f"{PACKAGE}.ops.shift", "shift_kernel") for i in range(3)}
    root = make_project(tmp_path / "p", specs=specs, kernels={})
    walked, looked_up = [], []
    real, real_find = installed._imports, installed._find
    monkeypatch.setattr(installed, "_imports", lambda path, base: walked.append(path) or real(path, base))
    monkeypatch.setattr(installed, "_find", lambda name: looked_up.append(name) or real_find(name))
    first = Catalog(root, None, 50_000).load()
    shift = site / PACKAGE / "ops" / "shift.py"
    assert walked == [shift]   # its imports followed once (the __init__ files' are not followed)
    assert looked_up.count(f"{PACKAGE}.ops.shift") == 1   # found on the path once
    st = shift.stat()
    shift.write_text(shift.read_text().replace("import triton\n", "import triton\nfrom . import extra  # noqa\n", 1))
    os.utime(shift, ns=(st.st_atime_ns, st.st_mtime_ns))
    (site / PACKAGE / "ops" / "extra.py").write_text("X = 1\n")
    again = Catalog(root, None, 50_000).load()
    assert {t.name for t in again.targets} == {t.name for t in first.targets}
    assert all(t.key != f.key for t, f in zip(sorted(again.targets), sorted(first.targets)))
    assert {n for t in again.targets for n, _ in t.source_digests} >= {f"{PACKAGE}/ops/extra.py"}


@pytest.mark.parametrize("name", ["a" * 5000, ".".join(["b" * 250] * 20)])
def test_a_module_name_no_file_system_can_hold_is_not_installed(site, name):
    """A part longer than a file's name may be, or a path longer than the system's: `OSError: [Errno 36] File
    name too long` came out of the lookup, a traceback; the message shows the name cut short."""
    with pytest.raises(installed.NotInstalled) as e:
        installed.find(name)
    assert len(str(e.value)) < 400 and "characters)" in str(e.value)


def test_a_spec_naming_a_module_of_thousands_of_characters_is_one_line(site, tmp_path):
    from kforge.plan.catalog import load_specs
    root = make_project(tmp_path / "p", specs={"bad": spec("bad", "a" * 5000, "scale_kernel")}, kernels={})
    with pytest.raises(SpecError) as e:
        load_specs(root)
    assert str(e.value).startswith("specs/bad.toml: [kernel] module: 'aaa")
    assert "is not a module name: a part of it is longer than a file's name may be (255 characters)" in str(e.value)


def test_a_dist_info_kforge_cannot_read_or_decode_is_passed_by_and_the_packages_own_is_found(tmp_path):
    """installed.py 170-171 (a dist-info with neither top_level.txt nor RECORD: passed by), and another package's
    top_level.txt or RECORD that is not UTF-8: it raised UnicodeDecodeError, and every family of a module in that
    site-packages was BROKEN with 'reading the sources of kernel ... failed: UnicodeDecodeError: ...', naming no
    file. Read as METADATA is now (errors="replace")."""
    for name, files in {"aaa-1.dist-info": {}, "bbb-1.dist-info": {"top_level.txt": b"caf\xe9\n"},
                        "ccc-1.dist-info": {"RECORD": b"\xff/x.py,,\n"},
                        "mypkg-2.0.dist-info": {"top_level.txt": b"mypkg\n",
                                                "METADATA": b"Name: mypkg\nVersion: 2.0\n"}}.items():
        (tmp_path / name).mkdir()
        for file, data in files.items():
            (tmp_path / name / file).write_bytes(data)
    assert installed._distribution(str(tmp_path), "mypkg") == ("mypkg", "2.0")
    assert installed._distribution(str(tmp_path), "other") == ("", "")


def test_a_package_an_editable_finder_maps_to_a_folder_of_another_name_is_one_line_with_the_fix(tmp_path,
                                                                                                monkeypatch):
    """installed.py 123 (setuptools' editable finder mapping `edpkg` to src/edpkg_impl/): reachable from any
    `pip install -e` of such a layout, never run in the whole suite's coverage. A finder in this process."""
    import importlib.util
    folder = tmp_path / "src" / "edpkg_impl"
    folder.mkdir(parents=True)
    (folder / "__init__.py").write_text("")
    (folder / "ops.py").write_text("")

    class Editable:
        @classmethod
        def find_spec(cls, name, path=None, target=None):
            if name == "edpkg":
                return importlib.util.spec_from_file_location(name, folder / "__init__.py",
                                                              submodule_search_locations=[str(folder)])
            return None
    monkeypatch.setattr(sys, "meta_path", [*sys.meta_path, Editable])
    with pytest.raises(installed.NotInstalled) as e:
        installed._find("edpkg.ops")
    assert str(e.value) == (f"edpkg.ops: its package edpkg is mapped by an import finder to {folder}, where kforge "
                            f"does not find the module (a folder of another name than the package's is not followed); "
                            f"install the package without -e, or fix the name")


GENERATING = {
    # unsloth_zoo's import writes ./unsloth_compiled_cache/*.py into its working folder, then imports them: each
    # import writes them anew (here with the time in them)
    "genlib/__init__.py": '''
        import os
        import sys
        import time

        os.makedirs("genlib_cache", exist_ok=True)
        with open(os.path.join("genlib_cache", "made.py"), "w") as f:
            f.write(f"MADE = {time.time_ns()}\\n")
        sys.path.insert(0, os.path.abspath("genlib_cache"))
        import made  # noqa: E402,F401
        ''',
    "genlib/ops.py": '''
        import triton
        import triton.language as tl


        @triton.autotune(configs=[triton.Config({"BLOCK": 128}, num_warps=4)], key=["n"])
        @triton.jit
        def copy_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
            i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            tl.store(y_ptr + i, tl.load(x_ptr + i, mask=i < n), mask=i < n)
        ''',
}

GENERATING_SPEC = '''
[kernel]
name = "gen_copy"
module = "genlib.ops"
entry = "copy_kernel"
toolchain = "triton"
archs = ["sm_90a"]

[signature]
x_ptr = "*fp32"
y_ptr = "*fp32"
n = "i32"
BLOCK = "constexpr"

[sweep]
'''


def test_a_library_writing_modules_into_its_working_folder_at_import_writes_inside_out_and_a_rebuild_is_a_no_op(
        tmp_path):
    """The probe and the compile servers import a family's module in out/.kforge/work/: a library writing into its
    working folder (unsloth_zoo's compiled cache) wrote into the project, and what it wrote anew at every import was
    an input of the catalog and of every target: no build was ever a no-op."""
    site = write_site_package(tmp_path / "site", "genlib", GENERATING)
    root = make_project(tmp_path / "p", specs={"gen_copy": GENERATING_SPEC}, kernels={})
    env = {"PYTHONPATH": str(site)}
    doit(root, "-n", "1", env=env)
    assert len(statuses(root, "built")) == 1
    assert not (root / "genlib_cache").exists() and (root / "out" / ".kforge" / "work" / "genlib_cache").is_dir()
    proc = doit(root, env=env)
    assert statuses(root, "built") == set() and "loading" not in proc.stderr, proc.stderr
    inputs = [n for m in (root / "out").glob("*/*/*/meta.json") for n, _ in json.loads(m.read_text())["inputs"]]
    assert "genlib/__init__.py" in inputs and not any("made" in n for n in inputs), inputs


def test_a_project_kernel_reading_a_file_relative_to_the_project_at_import_still_builds(tmp_path):
    """Only an installed library's import runs in out/.kforge/work/: the project's own modules may open a file by a
    path relative to the project, as they do when doit runs them (a critical read of the work folder)."""
    reading = "import json\nFACTOR = json.load(open('tk/factor.json'))\n" + kernel_text()
    root = make_project(tmp_path / "p", specs={"scale": spec_text()}, kernels={"scale": reading})
    (root / "tk" / "factor.json").write_text("2")
    doit(root, "-n", "1")
    assert statuses(root, "built") == {"scale:fp16-b256-w4@sm_90a"}


def test_a_link_planted_at_the_work_folder_is_one_warning_and_nothing_is_written_through_it(tmp_path):
    site = write_site_package(tmp_path / "site", "genlib", GENERATING)
    root = make_project(tmp_path / "p", specs={"gen_copy": GENERATING_SPEC}, kernels={})
    (tmp_path / "elsewhere").mkdir()
    (root / "out" / ".kforge").mkdir(parents=True)
    (root / "out" / ".kforge" / "work").symlink_to(tmp_path / "elsewhere")
    proc = doit(root, "-n", "1", env={"PYTHONPATH": str(site)})
    assert "kforge: warning: " in proc.stderr and "leads outside out/" in proc.stderr, proc.stderr
    assert list((tmp_path / "elsewhere").iterdir()) == [] and len(statuses(root, "built")) == 1
    (root / "out" / ".kforge" / "work").unlink()   # a file there: the same one warning, not silence
    (root / "out" / ".kforge" / "work").write_text("")
    proc = doit(root, "-n", "1", env={"PYTHONPATH": str(site)})
    assert "kforge: warning: " in proc.stderr and "out/.kforge/work: " in proc.stderr, proc.stderr


def test_a_library_whose_import_removes_its_working_folder_does_not_break_the_next_familys_probe(tmp_path):
    """The probe works in out/.kforge/work/ again for each module: a library that removed it (rmtree of its
    working folder's contents, then the folder) made the next family's import crash the probe."""
    files = {**GENERATING, "genlib/__init__.py": "import os, shutil\nshutil.rmtree(os.getcwd())\n",
             "genlib/ops2.py": GENERATING["genlib/ops.py"]}
    site = write_site_package(tmp_path / "site", "genlib", files)
    second = GENERATING_SPEC.replace('name = "gen_copy"', 'name = "gen_copy2"').replace("genlib.ops", "genlib.ops2")
    root = make_project(tmp_path / "p", specs={"gen_copy": GENERATING_SPEC, "gen_copy2": second}, kernels={})
    proc = doit(root, "list", env={"PYTHONPATH": str(site)})
    assert "did not load" not in proc.stderr and "crashed" not in proc.stderr, proc.stderr
