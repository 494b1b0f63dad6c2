"""FlyDSL targets: real compile-only builds per kernel and arch, silent-miscompile detection, the linker,
and a key that sees the dtype (FlyDSL 0.4.2's own cache key does not)."""
import json
import os
import shutil
import textwrap
from pathlib import Path

import pytest

from kforge.compile import amdgpu_metadata
from kforge.plan import amd_linker
from kforge.store import artifact
from tests.support import REPO, build_report, built_once, doit, kernel_text, make_project, spec_text, statuses

FLY_ARCHS = ("gfx90a", "gfx942", "gfx950")

# A factory whose element type reaches the kernel only through a torch.dtype in a closure: the case
# FlyDSL's own cache key got wrong (the bf16 build received the f16 binary).
COPY_KERNEL = '''
import flydsl.compiler as flyc
import flydsl.expr as fx
import torch
{extra_import}

TORCH = {{"fp16": torch.float16, "bf16": torch.bfloat16}}


def build_copy(dtype, VEC):
    torch_dtype = TORCH[dtype]
    elem = fx.Float16 if torch_dtype == torch.float16 else fx.BFloat16

    @flyc.kernel
    def copy_kernel(X: fx.Tensor, Y: fx.Tensor):
        i = fx.block_idx.x * 64 + fx.thread_idx.x
        atom = fx.make_copy_atom(fx.rocdl.BufferCopy{bits}b(), 16)
        src = fx.logical_divide(fx.rocdl.make_buffer_tensor(X), fx.make_layout(VEC, 1))
        dst = fx.logical_divide(fx.rocdl.make_buffer_tensor(Y), fx.make_layout(VEC, 1))
        regs = fx.make_rmem_tensor(VEC, elem)
        fx.copy(atom, fx.slice(src, (None, i)), regs)
        v = fx.memref_load_vec(regs).to(fx.Float32)
        out = fx.make_rmem_tensor(VEC, elem)
        fx.memref_store_vec(({body}).to(elem), out)
        fx.copy(atom, out, fx.slice(dst, (None, i)))

    @flyc.jit
    def copy(X: fx.Tensor, Y: fx.Tensor, stream: fx.Stream = fx.Stream(None)):
        copy_kernel(X, Y).launch(grid=(1024 // (64 * VEC), 1, 1), block=(64, 1, 1), stream=stream)

    return copy, (torch.empty(1024, dtype=torch_dtype), torch.empty(1024, dtype=torch_dtype))
'''

SPEC = '''
[kernel]
name = "{name}"
source = "tk/{module}.py"
entry = "build_copy"
toolchain = "flydsl"
archs = {archs}
id = "{{dtype}}-v{{VEC}}"

[signature]
X = "*{{dtype}}"
Y = "*{{dtype}}"
VEC = "constexpr"

[sweep]
dtype = ["fp16", "bf16"]
VEC = [8]
'''


def fly_kernel(body="v * 2.0", extra_import=""):
    return COPY_KERNEL.format(body=body, bits=128, extra_import=extra_import)


def fly_spec(name="copy", module="copy", archs=("gfx942",)):
    return textwrap.dedent(SPEC.format(name=name, module=module, archs=json.dumps(list(archs))))


COPY_TARGETS = {"copy:fp16-v8@gfx942", "copy:bf16-v8@gfx942"}
LIBCOPY_TARGETS = {"libcopy:fp16-v8@gfx942", "libcopy:bf16-v8@gfx942"}


@pytest.fixture(scope="module")
def fly_built(tmp_path_factory) -> Path:
    """One project built once for the run, which the tests below only read: the catalog's own FlyDSL families
    (one config each per arch; picks.json: which), copy (a dtype only in a closure) and libcopy (a library
    builder called through its spec's [adapter]), linked by Triton's LLD. One build: each imports torch and
    FlyDSL again."""
    return built_once(tmp_path_factory, "flydsl-backend", _build_fly)


def _build_fly(root: Path) -> None:
    spec = ADAPTED_SPEC.replace("[sweep]", "[constants]\nELEMS = 1024\n\n[sweep]").replace(
        'VEC = "constexpr"', 'VEC = "constexpr"\nELEMS = "constexpr"')   # a size may be a parameter of the config
    builder = LIBRARY_BUILDER.replace("def build_copy_module(dtype_str, VEC)",
                                      "def build_copy_module(dtype_str, VEC, ELEMS)")
    make_project(root, specs={"copy": fly_spec(), "libcopy": spec},
                 kernels={"copy": fly_kernel(), "libcopy": builder})
    shutil.copytree(REPO / "kernels", root / "kernels", ignore=shutil.ignore_patterns("__pycache__"))
    names = []
    for spec in sorted((REPO / "specs").glob("fly_*.toml")):
        (root / "specs" / spec.name).write_text(spec.read_text())
        names.append(spec.stem)
    listed = doit(root, "list", "--all", "--quiet").stdout.split()
    picks = [next(t for t in listed if t.startswith(f"{n}:") and t.endswith(f"@{a}"))
             for n in names for a in FLY_ARCHS if any(t.startswith(f"{n}:") and t.endswith(f"@{a}") for t in listed)]
    (root / "picks.json").write_text(json.dumps({"names": names, "picks": picks}))
    # one worker: one compile server compiles copy's two dtypes, one after the other; KFORGE_LD_LLD=triton asks for
    # Triton's LLD even where a system lld exists (test_tritons_own_lld_links_flydsl_targets_where_no_other_linker_is)
    doit(root, "-n", "1", *picks, "copy", "libcopy", env={"KFORGE_LD_LLD": "triton"})


def _every_target(root: Path) -> set[str]:
    """What fly_built's build was asked for: each of it must have built."""
    return set(json.loads((root / "picks.json").read_text())["picks"]) | COPY_TARGETS | LIBCOPY_TARGETS


def test_every_flydsl_kernel_compiles_for_every_arch(fly_built):
    """The catalog's own FlyDSL families, one config each per arch, with ELF and metadata checks."""
    root = fly_built
    chosen = json.loads((root / "picks.json").read_text())
    names, picks = chosen["names"], chosen["picks"]
    assert {"fly_gemm", "fly_fp8_gemm", "fly_rmsnorm", "fly_softmax"} <= set(names)
    assert len(picks) >= 11   # 4 families x 3 archs, minus fp8 on gfx90a
    assert statuses(root, "built") == _every_target(root) == set(picks) | COPY_TARGETS | LIBCOPY_TARGETS
    for name in picks:
        kernel, rest = name.split(":")
        cid, arch = rest.split("@")
        meta, binary = artifact.load(root / "out" / arch / kernel / cid)   # sha256 + ELF machine/flags
        assert meta["toolchain"] == "flydsl" and meta["binary"].endswith(".hsaco")
        abi = meta["kernel_abi"]
        assert abi["wavefront_size"] == 64 and abi["args"] and abi["kernarg_segment_size"] > 0
        assert abi == amdgpu_metadata.kernel_abi(binary, meta["symbol"])
    assert not list(root.rglob("*.pkl"))   # FlyDSL's pickle cache stays off: nothing to ship or load


def test_dtype_only_in_a_closure_still_gives_two_binaries(fly_built):
    root = fly_built
    assert statuses(root, "built") == _every_target(root)
    fp16 = json.loads((root / "out/gfx942/copy/fp16-v8/meta.json").read_text())
    bf16 = json.loads((root / "out/gfx942/copy/bf16-v8/meta.json").read_text())
    assert fp16["key"] != bf16["key"] and fp16["sha256"] != bf16["sha256"]


def test_a_silent_miscompile_fails_its_target(tmp_path):
    """fmath.tanh prints 'error: no libcall available', exits 0 and yields a kernel of only s_endpgm."""
    kernel = fly_kernel(body="fmath.tanh(v)", extra_import="from flydsl.expr import math as fmath")
    root = make_project(tmp_path / "p", specs={"copy": fly_spec()}, kernels={"copy": kernel})
    proc = doit(root, "-n", "1", check=False)
    assert proc.returncode != 0
    assert statuses(root, "failed") == {"copy:fp16-v8@gfx942", "copy:bf16-v8@gfx942"}
    assert "no libcall" in proc.stdout
    assert not (root / "out/gfx942/copy/fp16-v8/meta.json").exists()


def test_a_missing_linker_fails_flydsl_targets_with_the_fix_and_triton_still_builds(tmp_path):
    root = make_project(tmp_path / "p", specs={"copy": fly_spec(), "scale": spec_text(archs=("gfx942",))},
                        kernels={"copy": fly_kernel(), "scale": kernel_text()})
    env_before = os.environ.get("KFORGE_LD_LLD")
    os.environ["KFORGE_LD_LLD"] = str(tmp_path / "no-such-ld.lld")
    try:
        proc = doit(root, "-n", "2", check=False)
    finally:
        if env_before is None:
            del os.environ["KFORGE_LD_LLD"]
        else:
            os.environ["KFORGE_LD_LLD"] = env_before
    report = build_report(root)
    assert report["scale:fp16-b256-w4@gfx942"] == "built"
    assert report["copy:fp16-v8@gfx942"] == report["copy:bf16-v8@gfx942"] == "failed"
    assert "needs ld.lld" in proc.stdout and "apt-get install lld-19" in proc.stdout


def test_linker_search_message_names_what_it_tried(monkeypatch, tmp_path):
    old = tmp_path / "ld.lld"
    old.write_text("#!/bin/sh\necho 'Debian LLD 14.0.6 (compatible with GNU linkers)'\n")
    old.chmod(0o755)
    monkeypatch.setattr(amd_linker, "candidates", lambda chosen: [tmp_path / "missing", old])
    monkeypatch.setenv("KFORGE_LD_LLD", str(old))   # chosen explicitly: no fallback to Triton's LLD
    with pytest.raises(amd_linker.LinkerMissing, match=r"LLD 14\.0\.6.*apt-get install lld-19"):
        amd_linker.find(tmp_path)


def test_a_system_lld_is_offered_to_flydsl_as_a_rocm_tree(tmp_path):
    linker = amd_linker.find(tmp_path)
    root = amd_linker.rocm_root_for(linker, tmp_path / "shim")
    assert (root / "llvm" / "bin" / "ld.lld").resolve() == linker.resolve()


def test_a_bad_arch_fails_only_its_target(tmp_path):
    """A bad arch reaching FlyDSL's backend fails that target with the compiler's message (the notes saw it
    abort the process via LLVM ERROR; either way the server isolates it); the other dtype still builds."""
    kernel = fly_kernel().replace("    torch_dtype = TORCH[dtype]\n", "    torch_dtype = TORCH[dtype]\n"
                                  "    if dtype == 'bf16':\n        import os; os.environ['ARCH'] = "
                                  "os.environ['FLYDSL_GPU_ARCH'] = 'gfx9999'\n")
    root = make_project(tmp_path / "p", specs={"copy": fly_spec()}, kernels={"copy": kernel})
    proc = doit(root, "-n", "1", check=False)
    assert proc.returncode != 0
    assert build_report(root) == {"copy:fp16-v8@gfx942": "built", "copy:bf16-v8@gfx942": "failed"}
    assert "copy:bf16-v8@gfx942 failed with: " in proc.stdout   # the cause; the compiler's words below it:
    failed = [t for t in json.loads((root / "out" / "build-report.json").read_text())["tasks"] if "error" in t]
    assert "gfx9999" in failed[0]["error"] and "gfx9999" in (root / "out/gfx942/copy/bf16-v8/error.txt").read_text()


def test_tritons_own_lld_links_flydsl_targets_where_no_other_linker_is(fly_built):
    """A machine with only `pip install` (no ROCm, no system lld) still builds FlyDSL targets: the LLD linked into
    Triton's libtriton does the link (KFORGE_LD_LLD=triton asks for it even where a system lld exists)."""
    root = fly_built
    assert statuses(root, "built") == _every_target(root)
    meta, _ = artifact.load(root / "out/gfx942/copy/fp16-v8")   # sha256, ELF machine and flags, kernel code
    assert meta["toolchain_versions"]["ld.lld"].startswith("LLD in triton==")
    assert "/" not in meta["toolchain_versions"]["ld.lld"]   # keyed without a path: another checkout hits


def test_tritons_lld_runner_refuses_a_link_it_cannot_do_exactly():
    from kforge.plan import triton_lld
    assert triton_lld.link_args(["-shared", "in.o", "-o", "out.hsaco"]) == ("in.o", "out.hsaco")
    assert triton_lld.link_args(["-o", "out.hsaco", "in.o", "-shared"]) == ("in.o", "out.hsaco")
    for bad in (["-shared", "a.o", "b.o", "-o", "x"], ["-shared", "a.o"], ["--gc-sections", "a.o", "-o", "x"],
                ["-shared", "a.o", "-o"]):
        with pytest.raises(ValueError, match="-shared INPUT -o OUTPUT"):
            triton_lld.link_args(bad)


LIBRARY_BUILDER = '''
import flydsl.compiler as flyc
import flydsl.expr as fx

ELEMENTS = {"f16": fx.Float16, "bf16": fx.BFloat16}   # the library's own dtype names


def build_copy_module(dtype_str, VEC):
    """As FlyDSL's library builders are written: returns the launcher alone, which takes a stream."""
    elem = ELEMENTS[dtype_str]

    @flyc.kernel
    def copy_kernel(X: fx.Tensor, Y: fx.Tensor):
        i = fx.block_idx.x * 64 + fx.thread_idx.x
        atom = fx.make_copy_atom(fx.rocdl.BufferCopy128b(), 16)
        src = fx.logical_divide(fx.rocdl.make_buffer_tensor(X), fx.make_layout(VEC, 1))
        dst = fx.logical_divide(fx.rocdl.make_buffer_tensor(Y), fx.make_layout(VEC, 1))
        regs = fx.make_rmem_tensor(VEC, elem)
        fx.copy(atom, fx.slice(src, (None, i)), regs)
        out = fx.make_rmem_tensor(VEC, elem)
        fx.memref_store_vec((fx.memref_load_vec(regs).to(fx.Float32) * 3.0).to(elem), out)
        fx.copy(atom, out, fx.slice(dst, (None, i)))

    @flyc.jit
    def copy(X: fx.Tensor, Y: fx.Tensor, stream: fx.Stream = fx.Stream(None)):
        copy_kernel(X, Y).launch(grid=(1024 // (64 * VEC), 1, 1), block=(64, 1, 1), stream=stream)

    return copy
'''

ADAPTED_SPEC = '''
[kernel]
name = "libcopy"
source = "tk/libcopy.py"
entry = "build_copy_module"
toolchain = "flydsl"
archs = ["gfx942"]
id = "{dtype}-v{VEC}"

[signature]
X = "*{dtype}"
Y = "*{dtype}"
VEC = "constexpr"

[sweep]
dtype = ["fp16", "bf16"]
VEC = [8]

[adapter]
arguments = {dtype = "dtype_str"}
dtype_names = {fp16 = "f16", bf16 = "bf16"}
shapes = {X = [1024], Y = ["ELEMS"]}
'''


def test_a_library_builder_compiles_through_the_specs_adapter(fly_built):
    """The builder returns only the launcher and names its dtypes its own way: [adapter] says how to call it
    and which placeholders to trace the launcher with (a size may be a parameter of the config)."""
    root = fly_built
    assert statuses(root, "built") == _every_target(root)
    fp16 = json.loads((root / "out/gfx942/libcopy/fp16-v8/meta.json").read_text())
    bf16 = json.loads((root / "out/gfx942/libcopy/bf16-v8/meta.json").read_text())
    assert fp16["sha256"] != bf16["sha256"]
    assert fp16["constexprs"] == {"VEC": 8, "ELEMS": 1024, "dtype_str": "f16"}


@pytest.mark.parametrize("change, message", [
    ('shapes = {X = [1024], Y = ["ELEMS"]}', r"\[adapter\] shapes: .*for each tensor argument \(X, Y\)"),
    ('arguments = {dtype = "dtype_str"}\n', r"build_copy_module\(...\) must take the compile-time values"),
])
def test_a_bad_adapter_is_refused_at_load(tmp_path, change, message):
    from kforge.base.errors import SpecError
    from kforge.plan.catalog import load_specs
    replacement = "shapes = {X = [1024]}" if change.startswith("shapes") else ""
    spec = ADAPTED_SPEC.replace('Y = ["ELEMS"]', "Y = [1024]") if not change.startswith("shapes") else ADAPTED_SPEC
    root = make_project(tmp_path / "p", specs={"libcopy": spec.replace(change, replacement)},
                        kernels={"libcopy": LIBRARY_BUILDER})
    with pytest.raises(SpecError, match=message):
        load_specs(root)
