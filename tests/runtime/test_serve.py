"""rules/runtime/serve.py on the CPU: a recorded specialization and the bundle entry built from it match; a
miss says what to record; a served kernel gets the runtime arguments in order. (Serving on a GPU:
bench/zero_jit.py.)"""
import json
import os
import re
from types import SimpleNamespace

from kforge_runtime import record, schema, serve
from tests.runtime.test_record import ARGS, ATTRS, CONSTANTS, OPTIONS, SIGNATURE
from tests.support import write_manifest

LINE = record.record_line("tk.scale", "scale_kernel", ARGS, SIGNATURE, CONSTANTS, ATTRS, OPTIONS, "sm_90a")
ENTRY = {"arch": "sm_90a", "source": {"module": "tk.scale", "entry": "scale_kernel"},
         "signature": [{"name": "x_ptr", "type": "*bf16"}, {"name": "y_ptr", "type": "*bf16"},
                       {"name": "n", "type": "i32"}],
         "constexprs": {"scale": 1, "bias": None, "X_dtype": "bf16", "ACT": "tests.runtime.test_record:relu",
                        "BLOCK": 256},
         "divisible_by_16": ["y_ptr", "x_ptr"], "options": {"num_warps": 8}}


def test_a_record_and_the_bundle_entry_built_from_it_have_one_identity():
    assert serve.record_identity(LINE) == serve.entry_identity(ENTRY)   # num_stages 3 is Triton's default here


def test_any_difference_is_another_identity():
    for change in ({"options": {"num_warps": 4}}, {"divisible_by_16": ["x_ptr"]}, {"arch": "gfx942"},
                   {"constexprs": {**ENTRY["constexprs"], "BLOCK": 128}}):
        assert serve.entry_identity({**ENTRY, **change}) != serve.record_identity(LINE)


def test_an_entry_of_a_kernel_a_spec_names_where_it_is_re_exported_matches_the_calls_of_its_def():
    # the spec names tk.public:kernel (a re-export, a factory's module-level name); Triton's JIT names the call's
    # function by its def: the compile records that name, and serving matches by it
    public = {**ENTRY, "source": {"module": "tk.public", "entry": "kernel"}}
    assert serve.entry_identity(public) != serve.record_identity(LINE)
    assert serve.entry_identity({**public, "triton_function": "tk.scale:scale_kernel"}) == serve.record_identity(LINE)


def test_an_unreadable_entry_has_no_identity():
    assert serve.entry_identity({"arch": "sm_90a"}) is None


def test_a_strict_miss_names_the_kernel_the_specialization_and_how_to_record_it():
    message = serve.miss_message(LINE)
    assert message.startswith("kforge serve (strict): no prebuilt tk.scale:scale_kernel for sm_90a with ")
    assert json.dumps(LINE["constexprs"]) in message and "python -m kforge_runtime.record" in message


def test_a_served_kernel_is_loaded_at_its_first_launch_and_gets_the_runtime_arguments_in_order():
    loads = []
    served = serve.Served(lambda: loads.append(1) or Launched(), [(0, True), (1, True), (2, False)],
                          SimpleNamespace(vendor="nvidia"), {})
    Launched.calls = []
    x, y = tensors()
    for _ in range(2):
        served.run(4, 1, 1, 77, None, None, None, None, None, x, y, 1000, 1, None, "bf16", "relu", 256)
    assert Launched.calls == [((4, 1, 1), 77, [x.data_ptr(), y.data_ptr(), 1000])] * 2 and loads == [1]
    assert served.launch_metadata((4,), 77) is None


# --- the JIT path on the CPU: Triton's driver answered by a stub (sm_90a), launches captured --------------

import pytest
import torch
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget


@triton.jit
def copy(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + i, tl.load(x_ptr + i, mask=i < n), mask=i < n)


CONFIGS = [triton.Config({"BLOCK": 128}, num_warps=4), triton.Config({"BLOCK": 256}, num_warps=8)]


@triton.autotune(configs=CONFIGS, key=["n"])
@triton.jit
def copy_tuned(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + i, tl.load(x_ptr + i, mask=i < n), mask=i < n)


class StubDriver:
    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 77

    def get_current_target(self):
        return GPUTarget("cuda", 90, 32)


class Launched:
    """Stands for a loaded kernel: records each launch."""
    calls: list = []

    def launch_trusted(self, gx, gy, gz, stream, values):
        Launched.calls.append(((gx, gy, gz), stream, list(values)))

    def reaches(self, address):   # the harness launches nothing: a CPU tensor stands for GPU memory
        return True


def entry(kernel: str, block: int, warps: int, divisible=("x_ptr", "y_ptr")) -> dict:
    fn = globals()[kernel]
    fn = fn if isinstance(fn, triton.runtime.JITFunction) else fn.fn   # an autotuner's JIT function
    return {"target": f"{kernel}-{block}", "arch": "sm_90a", "toolchain": "triton",
            "source": {"module": __name__, "entry": kernel},
            "triton_source_key": fn.cache_key,
            "signature": [{"name": "x_ptr", "type": "*fp16"}, {"name": "y_ptr", "type": "*fp16"},
                          {"name": "n", "type": "i32"}],
            "constexprs": {"BLOCK": block}, "divisible_by_16": list(divisible),
            "options": {"num_warps": warps, "num_stages": 3}, "threads_per_block": 32 * warps, "shared": 0}


def bundle_dir(path, entries, autotune=()):
    path.mkdir()
    write_manifest(path, json.dumps({
        "format": "kforge-bundle", "format_version": 1, "arch": "sm_90a", "vendor": "nvidia",
        "artifacts": entries, "failed": [], "autotune": list(autotune)}))
    return path


@pytest.fixture
def jit(monkeypatch):
    """Triton's JIT with a stub driver, kernels' compiles refused, launches captured; serve() undone after."""
    from triton.runtime import driver
    from triton.runtime.autotuner import Autotuner
    from triton.runtime.jit import JITFunction
    monkeypatch.setattr(driver, "_active", StubDriver())
    monkeypatch.setattr(JITFunction, "_do_compile", JITFunction._do_compile)   # restored after the test
    monkeypatch.setattr(Autotuner, "run", Autotuner.run)
    monkeypatch.setattr(Autotuner, "_bench", lambda *a, **k: pytest.fail("the autotuner benchmarked"))
    from kforge_runtime.bundle import Bundle
    # the binary is proven before a call is served, and the loader gets those very bytes (never a second read)
    monkeypatch.setattr(Bundle, "binary", lambda self, entry: b"the binary")
    monkeypatch.setattr(Bundle, "kernel", lambda self, entry, device=None, binary=None:
                        Launched() if binary == self.binary(entry) else pytest.fail(f"loaded unproven bytes {binary!r}"))
    for fn in (copy, copy_tuned.fn):
        fn.device_caches.clear()
        fn.device_caches[0]   # made now: its compile is then replaced
        monkeypatch.setattr(fn, "compile", lambda *a, **k: pytest.fail("compiled"), raising=False)
    Launched.calls = []
    yield
    while serve._active:
        serve.stop()


def tensors(n=1000):
    return torch.zeros(n, dtype=torch.float16), torch.zeros(n, dtype=torch.float16)


def test_a_held_specialization_is_launched_from_the_bundle_with_no_compile(jit, tmp_path):
    server = serve.serve(str(bundle_dir(tmp_path / "b", [entry("copy", 128, 4)])))
    x, y = tensors()
    for _ in range(2):   # the second call takes Triton's own cache hit to the served kernel
        copy[(8,)](x, y, 1000, BLOCK=128)
    assert Launched.calls == [((8, 1, 1), 77, [x.data_ptr(), y.data_ptr(), 1000])] * 2
    assert (server.served, server.compiled, server.misses) == (1, 0, [])


def test_the_kernel_a_served_call_returns_launches_as_a_compiled_kernel_does(jit, tmp_path):
    # flag_gems's libentry keeps what the JIT call returned and launches it with kernel[grid](*every argument)
    serve.serve(str(bundle_dir(tmp_path / "b", [{**entry("copy", 128, 4), "symbol": "copy", "shared": 0}])))
    x, y = tensors()
    kernel = copy.run(x, y, 1000, BLOCK=128, grid=(8,), warmup=False)
    kernel[(3,)](x, y, 1000, 128)
    kernel[(2, 1, 1)](x, y, 999, 128, stream=5)
    assert Launched.calls == [((8, 1, 1), 77, [x.data_ptr(), y.data_ptr(), 1000]),
                              ((3, 1, 1), 77, [x.data_ptr(), y.data_ptr(), 1000]),
                              ((2, 1, 1), 5, [x.data_ptr(), y.data_ptr(), 999])]
    assert kernel.name == "copy" and (kernel.metadata.num_warps, kernel.metadata.shared) == (4, 0)
    with pytest.raises(AttributeError, match="kforge serve: a served kernel has no 'asm'"):
        kernel.asm


def test_a_served_kernel_tells_its_registers_as_a_compiled_kernel_does(jit, tmp_path, monkeypatch):
    """Triton's fused-softmax tutorial sizes its grid by the n_regs of a warmed-up kernel: a served one raised
    AttributeError there (an outside review). They are what Triton's own driver reads of the bundle's binary."""
    from types import SimpleNamespace

    from triton.runtime import driver

    from kforge_runtime.bundle import Bundle
    given = []
    monkeypatch.setattr(driver._active, "utils", SimpleNamespace(
        load_binary=lambda *a: given.append(a) or ("module", "function", 40, 0, 1024)), raising=False)
    monkeypatch.setattr(Bundle, "binary", lambda self, entry: b"the binary")
    serve.serve(str(bundle_dir(tmp_path / "b", [{**entry("copy", 128, 4), "symbol": "copy", "shared": 512}])))
    x, y = tensors()
    kernel = copy.warmup(x, y, 1000, BLOCK=128, grid=(1,))
    assert (kernel.n_regs, kernel.n_spills, kernel.n_max_threads) == (40, 0, 1024)
    assert given == [("copy", b"the binary", 512, 0)]   # read once


def test_a_call_on_a_device_of_another_arch_is_served_that_arch_s_binary_or_none(jit, tmp_path, monkeypatch):
    """A process driving GPUs of two arches: Triton compiles each call for its device's target. Serving looked every
    call up under the arch of the device current at its first call (an sm_90a binary served to an sm_80 GPU)."""
    from triton.runtime import driver

    class TwoArches(StubDriver):
        device = 0

        def get_current_device(self):
            return self.device

        def get_current_target(self):
            return GPUTarget("cuda", 90 if self.device == 0 else 80, 32)
    monkeypatch.setattr(driver, "_active", TwoArches())
    copy.device_caches.clear()
    serve.serve(str(bundle_dir(tmp_path / "b", [entry("copy", 128, 4)])), strict=True)
    x, y = tensors()
    copy[(8,)](x, y, 1000, BLOCK=128)
    TwoArches.device = 1
    with pytest.raises(serve.NotServed, match=rf"no prebuilt {__name__}:copy for sm_80"):
        copy[(8,)](x, y, 1000, BLOCK=128)
    assert len(Launched.calls) == 1


def test_a_tensor_the_gpu_cannot_reach_is_refused_as_tritons_launcher_refuses_it(jit, tmp_path, monkeypatch):
    """Triton's launcher asks the driver of every pointer and refuses a CPU tensor ("cannot be accessed from Triton
    (cpu tensor?)"); a served launch passed its host address to the kernel. Pinned host memory the GPU reaches runs."""
    class Unreachable(Launched):
        def reaches(self, address):   # the driver's answer for pageable host memory
            asked.append(address)
            return False
    from kforge_runtime.bundle import Bundle
    asked = []
    monkeypatch.setattr(Bundle, "kernel", lambda self, entry, device=None, binary=None: Unreachable())
    serve.serve(str(bundle_dir(tmp_path / "b", [entry("copy", 128, 4)])))
    x, y = tensors()
    refused = r"^Pointer argument \(at 0\) cannot be accessed from Triton \(cpu tensor\?\)$"   # Triton's words
    with pytest.raises(ValueError, match=refused):
        copy[(8,)](x, y, 1000, BLOCK=128)
    assert asked == [x.data_ptr()] and Launched.calls == []
    monkeypatch.setattr(Unreachable, "reaches", lambda self, address: True)   # pinned: the driver maps it
    copy[(8,)](x, y, 1000, BLOCK=128)
    assert len(Launched.calls) == 1
    import triton
    import triton.language as tl
    monkeypatch.setattr(Unreachable, "reaches", lambda self, address: False)
    with pytest.raises(ValueError, match=refused):   # a wrapper has no is_cuda: asked too, not taken for the GPU's
        copy[(8,)](triton.reinterpret(x, tl.float16), y, 1000, BLOCK=128)
    assert len(Launched.calls) == 1


def test_an_entry_the_loader_cannot_launch_is_left_to_triton(jit, tmp_path):
    """Memory for Triton's profiler's instrumentation, or global scratch memory on AMD (Triton 3.6's AMD launcher
    passes none; the bundle's vendor decides, not a field of the entry), kforge's loader does not allocate: such an
    entry was served, and every launch raised LaunchError where Triton runs it (an outside review). Global scratch
    on NVIDIA is allocated (test_bundle.py)."""
    from kforge_runtime.launch import LaunchError, launch_plan
    scratch = {**entry("copy", 128, 4), "global_scratch_size": 256}
    launch_plan(scratch, "nvidia")
    with pytest.raises(LaunchError, match="needs global scratch memory, which this loader allocates on NVIDIA"):
        launch_plan({**scratch, "vendor": "nvidia"}, "amd")
    said = "the kernel was compiled with Triton's profiler's instrumentation"
    refused = {**entry("copy", 128, 4), "profile_scratch_size": 256}
    server = serve.serve(str(bundle_dir(tmp_path / "b", [refused])))
    x, y = tensors()
    with pytest.raises(pytest.fail.Exception, match="compiled"):   # Triton compiles it
        copy[(8,)](x, y, 1000, BLOCK=128)
    assert server.served == 0 and said in server.misses[0]["unlaunchable"]
    serve.stop()
    serve.serve(str(bundle_dir(tmp_path / "strict", [refused])), strict=True)
    with pytest.raises(serve.NotServed, match=re.escape(f"copy-128: {said}")):
        copy[(8,)](x, y, 1000, BLOCK=128)


@pytest.mark.parametrize("field,value", [("global_scratch_size", -1), ("global_scratch_align", 3 << 40),
                                         ("profile_scratch_size", "256"), ("threads_per_block", None)])
def test_an_entry_whose_launch_fields_are_out_of_range_is_a_miss_before_it_counts_as_served(jit, tmp_path, field,
                                                                                            value):
    """A bundle is untrusted: an entry whose launch fields the loader refuses (LaunchError at the first launch) was
    counted served first, and not strict the call raised where Triton compiles it (an outside review)."""
    bad = {**entry("copy", 128, 4), field: value}
    server = serve.serve(str(bundle_dir(tmp_path / "b", [bad])))
    x, y = tensors()
    with pytest.raises(pytest.fail.Exception, match="compiled"):   # not strict: Triton compiles it
        copy[(8,)](x, y, 1000, BLOCK=128)
    assert server.served == 0 and Launched.calls == [] and field in server.misses[0]["unlaunchable"]
    serve.stop()
    serve.serve(str(bundle_dir(tmp_path / "strict", [bad])), strict=True)
    with pytest.raises(serve.NotServed, match=f"(copy-128).*'{field}' must be"):
        copy[(8,)](x, y, 1000, BLOCK=128)


def test_tritons_launch_hooks_see_a_served_launch_as_a_compiled_one(jit, tmp_path, monkeypatch):
    """knobs.runtime.launch_enter_hook / launch_exit_hook (proton, tracers) are called around every launch Triton
    makes, with its metadata; a served launch called neither (an outside review)."""
    from triton import knobs
    seen = []
    # each chain holding one hook, as proton's .add() leaves it (restored after)
    monkeypatch.setattr(knobs.runtime.launch_enter_hook, "calls", [lambda md: seen.append(("enter", md.get()["name"]))])
    monkeypatch.setattr(knobs.runtime.launch_exit_hook, "calls", [lambda md: seen.append(("exit", md.get()["stream"]))])
    serve.serve(str(bundle_dir(tmp_path / "b", [{**entry("copy", 128, 4), "symbol": "copy"}])))
    x, y = tensors()
    copy[(8,)](x, y, 1000, BLOCK=128)
    assert seen == [("enter", "copy"), ("exit", 77)] and len(Launched.calls) == 1


def test_an_empty_grid_launches_nothing_as_in_tritons_launcher(jit, tmp_path):
    server = serve.serve(str(bundle_dir(tmp_path / "b", [entry("copy", 128, 4)])))
    x, y = tensors()
    copy[(0,)](x, y, 1000, BLOCK=128)
    copy.run(x, y, 1000, BLOCK=128, grid=(4, 0), warmup=False)[(0, 1, 1)](x, y, 1000, 128)
    assert Launched.calls == [] and server.served == 1


@tl.constexpr
def element(dtype):   # a constexpr holding a function: Triton's key prints its address
    return dtype


@triton.jit
def copy_typed(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + i, tl.load(x_ptr + i, mask=i < n).to(element(tl.float16)), mask=i < n)


def test_a_kernel_reading_a_constexpr_function_is_served_from_a_build_made_in_another_process(jit, tmp_path):
    import subprocess
    import sys
    from pathlib import Path
    code = ("import importlib, sys; sys.path.insert(0, sys.argv[1]); m = importlib.import_module(sys.argv[2]); "
            "from kforge_runtime.source_key import source_key; print(source_key(m.copy_typed))")
    built_key = subprocess.run([sys.executable, "-c", code, str(Path(__file__).parents[2]), __name__],
                               capture_output=True, text=True, check=True).stdout.strip()
    copy_typed.device_caches.clear()
    copy_typed.device_caches[0]
    server = serve.serve(str(bundle_dir(tmp_path / "b", [{**entry("copy", 128, 4), "target": "copy_typed-128",
                                                          "source": {"module": __name__, "entry": "copy_typed"},
                                                          "triton_source_key": built_key}])), strict=True)
    x, y = tensors()
    copy_typed[(8,)](x, y, 1000, BLOCK=128)
    assert server.served == 1 and Launched.calls == [((8, 1, 1), 77, [x.data_ptr(), y.data_ptr(), 1000])]


def test_a_miss_compiles_or_in_strict_mode_names_what_to_record(jit, tmp_path):
    held = str(bundle_dir(tmp_path / "b", [entry("copy", 128, 4)]))
    server = serve.serve(held)
    x, y = tensors()
    with pytest.raises(pytest.fail.Exception, match="compiled"):   # not held: Triton compiles it
        copy[(4,)](x, y, 1000, BLOCK=256)
    assert server.compiled == 1 and [m["constexprs"] for m in server.misses] == [{"BLOCK": 256}]
    serve.stop()
    strict = serve.serve(held, strict=True)
    with pytest.raises(serve.NotServed, match=rf"no prebuilt {__name__}:copy for sm_90a with .*"
                                              r'"BLOCK": 512.*python -m kforge_runtime.record'):
        copy[(2,)](x, y, 1000, BLOCK=512)
    x_odd = torch.zeros(1001, dtype=torch.float16)[1:]   # not 16-byte aligned: another specialization
    with pytest.raises(serve.NotServed):
        copy[(8,)](x_odd, y, 1000, BLOCK=128)
    assert strict.served == 0


def test_an_entry_built_from_other_source_of_the_kernel_is_never_launched(jit, tmp_path):
    # the same module, function and specialization, but the bundle was built before the library changed
    stale = {**entry("copy", 128, 4), "triton_source_key": "0" * 64}
    server = serve.serve(str(bundle_dir(tmp_path / "b", [stale])))
    x, y = tensors()
    with pytest.raises(pytest.fail.Exception, match="compiled"):   # Triton compiles it instead
        copy[(8,)](x, y, 1000, BLOCK=128)
    assert server.served == 0 and server.misses[0]["source_key"] == copy.cache_key
    serve.stop()
    serve.serve(str(bundle_dir(tmp_path / "strict", [stale])), strict=True)
    with pytest.raises(serve.NotServed, match=rf"the bundles' {__name__}:copy for sm_90a \(copy-128\) was built "
                                              r"from other source than the one this process runs"):
        copy[(8,)](x, y, 1000, BLOCK=128)
    unkeyed = entry("copy", 128, 4)
    del unkeyed["triton_source_key"]   # a bundle that cannot say what it was built from serves nothing either
    serve.stop()
    serve.serve(str(bundle_dir(tmp_path / "old", [unkeyed])), strict=True)
    with pytest.raises(serve.NotServed, match="other source"):
        copy[(8,)](x, y, 1000, BLOCK=128)


def test_of_entries_for_one_call_the_one_built_from_this_code_is_served(jit, tmp_path):
    """Two kernels one factory makes per dtype share a name and a specialization and differ by their code: a
    bundle holds both, and each call gets the one built from its own (the index kept the first alone, so the
    other always compiled)."""
    other = {**entry("copy", 128, 4), "target": "other-128", "triton_source_key": "0" * 64, "sha256": "a" * 64}
    server = serve.serve(str(bundle_dir(tmp_path / "b", [other, {**entry("copy", 128, 4), "sha256": "b" * 64}])),
                         strict=True)
    x, y = tensors()
    copy[(8,)](x, y, 1000, BLOCK=128)
    assert server.served == 1 and len(Launched.calls) == 1


def test_two_binaries_for_one_call_of_one_code_serve_neither(jit, tmp_path):
    """Entries that ask for the same compile of the same code yet hold other bytes differ by something neither
    identity nor source key holds: kforge cannot tell which Triton would compile here, so it runs neither."""
    held = [{**entry("copy", 128, 4), "target": f"copy-{n}", "sha256": n * 64} for n in "ab"]
    serve.serve(str(bundle_dir(tmp_path / "b", held)), strict=True)
    x, y = tensors()
    with pytest.raises(serve.NotServed, match=r"2 different binaries of .*:copy for sm_90a built from this code "
                                              r"for this call \(copy-a, copy-b\)"):
        copy[(8,)](x, y, 1000, BLOCK=128)
    assert Launched.calls == []
    same = [{**entry("copy", 128, 4), "target": f"copy-{n}", "sha256": "c" * 64} for n in "ab"]   # one binary twice
    serve.stop()
    server = serve.serve(str(bundle_dir(tmp_path / "same", same)), strict=True)
    copy[(8,)](x, y, 1000, BLOCK=128)
    assert server.served == 1


def test_a_refused_binary_leaves_two_binaries_for_one_call_ambiguous_with_or_without_preload(jit, tmp_path,
                                                                                             monkeypatch):
    """A review: with preload, one of two binaries for one call refused (corrupt) was dropped from the index, the
    ambiguity went with it, and the other was served; without preload the call was refused as ambiguous."""
    from kforge_runtime.bundle import Bundle, BundleError

    def binary(self, entry):
        if entry["target"] == "copy-a":
            raise BundleError("copy-a.cubin refused: sha256 does not match")
        return b"the binary"
    monkeypatch.setattr(Bundle, "binary", binary)
    held = str(bundle_dir(tmp_path / "b", [{**entry("copy", 128, 4), "target": f"copy-{n}", "sha256": n * 64}
                                           for n in "ab"]))
    x, y = tensors()
    for preload in (False, True):
        copy.device_caches[0][0].clear()
        server = serve.serve(held, preload=preload)
        with pytest.raises(pytest.fail.Exception, match="compiled"):   # neither served: Triton compiles
            copy[(8,)](x, y, 1000, BLOCK=128)
        assert (server.served, server.compiled, Launched.calls) == (0, 1, []), preload
        serve.stop()


@pytest.mark.parametrize("option", [{"ptx_options": "-O0"}, {"extern_libs": {"libdevice": "/elsewhere.bc"}}])
def test_a_call_setting_an_option_no_build_sets_is_not_served_a_binary_built_without_it(jit, tmp_path, option):
    """ptx_options, extern_libs: a launch can set them and they change the binary, but a record line does not hold
    them and a spec cannot set them (an outside review: a call with ptx_options="-O0" was served the plain build)."""
    server = serve.serve(str(bundle_dir(tmp_path / "b", [entry("copy", 128, 4)])))
    x, y = tensors()
    with pytest.raises(pytest.fail.Exception, match="compiled"):   # Triton compiles it
        copy[(8,)](x, y, 1000, BLOCK=128, **option)
    assert server.served == 0 and list(option)[0] in server.misses[0]["unrecordable"]
    serve.stop()
    serve.serve(str(bundle_dir(tmp_path / "strict", [entry("copy", 128, 4)])), strict=True)
    with pytest.raises(serve.NotServed, match=rf"{__name__}:copy on sm_90a: the launch sets {list(option)[0]}, which kforge does not build with"):
        copy[(8,)](x, y, 1000, BLOCK=128, **option)
    copy[(8,)](x, y, 1000, BLOCK=128)   # the same call without it is served


@triton.jit
def copy_shaped(x_ptr, y_ptr, n, SHAPE: tl.constexpr):
    i = tl.program_id(0) * SHAPE[0] + tl.arange(0, SHAPE[0])
    tl.store(y_ptr + i, tl.load(x_ptr + i, mask=i < n), mask=i < n)


def test_a_call_no_record_line_can_hold_compiles_and_strict_says_why(jit, tmp_path, monkeypatch):
    """A tuple or a function passed as a constexpr: Triton runs it, a record line cannot hold it; serving raised
    the recorder's ValueError out of the launch (an outside review), where it is a miss."""
    copy_shaped.device_caches.clear()
    copy_shaped.device_caches[0]
    server = serve.serve(str(bundle_dir(tmp_path / "b", [entry("copy", 128, 4)])))
    x, y = tensors()
    monkeypatch.setattr(copy_shaped, "compile", lambda *a, **k: pytest.fail("compiled"), raising=False)
    with pytest.raises(pytest.fail.Exception, match="compiled"):
        copy_shaped[(8,)](x, y, 1000, SHAPE=(128,))
    assert server.compiled == 1 and "cannot be recorded" in server.misses[0]["unrecordable"]
    serve.stop()
    serve.serve(str(bundle_dir(tmp_path / "strict", [entry("copy", 128, 4)])), strict=True)
    with pytest.raises(serve.NotServed, match=r"kforge serve \(strict\): .*copy_shaped.*cannot be recorded"):
        copy_shaped[(8,)](x, y, 1000, SHAPE=(128,))


def test_an_entry_built_under_other_compiler_variables_is_never_launched(jit, tmp_path, monkeypatch):
    """A binary built under TRITON_F32_DEFAULT=ieee (or DISABLE_LLVM_OPT, an IR override) is not the one this
    process's JIT would compile, nor is a plain build's the one a process with such a variable would: neither is
    served. Variables that change no binary (the cache folder, FlyDSL's for a Triton kernel) do not count."""
    for name in [n for n in os.environ if n.startswith(schema.CODE_ENV_PREFIXES) or n in schema.CODE_ENV_NAMES]:
        monkeypatch.delenv(name)
    built_so = {**entry("copy", 128, 4), "env": {"TRITON_F32_DEFAULT": "ieee"}}
    server = serve.serve(str(bundle_dir(tmp_path / "b", [built_so])))
    x, y = tensors()
    with pytest.raises(pytest.fail.Exception, match="compiled"):   # Triton compiles it instead
        copy[(8,)](x, y, 1000, BLOCK=128)
    assert server.served == 0 and server.misses[0]["env"] == {}
    serve.stop()
    serve.serve(str(bundle_dir(tmp_path / "strict", [built_so])), strict=True)
    with pytest.raises(serve.NotServed, match=rf"the bundles' {__name__}:copy for sm_90a \(copy-128\) was built "
                                              r"under other compiler variables than this process's \(the build's: "
                                              r"TRITON_F32_DEFAULT=ieee; this process's: none\)"):
        copy[(8,)](x, y, 1000, BLOCK=128)
    serve.stop()
    monkeypatch.setenv("DISABLE_LLVM_OPT", "1")   # a plain build, served to a process with a variable: not either
    serve.serve(str(bundle_dir(tmp_path / "plain", [entry("copy", 128, 4)])), strict=True)
    with pytest.raises(serve.NotServed, match=r"the build's: none; this process's: DISABLE_LLVM_OPT=1"):
        copy[(8,)](x, y, 1000, BLOCK=128)
    serve.stop()
    monkeypatch.delenv("DISABLE_LLVM_OPT")
    for hostile in (5, "TRITON_DEBUG=1", {"TRITON_DEBUG": 1}, [["a"]]):   # a bundle is untrusted: a miss, no crash
        serve.serve(str(bundle_dir(tmp_path / f"h{len(str(hostile))}", [{**entry("copy", 128, 4), "env": hostile}])),
                    strict=True)
        with pytest.raises(serve.NotServed, match=r"the build's: unreadable; this process's: none"):
            copy[(8,)](x, y, 1000, BLOCK=128)
        serve.stop()
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "cache"))   # changes no binary
    server = serve.serve(str(bundle_dir(tmp_path / "flydsl", [{**entry("copy", b, 4), "env": {"FLYDSL_DEBUG": "1"}}
                                                              for b in (128, 256)])), strict=True)
    copy[(8,)](x, y, 1000, BLOCK=128)
    assert server.served == 1
    # a variable set after the first served call (a knob Triton copies into os.environ, pytest's setenv): the next
    # specialization compiles under it, so a plain build is not it (the variables were read once, at the first call)
    monkeypatch.setenv("DISABLE_PTXAS_OPT", "1")
    with pytest.raises(serve.NotServed, match=r"this process's: DISABLE_PTXAS_OPT=1"):
        copy[(8,)](x, y, 1000, BLOCK=256)


def test_bundles_that_cannot_be_read_serve_nothing_and_say_why_in_one_line(jit, tmp_path, monkeypatch, capsys):
    from kforge_runtime import bundle
    held = bundle_dir(tmp_path / "b", [entry("copy", 128, 4)])
    monkeypatch.setattr(bundle, "MAX_JSON_BYTES", 100)   # a manifest over the loader's limit
    server = serve.serve(str(held))
    x, y = tensors()
    with pytest.raises(pytest.fail.Exception, match="compiled"):
        copy[(8,)](x, y, 1000, BLOCK=128)
    warned = capsys.readouterr().err.strip().splitlines()
    assert len(warned) == 1 and warned[0].startswith("kforge serve: cannot serve from the bundles for sm_90a: ")
    assert "over the loader's limit" in warned[0] and server.broken
    serve.stop()
    serve.serve(str(held), strict=True)
    with pytest.raises(serve.NotServed, match="^kforge serve: cannot serve from the bundles for sm_90a: .*limit"):
        copy[(8,)](x, y, 1000, BLOCK=128)


def test_a_binary_the_bundle_cannot_prove_is_one_line_and_the_call_compiles(jit, tmp_path, monkeypatch, capsys):
    """A bundle whose binary was altered (its sha256 not the manifest's) crashed the application at the kernel's
    first launch with a traceback, after the call had counted as served (an outside review): the binary is proven
    before the call is served; not strict, one line and Triton compiles the call; strict, NotServed naming it."""
    from kforge_runtime.bundle import Bundle, BundleError

    def altered(self, entry):
        raise BundleError(f"{self.path}: {entry['target']}.cubin refused: sha256 15f9 does not match the recorded "
                          f"be89; the bundle was altered or corrupted: reinstall or rebuild it")
    monkeypatch.setattr(Bundle, "binary", altered)
    held = str(bundle_dir(tmp_path / "b", [entry("copy", 128, 4)]))
    server = serve.serve(held)
    x, y = tensors()
    with pytest.raises(pytest.fail.Exception, match="compiled"):   # Triton compiles it
        copy[(8,)](x, y, 1000, BLOCK=128)
    warned = capsys.readouterr().err.strip().splitlines()
    assert warned == ["kforge serve: copy-128: " + f"{held}: copy-128.cubin refused: sha256 15f9 does not match the "
                      "recorded be89; the bundle was altered or corrupted: reinstall or rebuild it; Triton compiles "
                      "this kernel instead"]
    assert (server.served, server.compiled, Launched.calls) == (0, 1, [])
    assert [m["refused"] for m in server.misses] == [warned[0][len("kforge serve: copy-128: "):].split("; Triton")[0]]
    with pytest.raises(pytest.fail.Exception, match="compiled"):   # the entry is dropped: said once, a plain miss
        copy[(8,)](x, y, 1000, BLOCK=128)
    assert capsys.readouterr().err == "" and server.compiled == 2
    serve.stop()
    copy.device_caches[0][0].clear()
    strict = serve.serve(held, strict=True)
    with pytest.raises(serve.NotServed, match=r"^kforge serve: copy-128: .*copy-128.cubin refused: .*rebuild it$"):
        copy[(8,)](x, y, 1000, BLOCK=128)
    with pytest.raises(serve.NotServed, match=r"^kforge serve: copy-128: .*refused"):   # preload proves them too
        serve.serve(held, strict=True, preload=True)
    assert strict.served == 0 and Launched.calls == []


def test_verify_compiles_each_served_specialization_once_and_reports_a_difference(jit, tmp_path, monkeypatch,
                                                                                   capsys):
    from types import SimpleNamespace

    from kforge_runtime.bundle import Bundle
    compiled = SimpleNamespace(asm={"cubin": b"jit"}, metadata=SimpleNamespace(
        name="copy", shared=0, num_warps=4, warp_size=32, global_scratch_size=0))
    monkeypatch.setattr(copy, "compile", lambda *a, **k: compiled, raising=False)
    monkeypatch.setattr(Bundle, "binary", lambda self, entry: b"jit")
    held = {**entry("copy", 128, 4), "symbol": "copy", "shared": 0, "threads_per_block": 128}
    server = serve.serve(str(bundle_dir(tmp_path / "b", [held, {**held, "target": "copy-odd",
                                                                  "constexprs": {"BLOCK": 256}, "shared": 512}])),
                         verify=True)
    x, y = tensors()
    for _ in range(2):
        copy[(8,)](x, y, 1000, BLOCK=128)   # the same bytes and launch: checked once, no report
    assert (server.served, server.verified, server.differences) == (1, 1, [])
    copy[(4,)](x, y, 1000, BLOCK=256)   # a launch field differs from the JIT's
    assert server.differences == ["kforge verify: copy-odd differs from Triton's JIT: shared 512 in the bundle, 0 "
                                  "from the JIT"]
    assert capsys.readouterr().err.strip() == server.differences[0]
    assert len(Launched.calls) == 3   # the bundle's binaries ran, each call


ACC = tl.float32   # a plain dtype global: in kforge's source key, not in Triton's


@triton.jit
def copy_acc(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + i, tl.load(x_ptr + i, mask=i < n).to(ACC), mask=i < n)


def test_verify_compiles_a_kernel_triton_keys_by_less_than_kforge_afresh_not_from_tritons_cache(jit, tmp_path,
                                                                                                 monkeypatch):
    """Triton's disk cache holds a binary under Triton's key, which leaves out what a closure or a global gives the
    code (a factory's kernel per dtype): its cached binary may be another kernel's, and verify reported the served,
    right binary as differing. Such a kernel's reference compile skips that cache; an ordinary kernel's does not."""
    from types import SimpleNamespace

    from triton import knobs

    from kforge_runtime.bundle import Bundle
    from kforge_runtime.source_key import source_key
    uncached = []

    def compile(*a, **k):
        uncached.append(knobs.compilation.always_compile)
        return SimpleNamespace(asm={"cubin": b"jit"}, metadata=SimpleNamespace(
            name="copy", shared=0, num_warps=4, warp_size=32, global_scratch_size=0))
    copy_acc.device_caches.clear()
    copy_acc.device_caches[0]
    for fn in (copy, copy_acc):
        monkeypatch.setattr(fn, "compile", compile, raising=False)
    monkeypatch.setattr(Bundle, "binary", lambda self, entry: b"jit")
    held = {**entry("copy", 128, 4), "symbol": "copy", "shared": 0, "threads_per_block": 128}
    acc = {**held, "target": "copy_acc-128", "source": {"module": __name__, "entry": "copy_acc"},
           "triton_source_key": source_key(copy_acc)}
    server = serve.serve(str(bundle_dir(tmp_path / "b", [held, acc])), verify=True)
    x, y = tensors()
    copy[(8,)](x, y, 1000, BLOCK=128)
    copy_acc[(8,)](x, y, 1000, BLOCK=128)
    assert server.served == 2 and uncached == [False, True] and not knobs.compilation.always_compile


SCALE = tl.constexpr(2.0)


@triton.jit
def copy_scaled(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + i, tl.load(x_ptr + i, mask=i < n) * SCALE, mask=i < n)


def test_a_served_kernel_whose_global_changed_since_is_refused_at_launch_as_tritons_jit_refuses_it(jit, tmp_path,
                                                                                                  monkeypatch):
    """Triton's JIT checks at each launch that no global the kernel read has changed since it compiled; the check
    reads what computing Triton's key found, which a served kernel never computed, so its stale binary ran on."""
    copy_scaled.device_caches.clear()
    copy_scaled.device_caches[0]
    monkeypatch.setattr(copy_scaled, "compile", lambda *a, **k: pytest.fail("compiled"), raising=False)
    held = {**entry("copy", 128, 4), "target": "copy_scaled-128",
            "source": {"module": __name__, "entry": "copy_scaled"}, "triton_source_key": copy_scaled.cache_key}
    copy_scaled.hash = None   # as in a fresh process: nothing computed Triton's key yet
    copy_scaled.used_global_vals = {}
    serve.serve(str(bundle_dir(tmp_path / "b", [held])), strict=True)
    x, y = tensors()
    copy_scaled[(8,)](x, y, 1000, BLOCK=128)
    monkeypatch.setitem(globals(), "SCALE", tl.constexpr(3.0))
    with pytest.raises(RuntimeError, match="Global variable SCALE has changed since we compiled this kernel"):
        copy_scaled[(8,)](x, y, 1000, BLOCK=128)
    assert len(Launched.calls) == 1


def test_an_autotuned_kernel_runs_the_recorded_choice_for_its_key_without_benchmarking(jit, tmp_path):
    entries = [entry("copy_tuned", 128, 4), entry("copy_tuned", 256, 8)]
    autotune = [{"kernel": f"{__name__}:copy_tuned", "key": [n, "torch.float16", "torch.float16"],
                 "config": config.all_kwargs()} for n, config in ((1000, CONFIGS[1]), (100, CONFIGS[0]),
                                                                  (10, CONFIGS[1]))]
    server = serve.serve(str(bundle_dir(tmp_path / "b", entries, autotune)), strict=True)
    copy_tuned.cache.clear()
    x, y = tensors()
    grid = lambda meta: (triton.cdiv(1000, meta["BLOCK"]),)
    copy_tuned[grid](x, y, 1000)
    copy_tuned[grid](x, y, 100)   # (64 would be 16-divisible: another specialization)
    assert [c[0] for c in Launched.calls] == [(4, 1, 1), (8, 1, 1)]   # BLOCK 256, then 128
    assert (server.tuned_configs, server.served, server.compiled) == (2, 2, 0)
    with pytest.raises(serve.NotServed, match=rf"autotuned {__name__}:copy_tuned has no recorded "
                                              r'choice for its autotuning key \[7, "torch.float16", "torch.float16"\]'
                                              r" on sm_90a \(the bundles hold 2 of its configs"):
        copy_tuned[grid](x, y, 7)
    with pytest.raises(serve.NotServed, match=r'was recorded with config \{"BLOCK": 256, .*"num_warps": 8\} for '
                                              r'its autotuning key \[10, .* \(the bundles hold 0 of its configs'):
        copy_tuned[grid](x[1:], y, 10)   # the recorded pick, but this call's specialization was not built
    assert "source_key" not in server.misses[-1]   # the CI guard's list: not "held, but built from other source"


def test_an_autotuned_call_picks_among_configs_built_from_its_code(jit, tmp_path):
    """Bundles of two versions of a library: the old one's recorded pick, built from other code, was chosen as held
    and then refused, so the call was never served (an outside review: two bundle folders on KFORGE_SERVE)."""
    old = {**entry("copy_tuned", 256, 8), "triton_source_key": "0" * 64}
    picks = [{"kernel": f"{__name__}:copy_tuned", "key": [1000, "torch.float16", "torch.float16"],
              "config": config.all_kwargs()} for config in (CONFIGS[1], CONFIGS[1], CONFIGS[0])]
    server = serve.serve(str(bundle_dir(tmp_path / "b", [old, entry("copy_tuned", 128, 4)], picks)), strict=True)
    copy_tuned.cache.clear()
    x, y = tensors()
    copy_tuned[lambda meta: (triton.cdiv(1000, meta["BLOCK"]),)](x, y, 1000)
    assert [c[0] for c in Launched.calls] == [(8, 1, 1)] and server.served == 1   # BLOCK 128, this code's


@triton.autotune(configs=CONFIGS, key=["n"], reset_to_zero=["y_ptr"])
@triton.jit
def add_tuned(x_ptr, y_ptr, n, BLOCK: tl.constexpr):   # accumulates into y: benchmark runs are undone by a reset
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.atomic_add(y_ptr + i, tl.load(x_ptr + i, mask=i < n), mask=i < n)


def test_a_served_call_at_which_triton_would_tune_resets_the_arguments_triton_resets(jit, tmp_path, monkeypatch):
    """Triton zeroes an autotuner's reset_to_zero arguments after timing the configs, before the call's own launch;
    served, no timing ran and the argument kept what the caller left in it (an outside review: a sum off by the
    buffer's old content). A key already tuned is not reset, in either."""
    add_tuned.fn.device_caches.clear()
    add_tuned.fn.device_caches[0]
    monkeypatch.setattr(add_tuned.fn, "compile", lambda *a, **k: pytest.fail("compiled"), raising=False)
    held = {**entry("copy", 128, 4), "target": "add_tuned-128", "source": {"module": __name__, "entry": "add_tuned"},
            "triton_source_key": add_tuned.fn.cache_key}
    picks = [{"kernel": f"{__name__}:add_tuned", "key": [1000, "torch.float16", "torch.float16"],
              "config": CONFIGS[0].all_kwargs()}]
    serve.serve(str(bundle_dir(tmp_path / "b", [held], picks)), strict=True)
    add_tuned.cache.clear()
    x, y = tensors()
    y.fill_(7)
    add_tuned[(8,)](x, y, 1000)
    assert y.sum() == 0 and len(Launched.calls) == 1
    y.fill_(7)
    add_tuned[(8,)](x, y, 1000)   # tuned: as Triton, nothing reset
    assert y.sum() == 7 * 1000


def test_picks_recorded_apart_for_one_key_serve_each_call_its_recorded_specialization(jit, tmp_path):
    # two pytest-xdist workers tuned key n=1000 apart: one picked BLOCK 256 for an aligned call, the other BLOCK
    # 128 for a call one element in (another specialization); each recorded only its own pick's call
    entries = [entry("copy_tuned", 256, 8), entry("copy_tuned", 128, 4, divisible=["y_ptr"])]
    autotune = [{"kernel": f"{__name__}:copy_tuned", "key": [1000, "torch.float16", "torch.float16"],
                 "config": c.all_kwargs(), "lines": 1} for c in CONFIGS]
    server = serve.serve(str(bundle_dir(tmp_path / "b", entries, autotune)), strict=True)
    copy_tuned.cache.clear()
    x, y = tensors(1001)
    grid = lambda meta: (triton.cdiv(1000, meta["BLOCK"]),)
    copy_tuned[grid](x, y, 1000)
    copy_tuned[grid](x[1:], y, 1000)
    copy_tuned[grid](x, y, 1000)
    assert [c[0] for c in Launched.calls] == [(4, 1, 1), (8, 1, 1), (4, 1, 1)]   # BLOCK 256, 128, 256
    assert (server.served, server.compiled, server.misses) == (2, 0, [])


def test_of_the_recorded_picks_both_held_the_one_most_lines_made_runs(jit, tmp_path):
    entries = [entry("copy_tuned", 256, 8), entry("copy_tuned", 128, 4)]
    autotune = [{"kernel": f"{__name__}:copy_tuned", "key": [1000, "torch.float16", "torch.float16"],
                 "config": c.all_kwargs(), "lines": lines} for c, lines in zip(CONFIGS, (3, 1))]
    serve.serve(str(bundle_dir(tmp_path / "b", entries, autotune)), strict=True)
    copy_tuned.cache.clear()
    x, y = tensors()
    copy_tuned[lambda meta: (triton.cdiv(1000, meta["BLOCK"]),)](x, y, 1000)
    assert [c[0] for c in Launched.calls] == [(8, 1, 1)]   # BLOCK 128: 3 lines against 1


def test_a_pick_the_process_had_before_serving_gives_way_to_the_recorded_one(jit, tmp_path):
    # a benchmark run before serve() (or a library's own Autotuner subclass) filled the autotuner's cache with a
    # config the record did not pick, whose specialization was never built
    entries = [entry("copy_tuned", 256, 8)]
    autotune = [{"kernel": f"{__name__}:copy_tuned", "key": [1000, "torch.float16", "torch.float16"],
                 "config": CONFIGS[1].all_kwargs(), "lines": 1}]
    server = serve.serve(str(bundle_dir(tmp_path / "b", entries, autotune)), strict=True)
    copy_tuned.cache.clear()
    copy_tuned.cache[(1000, "torch.float16", "torch.float16")] = CONFIGS[0]
    x, y = tensors()
    grid = lambda meta: (triton.cdiv(1000, meta["BLOCK"]),)
    copy_tuned[grid](x, y, 1000)
    copy_tuned[grid](x, y, 1000)
    assert [c[0] for c in Launched.calls] == [(4, 1, 1), (4, 1, 1)]   # BLOCK 256, the recorded pick
    assert (server.served, server.compiled, server.misses) == (1, 0, [])


def test_an_autotuned_kernel_with_one_held_config_runs_it(jit, tmp_path):
    serve.serve(str(bundle_dir(tmp_path / "b", [entry("copy_tuned", 256, 8)])), strict=True)
    copy_tuned.cache.clear()
    x, y = tensors()
    copy_tuned[lambda meta: (triton.cdiv(1000, meta["BLOCK"]),)](x, y, 1000)
    assert [c[0] for c in Launched.calls] == [(4, 1, 1)]


@triton.autotune(configs=CONFIGS, key=["n"],
                 prune_configs_by={"early_config_prune": lambda configs, nargs, **kw: [
                     c for c in configs if c.kwargs["BLOCK"] >= nargs["n"]]})
@triton.jit
def copy_row(x_ptr, y_ptr, n, BLOCK: tl.constexpr):   # one block covers the row: a smaller BLOCK is wrong
    i = tl.arange(0, BLOCK)
    tl.store(y_ptr + i, tl.load(x_ptr + i, mask=i < n), mask=i < n)


def test_an_autotuned_call_runs_only_a_config_its_pruner_keeps(jit, tmp_path, monkeypatch):
    """A pruner may drop configs that would compute wrong for the call (a tile smaller than the row): Triton times
    only those it keeps. Serving took the one held config whatever the pruner said (an outside review: a quarter of
    each row summed)."""
    copy_row.fn.device_caches.clear()
    copy_row.fn.device_caches[0]
    monkeypatch.setattr(copy_row.fn, "compile", lambda *a, **k: pytest.fail("compiled"), raising=False)
    held = {**entry("copy", 128, 4), "target": "copy_row-128", "source": {"module": __name__, "entry": "copy_row"},
            "triton_source_key": copy_row.fn.cache_key, "divisible_by_16": ["x_ptr", "y_ptr", "n"]}
    server = serve.serve(str(bundle_dir(tmp_path / "b", [held])), strict=True)
    x, y = tensors(256)
    copy_row[(1,)](x, y, 128)   # the pruner keeps BLOCK=128 and 256: the held one runs
    assert server.served == 1
    with pytest.raises(serve.NotServed, match="has no recorded choice"):
        copy_row[(1,)](x, y, 256)   # it keeps BLOCK=256 alone, which the bundle lacks
    assert len(Launched.calls) == 1


def test_preload_loads_every_binary_for_the_device_before_any_call(jit, tmp_path, monkeypatch):
    from kforge_runtime.bundle import Bundle
    loads = []
    monkeypatch.setattr(Bundle, "kernel", lambda self, entry, device=None, binary=None: loads.append(entry["target"]) or Launched())
    server = serve.serve(str(bundle_dir(tmp_path / "b", [entry("copy", 128, 4), entry("copy", 256, 8)])),
                         preload=True)
    assert sorted(loads) == ["copy-128", "copy-256"] and len(server.loaded) == 2
    x, y = tensors()
    copy[(8,)](x, y, 1000, BLOCK=128)
    assert len(loads) == 2 and Launched.calls == [((8, 1, 1), 77, [x.data_ptr(), y.data_ptr(), 1000])]


# --- a kernel over host tensor descriptors, served (rules/runtime/tensordesc.py lays out its arguments) ----

@triton.jit
def desc_scale(x_desc, y_desc, scale, BLOCK: tl.constexpr):
    m = tl.program_id(0) * BLOCK
    y_desc.store([m, 0], x_desc.load([m, 0]) * scale)


DESC_META = {"block_size": [64, 64], "elem_size": 2, "elem_type": 6, "fp4_padded": False, "swizzle": 3}


def desc_entry(block: int) -> dict:
    return {"target": f"desc-{block}", "arch": "sm_90a", "toolchain": "triton",
            "source": {"module": __name__, "entry": "desc_scale"},
            "triton_source_key": desc_scale.cache_key,
            "signature": [{"name": "x_desc", "type": f"tensordesc<fp16[{block}, 64]>"},
                          {"name": "y_desc", "type": f"tensordesc<fp16[{block}, 64]>"},
                          {"name": "scale", "type": "fp32"}],
            "constexprs": {"BLOCK": block}, "divisible_by_16": [], "options": {"num_warps": 4, "num_stages": 3},
            "threads_per_block": 128, "shared": 0, "tensordesc_meta": [{**DESC_META, "block_size": [block, 64]}] * 2}


class Packed:
    """Stands for a loaded descriptor kernel: packs each launch with the loader's own Arguments, its maps
    encoded by a stand-in for the driver."""
    launches: list = []

    def __init__(self, entry):
        from kforge_runtime.launch import Arguments
        self.arguments = Arguments(entry)
        self.arguments.encode = lambda slot, meta, address, shape, strides, nan: Packed.launches.append(
            (meta["block_size"], address, shape, strides, nan))

    def reaches(self, address):   # as Launched's
        return True

    def launch_trusted(self, gx, gy, gz, stream, values):
        import ctypes
        params = self.arguments.pack_trusted(values)
        Packed.launches.append(ctypes.c_float.from_address(params[len(params) - 3]).value)   # scale, before scratch


def _desc_blocks(nargs):   # lmdeploy's TMA GEMM: descriptors made with a (1, 1) block, each config gives its own
    nargs["x_desc"].block_shape = [nargs["BLOCK"], 64]
    nargs["y_desc"].block_shape = [nargs["BLOCK"], 64]


desc_tuned = triton.autotune(configs=[triton.Config({"BLOCK": b}, num_warps=4, num_stages=3, pre_hook=_desc_blocks)
                                      for b in (64, 128)], key=["scale"])(desc_scale)


def test_an_autotuned_descriptor_kernel_whose_config_pre_hook_sets_the_blocks_is_served_its_recorded_pick(
        jit, tmp_path, monkeypatch):
    """The specialization of a call run with a config is the one after that config's pre_hook, as Autotuner.run
    runs it before every launch: the pick was looked up with the caller's (1, 1) blocks, missed (and was named as
    'held, but built from other source'), and the autotuner benchmarked both configs (lmdeploy's own tests, H200)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    from kforge_runtime.bundle import Bundle
    monkeypatch.setattr(Bundle, "kernel", lambda self, entry, device=None, binary=None: Packed(entry))
    Packed.launches = []
    desc_scale.device_caches.clear()
    desc_scale.device_caches[0]
    desc_tuned.cache.clear()
    monkeypatch.setattr(desc_scale, "compile", lambda *a, **k: pytest.fail("compiled"), raising=False)
    pick = {"kernel": f"{__name__}:desc_scale", "key": [0.5],   # descriptors add no dtype to the key
            "config": {"BLOCK": 128, "num_warps": 4, "num_ctas": 1, "num_stages": 3}}
    server = serve.serve(str(bundle_dir(tmp_path / "b", [desc_entry(64), desc_entry(128)], [pick])), strict=True)
    x, y = torch.zeros(256, 64, dtype=torch.float16), torch.zeros(256, 64, dtype=torch.float16)
    desc_tuned[(2,)](TensorDescriptor.from_tensor(x, [1, 1]), TensorDescriptor.from_tensor(y, [1, 1]), 0.5)
    assert (server.tuned_configs, server.served, server.compiled, server.misses) == (1, 1, 0, [])
    assert [launch[0] for launch in Packed.launches[:2]] == [[128, 64], [128, 64]]


def test_a_call_with_tensor_descriptors_is_served_and_launched_from_the_bundle(jit, tmp_path, monkeypatch):
    from triton.tools.tensor_descriptor import TensorDescriptor

    from kforge_runtime.bundle import Bundle
    monkeypatch.setattr(Bundle, "kernel", lambda self, entry, device=None, binary=None: Packed(entry))
    Packed.launches = []
    desc_scale.device_caches.clear()
    desc_scale.device_caches[0]
    monkeypatch.setattr(desc_scale, "compile", lambda *a, **k: pytest.fail("compiled"), raising=False)
    server = serve.serve(str(bundle_dir(tmp_path / "b", [desc_entry(64), desc_entry(128)])), strict=True)
    x, y = torch.zeros(256, 64, dtype=torch.float16), torch.zeros(256, 64, dtype=torch.float16)
    x_desc = TensorDescriptor.from_tensor(x, [128, 64], padding="nan")
    y_desc = TensorDescriptor.from_tensor(y, [128, 64])
    for _ in range(2):
        desc_scale[(2,)](x_desc, y_desc, 0.5, BLOCK=128)
    assert (server.served, server.compiled, server.misses) == (1, 0, [])
    assert Packed.launches == [([128, 64], x.data_ptr(), [256, 64], [64, 1], True),   # encoded once: the
                               ([128, 64], y.data_ptr(), [256, 64], [64, 1], False), 0.5, 0.5]   # same tensors
    with pytest.raises(serve.NotServed, match=r'"tensordesc<fp16\[32, 64\]>"'):   # another block: not built
        desc_scale[(8,)](TensorDescriptor.from_tensor(x, [32, 64]), TensorDescriptor.from_tensor(y, [32, 64]), 0.5,
                         BLOCK=32)


def test_a_blocks_threads_are_the_compiles_warps_times_the_archs_warp_and_warp_specialization_adds_warps():
    """Triton's metadata num_warps is ttg.total-num-warps for a warp-specialized kernel (more than the call's
    num_warps) and its launcher gives that many warps: a block of other threads than those is refused."""
    from kforge_runtime.launch import LaunchError, launch_plan
    base = {**entry("copy", 128, 4), "arch": "sm_90a"}
    launch_plan({**base, "num_warps": 4}, "nvidia")
    launch_plan({**base, "num_warps": 8, "threads_per_block": 256}, "nvidia")   # 4 warps more, as specialized
    for bad in ({"num_warps": 2, "threads_per_block": 64}, {"num_warps": 4, "threads_per_block": 256},
                {"num_warps": "4"}, {"arch": "gfx942"}):   # gfx942: 64 threads a warp, 4 warps: 256
        with pytest.raises(LaunchError, match="threads_per_block .* is not its num_warps"):
            launch_plan({**base, **bad}, "nvidia")
    launch_plan({**base, "arch": "gfx942", "threads_per_block": 256}, "amd")


@pytest.mark.parametrize("sha256", [["x"], {}])
def test_an_entry_whose_sha256_is_no_string_is_no_traceback_in_the_applications_call(jit, tmp_path, sha256):
    """_pick's set of the entries' digests raised `TypeError: unhashable type: 'list'` inside the application's
    kernel call, strict or not (a hostile-input review); the digest check refuses such a binary (check_binary)."""
    server = serve.serve(str(bundle_dir(tmp_path / "b", [{**entry("copy", 128, 4), "sha256": sha256}])))
    x, y = tensors()
    copy[(8,)](x, y, 1000, BLOCK=128)   # the jit fixture's Bundle.binary stands in for the check
    assert server.served == 1


@pytest.mark.parametrize("kernel", ["copy", "desc_scale", "threads"])
def test_an_entry_the_loaders_launch_plan_refuses_is_a_miss_before_it_counts_as_served(jit, tmp_path, monkeypatch,
                                                                                      kernel):
    """Every refusal the loader makes before the driver sees the binary (a toolchain it does not launch, a
    descriptor's compile metadata it cannot lay out, a block of other threads than its warps: served, it ran with
    32 threads where the binary was compiled for 128, a hostile-input review) is made when the entry is picked:
    such an entry was counted served, and the loader raised LaunchError at the first launch, or launched it."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    from kforge_runtime.bundle import Bundle
    monkeypatch.setattr(Bundle, "kernel", lambda self, entry, device=None, binary=None: Packed(entry))
    if kernel in ("copy", "threads"):
        bad, said, fn = {**entry("copy", 128, 4), "toolchain": "flydsl"}, "launching flydsl artifacts", copy
        if kernel == "threads":   # the block the launch would get is not the one the binary was compiled for
            bad = {**entry("copy", 128, 4), "threads_per_block": 32}
            said = "threads_per_block 32 is not its num_warps 4"
        x, y = tensors()
        args = (x, y, 1000)
    else:
        bad, said, fn = {**desc_entry(64), "tensordesc_meta": "x"}, "desc-64: ", desc_scale
        x = torch.zeros(256, 64, dtype=torch.float16)
        args = (TensorDescriptor.from_tensor(x, [64, 64]), TensorDescriptor.from_tensor(x, [64, 64]), 0.5)
    block = bad["constexprs"]["BLOCK"]
    fn.device_caches.clear()
    fn.device_caches[0]   # made now: its compile is then replaced (as the jit fixture does)
    monkeypatch.setattr(fn, "compile", lambda *a, **k: pytest.fail("compiled"), raising=False)
    server = serve.serve(str(bundle_dir(tmp_path / "b", [bad])))
    with pytest.raises(pytest.fail.Exception, match="compiled"):   # not strict: Triton compiles it
        fn[(8,)](*args, BLOCK=block)
    assert server.served == 0 and said in server.misses[0]["unlaunchable"], server.misses
    serve.stop()
    serve.serve(str(bundle_dir(tmp_path / "strict", [bad])), strict=True)
    with pytest.raises(serve.NotServed, match=re.escape(said)):
        fn[(8,)](*args, BLOCK=block)


def test_the_summary_says_what_serving_cost_the_process(jit, tmp_path):
    server = serve.serve(str(bundle_dir(tmp_path / "b", [entry("copy", 128, 4)])))
    x, y = tensors()
    copy[(8,)](x, y, 1000, BLOCK=128)
    assert re.search(r"1 specializations served, 0 compiled.*; set-up \d+ ms, bundles indexed in \d+ ms$",
                     server.summary())
    assert server.setup_seconds > 0 and server.index_seconds > 0


def test_serve_picks_the_light_driver_without_initializing_cuda(monkeypatch):
    """Asking torch whether a GPU is there initializes CUDA (about 0.2 s, counted as serve()'s own set-up): a
    CUDA build of torch is enough to choose the light driver; the app's first GPU call pays the init anyway."""
    from triton.runtime import driver
    monkeypatch.setattr(driver, "_active", None)
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: pytest.fail("CUDA was initialized"))
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda device: 0, raising=False)
    serve.light_driver()
    assert isinstance(driver._active, serve.LightDriver)
    monkeypatch.setattr(driver, "_active", None)
    monkeypatch.delattr(torch._C, "_cuda_getCurrentRawStream")
    serve.light_driver()   # a torch without the accessor keeps Triton's own driver, and says nothing
    assert driver._active is None


def _with_byte_flipped(data: bytes, section: str) -> bytes:
    from kforge_runtime.elf import parse
    found = next(s for s in parse(data).sections if s.name == section)
    changed = bytearray(data)
    changed[found.offset] ^= 0xFF
    return bytes(changed)


def test_verify_says_whether_the_machine_code_differs_and_ignores_line_info_and_its_relocations(built):
    """Another ptxas (torch.compile's) wrote notes and attributes of its own around the same machine code: verify
    listed those sections as differing and left the reader to guess whether the code did (an outside suite's run);
    the line info's relocations (.rela.nv_debug_line_sass) differ with the line info itself, which is ignored."""
    from kforge_runtime.elf import parse
    cubin = (built / "out" / "sm_90a" / "scale" / "fp16-b256-w4" / "scale_kernel.cubin").read_bytes()
    names = {s.name for s in parse(cubin).sections}
    metadata = SimpleNamespace(name="scale_kernel", shared=0, num_warps=4, warp_size=32, global_scratch_size=0)
    held = {"symbol": "scale_kernel", "shared": 0, "threads_per_block": 128}
    info = next(n for n in sorted(names) if n.startswith(".nv.info"))
    assert serve.differences(cubin, _with_byte_flipped(cubin, info), held, metadata) == [
        f"sections {info} differ (the machine code, .text, is the same)"]
    assert serve.differences(cubin, _with_byte_flipped(cubin, ".text.scale_kernel"), held, metadata) == [
        "sections .text.scale_kernel differ"]
    for debug in [n for n in names if n.startswith((".nv_debug", ".rela.nv_debug", ".debug"))]:
        assert serve.differences(cubin, _with_byte_flipped(cubin, debug), held, metadata) == [], debug


def _with_tkinfo(cubin: bytes, build: bytes) -> bytes:
    """The cubin with a .note.nv.tkinfo naming the ptxas build, as CUDA 13's ptxas writes one (its PTX text section
    renamed and overwritten: the same length)."""
    from kforge_runtime.elf import parse
    ptx = next(s for s in parse(cubin).sections if s.name == ".nv_debug_ptx_txt")
    note = b"\x00ptxas\x00Cuda compilation tools, release 13.0, V13.0.88\x00" + build + b"\x00-v  -lineinfo \x00"
    changed = bytearray(cubin.replace(b".nv_debug_ptx_txt\x00", b".note.nv.tkinfo\x00\x00\x00", 1))
    changed[ptx.offset:ptx.offset + len(note)] = note
    return bytes(changed)


def test_verify_names_the_ptxas_that_made_the_jits_binary_where_it_is_not_the_builds(built, jit, tmp_path,
                                                                                     monkeypatch):
    """torch.compile sets TRITON_PTXAS_PATH to torch's own ptxas (CUDA 13.0 on the H200s) for the rest of the
    process: Triton's JIT there makes other bytes of the same kernel than the bundle's ptxas (CUDA 12.8). The JIT
    binary's .note.nv.tkinfo says which ptxas wrote it; without one, the ptxas the JIT runs now is asked."""
    built_by = {"arch": "sm_90a", "toolchain_versions": {"ptxas": "Build cuda_12.8.r12.8/compiler.35583870_0"}}
    cubin = (built / "out" / "sm_90a" / "scale" / "fp16-b256-w4" / "scale_kernel.cubin").read_bytes()
    by_13 = _with_tkinfo(cubin, b"Build cuda_13.0.r13.0/compiler.36424714_0")
    assert serve.other_ptxas(built_by, by_13) == (
        "the JIT's binary was made by ptxas Build cuda_13.0.r13.0/compiler.36424714_0, the bundle's by Build "
        "cuda_12.8.r12.8/compiler.35583870_0 (TRITON_PTXAS_PATH chooses the JIT's; torch.compile sets "
        "TRITON_PTXAS_PATH to torch's own ptxas)")
    same = {**built_by, "toolchain_versions": {"ptxas": "Build cuda_13.0.r13.0/compiler.36424714_0"}}
    assert serve.other_ptxas(same, by_13) is None
    assert serve.other_ptxas({**built_by, "arch": "gfx942"}, by_13) is None
    assert serve.other_ptxas({"arch": "sm_90a"}, by_13) is None
    assert "(TRITON_PTXAS_BLACKWELL_PATH chooses" in serve.other_ptxas({**built_by, "arch": "sm_100a"}, by_13)
    hostile = {**built_by, "toolchain_versions": {"ptxas": "12.8\nkforge verify: all fine" + "x" * 100_000}}
    said = serve.other_ptxas(hostile, by_13)
    assert "\n" not in said and len(said) < 600, said[:300]

    fake = tmp_path / "ptxas"   # no note: the ptxas TRITON_PTXAS_PATH names now, by its version line
    fake.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 13.0, V13.0.88'\n"
                    "echo 'Build cuda_13.0.r13.0/compiler.36424714_0'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("TRITON_PTXAS_PATH", str(fake))
    said = serve.other_ptxas(built_by, cubin)
    assert said.startswith(f"the JIT's binary was made by ptxas Build cuda_13.0.r13.0/compiler.36424714_0 at "
                           f"{fake}, the bundle's by Build cuda_12.8"), said
    fake.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 12.8, V12.8.93'\n"
                    "echo 'Build cuda_12.8.r12.8/compiler.35583870_0'\n")   # replaced in place: asked again
    os.utime(fake, ns=(1, 10**18))
    assert serve.other_ptxas(built_by, cubin) is None
    fake.chmod(0o644)   # a ptxas that cannot be run adds nothing, and raises nothing
    os.utime(fake, ns=(1, 2 * 10**18))
    assert serve.other_ptxas(built_by, cubin) is None

    from kforge_runtime.bundle import Bundle   # and a difference verify finds says so
    compiled = SimpleNamespace(asm={"cubin": by_13}, metadata=SimpleNamespace(
        name="copy", shared=0, num_warps=4, warp_size=32, global_scratch_size=0))
    monkeypatch.setattr(copy, "compile", lambda *a, **k: compiled, raising=False)
    monkeypatch.setattr(Bundle, "binary", lambda self, entry: cubin)
    held = {**entry("copy", 128, 4), "symbol": "copy", **built_by}
    server = serve.serve(str(bundle_dir(tmp_path / "b", [held])), verify=True)
    x, y = tensors()
    copy[(8,)](x, y, 1000, BLOCK=128)
    assert len(server.differences) == 1, server.differences
    assert server.differences[0].endswith("; " + serve.other_ptxas(built_by, by_13)), server.differences
    serve.stop()   # binaries apart in their line info alone: no difference, whichever ptxas made them
    fake.write_text(fake.read_text().replace("12.8", "13.0"))   # the JIT runs a CUDA 13.0 ptxas again
    fake.chmod(0o755)
    os.utime(fake, ns=(1, 3 * 10**18))
    assert serve.other_ptxas(built_by, cubin) is not None
    server = serve.Server(None, strict=False, verify=True)
    served = SimpleNamespace(entry=held, bundle=SimpleNamespace(binary=lambda entry: cubin))
    server.compare(served, SimpleNamespace(asm={"cubin": _with_byte_flipped(cubin, ".debug_line")},
                                           metadata=SimpleNamespace(name="copy", shared=0, num_warps=4, warp_size=32)))
    assert (server.verified, server.differences) == (1, []), server.differences


def test_preload_leaves_an_entry_the_loader_refuses_to_triton_and_loads_the_others(jit, tmp_path, monkeypatch):
    """preload loads every entry at once: one whose launch fields the loader refuses raised LaunchError out of the
    process's first call, where a call of it is a miss (Triton compiles it) and the others are served."""
    from kforge_runtime import launch
    from kforge_runtime.bundle import Bundle

    def kernel(self, entry, device=None, binary=None):   # what the loader refuses, as kforge_runtime.launch.Kernel
        launch.launch_plan(entry, "nvidia")
        return Launched()
    monkeypatch.setattr(Bundle, "kernel", kernel)
    bad = {**entry("copy", 256, 4), "target": "copy-256", "profile_scratch_size": 256}
    server = serve.serve(str(bundle_dir(tmp_path / "b", [entry("copy", 128, 4), bad])), preload=True)
    x, y = tensors()
    copy[(8,)](x, y, 1000, BLOCK=128)
    assert server.served == 1
    with pytest.raises(pytest.fail.Exception, match="compiled"):   # Triton compiles it
        copy[(4,)](x, y, 1000, BLOCK=256)
    assert server.served == 1 and "profiler" in server.misses[0]["unlaunchable"]
