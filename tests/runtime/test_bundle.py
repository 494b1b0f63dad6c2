"""The runtime loader on CPU: opening bundles, refusing tampered ones, and picking the artifact to launch."""
import hashlib
import itertools
import json
import os
import shutil
import socket
import sys
import zipfile

import pytest

from kforge_runtime import Bundle, BundleError, Library, NoMatchingKernel
from kforge_runtime import library as library_module
from kforge_runtime.device import cuda_archs
from kforge_runtime.launch import LaunchError
from tests.support import doit, make_project, spec_text, time_limit, write_manifest

ARCHS = ("sm_80", "sm_90a", "gfx942")


@pytest.fixture(scope="module")
def dist(tmp_path_factory):
    root = make_project(tmp_path_factory.mktemp("rt"), specs={"scale": spec_text(archs=ARCHS, dtypes=("fp16", "bf16"),
                                                                                 blocks=(256, 512))})
    doit(root, "-n", "2")
    return root / "out" / "dist"


def wheel(dist, arch):
    return next(dist.glob(f"kforge_kernels_{arch}-*.whl"))


def unpacked(dist, arch, tmp_path):
    with zipfile.ZipFile(wheel(dist, arch)) as zf:
        zf.extractall(tmp_path)
    return tmp_path / f"kforge_kernels_{arch}"


def edit_entry(bundle_dir, config_id, change):
    edit_manifest(bundle_dir, lambda m: [change(e) for e in m["artifacts"] if e["config_id"] == config_id])


def edit_manifest(bundle_dir, change):
    m = json.loads((bundle_dir / "manifest.json").read_text())
    change(m)
    write_manifest(bundle_dir, json.dumps(m))


def test_a_wheel_and_its_unpacked_directory_give_the_same_checked_binary(dist, tmp_path):
    for bundle in (Bundle(wheel(dist, "sm_90a")), Bundle(unpacked(dist, "sm_90a", tmp_path))):
        entry = bundle.find("scale", {"dtype": "bf16", "BLOCK": 512})
        assert entry["target"] == "scale:bf16-b512-w4@sm_90a"
        assert len(bundle.binary(entry)) == entry["size"]
    assert Bundle(wheel(dist, "gfx942")).find("scale", "fp16-b256-w4")["arch"] == "gfx942"


def test_no_match_lists_what_the_bundle_has(dist):
    bundle = Bundle(wheel(dist, "sm_90a"))
    with pytest.raises(NoMatchingKernel, match="(?s)matches no artifact.*bf16-b256-w4.*fp16-b512-w4"):
        bundle.find("scale", {"dtype": "fp32"})
    with pytest.raises(NoMatchingKernel, match="matches 2 .*give more config values"):
        bundle.find("scale", {"dtype": "bf16"})
    with pytest.raises(NoMatchingKernel, match="no kernel 'gemm'; it has: scale"):
        bundle.find("gemm")


def test_a_tampered_binary_is_refused(dist, tmp_path):
    d = unpacked(dist, "sm_90a", tmp_path)
    cubin = next(d.glob("scale/bf16-b256-w4/*.cubin"))
    data = bytearray(cubin.read_bytes())
    data[-1] ^= 0xFF
    cubin.write_bytes(bytes(data))
    bundle = Bundle(d)
    with pytest.raises(BundleError, match="sha256 .* does not match the recorded .*; the bundle was altered"):
        bundle.binary(bundle.find("scale", "bf16-b256-w4"))


@pytest.mark.parametrize("path", ["../../etc/passwd", "/etc/passwd", "scale/../../x.cubin", "./a", "C:/x", ""])
def test_a_manifest_path_outside_the_bundle_is_refused(dist, tmp_path, path):
    d = unpacked(dist, "sm_90a", tmp_path)
    edit_entry(d, "bf16-b256-w4", lambda e: e.update(binary=path))
    with pytest.raises(BundleError, match="outside the bundle"):
        Bundle(d).find("scale", "bf16-b256-w4")


def test_a_symlink_out_of_the_bundle_is_refused(dist, tmp_path):
    d = unpacked(dist, "sm_90a", tmp_path / "b")
    cubin = next(d.glob("scale/bf16-b256-w4/*.cubin"))
    outside = tmp_path / "outside.cubin"
    shutil.copy(cubin, outside)
    cubin.unlink()
    cubin.symlink_to(outside)
    bundle = Bundle(d)
    with pytest.raises(BundleError, match="resolves outside the bundle"):
        bundle.binary(bundle.find("scale", "bf16-b256-w4"))


def test_a_binary_for_another_arch_is_refused_even_with_a_matching_sha256(dist, tmp_path):
    d = unpacked(dist, "sm_90a", tmp_path / "nv")
    amd = Bundle(wheel(dist, "gfx942"))
    amd_entry = amd.find("scale", "bf16-b256-w4")
    entry_path = next(d.glob("scale/bf16-b256-w4/*.cubin"))
    entry_path.write_bytes(amd.binary(amd_entry))
    edit_entry(d, "bf16-b256-w4", lambda e: e.update(sha256=amd_entry["sha256"]))
    bundle = Bundle(d)
    with pytest.raises(BundleError, match="the binary is for gfx942, expected sm_90a"):
        bundle.binary(bundle.find("scale", "bf16-b256-w4"))
    edit_entry(d, "bf16-b256-w4", lambda e: e.update(arch="gfx942"))
    with pytest.raises(BundleError, match="is for gfx942, the bundle is for sm_90a"):
        Bundle(d).find("scale", "bf16-b256-w4")


def test_malformed_manifests_are_refused_clearly(dist, tmp_path):
    d = unpacked(dist, "sm_90a", tmp_path)
    edit_manifest(d, lambda m: m.update(format_version=99))
    with pytest.raises(BundleError, match="format_version 99"):
        Bundle(d)
    edit_manifest(d, lambda m: m.update(format_version=1))
    edit_entry(d, "fp16-b512-w4", lambda e: e.pop("sha256"))
    with pytest.raises(BundleError, match="artifact 'scale:fp16-b512-w4@sm_90a' needs 'sha256'"):
        Bundle(d).find("scale", "fp16-b512-w4")
    assert Bundle(d).find("scale", "bf16-b512-w4")   # the other entries still load
    write_manifest(d, "{not json")
    with pytest.raises(BundleError, match="unreadable manifest.json"):
        Bundle(d)
    with pytest.raises(BundleError, match="not a bundle"):
        Bundle(d / "manifest.json")


def test_cuda_archs_follow_binary_compatibility():
    assert cuda_archs(9, 0) == ["sm_90a", "sm_90"]
    assert "sm_80" in cuda_archs(8, 6) and "sm_90a" not in cuda_archs(8, 6)
    assert "sm_90a" not in cuda_archs(10, 0) and cuda_archs(10, 0)[0] == "sm_100a"


def test_library_picks_the_bundle_the_device_can_run(dist, monkeypatch):
    lib = Library(dist)
    assert sorted(b.arch for b in lib.bundles) == sorted(ARCHS)
    for device, expected in (((8, 6), "sm_80"), ((9, 0), "sm_90a")):
        monkeypatch.setattr(library_module, "runnable_archs", lambda d, cc=device: ("gpu", cuda_archs(*cc)))
        bundle, entry = lib.select("scale", "fp16-b256-w4")
        assert (bundle.arch, entry["arch"]) == (expected, expected)
    monkeypatch.setattr(library_module, "runnable_archs", lambda d: ("B200 (sm_100)", cuda_archs(10, 0)))
    with pytest.raises(NoMatchingKernel, match=r"no bundle for B200 \(sm_100\).*bundles are for .*sm_90a.*"
                                               r"doit package archs=sm_100a"):
        lib.select("scale", "fp16-b256-w4")


def test_jit_fallback_is_opt_in_and_builds_from_the_recorded_recipe(dist, monkeypatch):
    lib = Library(dist)
    monkeypatch.setattr(library_module, "runnable_archs", lambda d: ("B200 (sm_100)", cuda_archs(10, 0)))
    with pytest.raises(NoMatchingKernel):
        lib.load("scale", "bf16-b512-w4")
    monkeypatch.syspath_prepend(str(dist.parents[1]))   # the project, for its tk.scale module
    kernel = lib.load("scale", "bf16-b512-w4", jit_fallback=True)
    assert type(kernel).__name__ == "JitKernel"
    assert kernel.kwargs == {"BLOCK": 512, "num_warps": 4}
    assert kernel.fn.fn.__name__ == "scale_kernel"
    for name in ("tk.scale", "tk"):   # other tests' projects have their own tk package
        sys.modules.pop(name, None)




def make_special(path, kind):
    """Put a FIFO, a directory or a bound Unix socket where a regular file is expected."""
    path.unlink(missing_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dir":
        path.mkdir()
    else:
        server, cwd = socket.socket(socket.AF_UNIX), os.getcwd()
        os.chdir(path.parent)   # a relative name: an AF_UNIX path may not be longer than 107 bytes
        try:
            server.bind(path.name)
        finally:
            os.chdir(cwd)
        return server
    return None


@pytest.mark.parametrize("kind", ["fifo", "dir", "socket"])
def test_a_manifest_that_is_not_a_regular_file_is_refused_without_blocking(dist, tmp_path, kind):
    d = unpacked(dist, "sm_90a", tmp_path)
    server = make_special(d / "manifest.json", kind)
    with time_limit(5, "a read"), pytest.raises(BundleError, match="manifest.json"):
        Bundle(d)
    with time_limit(5, "a read"), pytest.raises(BundleError, match="manifest.json"):
        Library(d).bundles
    if server:
        server.close()


@pytest.mark.parametrize("kind", ["fifo", "dir", "socket", "missing"])
def test_a_binary_that_is_not_a_regular_file_is_refused_without_blocking(dist, tmp_path, kind):
    d = unpacked(dist, "sm_90a", tmp_path)
    cubin = next(d.glob("scale/bf16-b256-w4/*.cubin"))
    server = make_special(cubin, kind) if kind != "missing" else cubin.unlink()
    bundle = Bundle(d)
    with time_limit(5, "a read"), pytest.raises(BundleError, match=f"cannot read scale/bf16-b256-w4/{cubin.name}"):
        bundle.binary(bundle.find("scale", "bf16-b256-w4"))
    if server:
        server.close()


def test_a_tuning_table_that_is_a_fifo_is_refused_without_blocking(dist, tmp_path):
    from kforge_runtime.select import NoTunedConfig
    d = unpacked(dist, "sm_90a", tmp_path)
    (d / "tune").mkdir()
    os.mkfifo(d / "tune" / "scale.json")
    edit_manifest(d, lambda m: m.update(tuned={"scale": {"path": "tune/scale.json", "sha256": "0" * 64}}))
    with time_limit(5, "a read"), pytest.raises(BundleError, match="cannot read tune/scale.json"):
        Bundle(d).tuned("scale")
    edit_manifest(d, lambda m: m.update(tuned=["not", "an", "object"]))
    with pytest.raises(NoTunedConfig, match="no tuning table for 'scale'"):
        Bundle(d).tuned("scale")


def test_a_bundle_path_that_is_a_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "kforge_kernels_sm_90a-0.1.0-py3-none-any.whl"
    os.mkfifo(fifo)
    with time_limit(5, "a read"), pytest.raises(BundleError, match="a FIFO or pipe, not a regular file"):
        Bundle(fifo)
    with time_limit(5, "a read"), pytest.raises(BundleError, match="a FIFO or pipe, not a regular file"):
        Library(tmp_path).bundles   # a directory of wheels
    with time_limit(5, "a read"), pytest.raises(BundleError, match="a FIFO or pipe, not a regular file"):
        Library(fifo).bundles


def test_a_symlink_loop_is_refused(dist, tmp_path):
    d = unpacked(dist, "sm_90a", tmp_path)
    cubin = next(d.glob("scale/bf16-b256-w4/*.cubin"))
    cubin.unlink()
    cubin.symlink_to(cubin)
    bundle = Bundle(d)
    with pytest.raises(BundleError, match="cannot resolve"):
        bundle.binary(bundle.find("scale", "bf16-b256-w4"))


@pytest.mark.parametrize("text", ["[" * 100000, '{"a":' * 100000, '{"format": ' + "1" * 5000 + "}",
                                  '{"format": "kforge-bundle", "x": "\\ud800"', b"\xff\xfe\xff", b""],
                         ids=["deep-array", "deep-object", "huge-int", "truncated", "not-utf8", "empty"])
def test_a_manifest_that_is_not_usable_json_is_a_bundle_error_naming_it(dist, tmp_path, text):
    d = unpacked(dist, "sm_90a", tmp_path)
    write_manifest(d, text)
    with pytest.raises(BundleError, match=f"{d}: unreadable manifest.json"):
        Bundle(d)


def test_values_of_the_wrong_shape_give_bundle_errors_with_short_messages(dist, tmp_path):
    d = unpacked(dist, "sm_90a", tmp_path)
    deep = json.loads("[" * 500 + "]" * 500)
    edit_manifest(d, lambda m: m.update(format_version=deep))
    with pytest.raises(BundleError, match="format_version a JSON array"):
        Bundle(d)
    edit_manifest(d, lambda m: m.update(format_version=1))
    edit_entry(d, "bf16-b256-w4", lambda e: e.update(target=deep, sha256=None))
    edit_entry(d, "fp16-b256-w4", lambda e: e.update(config_id="x" * 100000))
    with pytest.raises(BundleError) as raised:
        Bundle(d).find("scale", {"BLOCK": 256, "dtype": "bf16"})
    assert "artifact a JSON array needs 'target' as a str" in str(raised.value) and len(str(raised.value)) < 300
    with pytest.raises(NoMatchingKernel) as raised:
        Bundle(d).find("scale", {"dtype": "fp32"})
    assert len(str(raised.value)) < 1000
    edit_entry(d, "bf16-b512-w4", lambda e: e.update(arch="sm_90a\nsm_80"))
    with pytest.raises(BundleError, match=r"is for 'sm_90a\\nsm_80', the bundle is for sm_90a"):
        Bundle(d).find("scale", "bf16-b512-w4")
    edit_manifest(d, lambda m: m.update(arch="sm_90a\n"))
    with pytest.raises(BundleError, match=r"'arch' is 'sm_90a\\n', not a name"):
        Bundle(d)
    edit_manifest(d, lambda m: m.update(arch="sm_90a"))
    edit_entry(d, "bf16-b512-w4", lambda e: e.update(arch="sm_90a"))
    for bad in ("scale/\ud800.cubin", "scale/a\nb.cubin", "../" + "x" * 100000):
        edit_entry(d, "bf16-b512-w4", lambda e: e.update(binary=bad))
        with pytest.raises(BundleError, match="outside the bundle or not normalized") as raised:
            Bundle(d).find("scale", "bf16-b512-w4")
        assert len(str(raised.value)) < 300


def test_a_zip_member_larger_than_the_limit_is_refused_unread(dist, tmp_path, monkeypatch):
    from kforge_runtime import bundle as bundle_module
    bundle = Bundle(wheel(dist, "sm_90a"))
    entry = bundle.find("scale", "bf16-b256-w4")
    monkeypatch.setattr(bundle_module, "MAX_BINARY_BYTES", entry["size"] - 1)
    with pytest.raises(BundleError, match="over the loader's limit"):
        bundle.binary(entry)


def lying_zip(path, name: str, inflated: int, claimed: int) -> None:
    """A zip whose member `name` inflates to `inflated` zero bytes while its headers claim `claimed`."""
    import struct
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr(name, b"\0" * inflated)
    data = bytearray(path.read_bytes())
    struct.pack_into("<I", data, 22, claimed)   # the local header's uncompressed size
    struct.pack_into("<I", data, data.rfind(b"PK\x01\x02") + 24, claimed)   # the central directory's
    path.write_bytes(bytes(data))


def test_a_member_inflating_past_what_its_headers_claim_is_read_no_further_than_the_claim(tmp_path):
    """Headers claiming 12,000 bytes, 64 MiB inside: a few kB inflated, then its CRC fails (zipfile's whole-member
    read inflated all of it first)."""
    import time
    import tracemalloc
    bomb = tmp_path / "kforge_kernels_sm_90a-0-py3-none-any.whl"
    lying_zip(bomb, "kforge_kernels_sm_90a/manifest.json", 64 << 20, 12_000)
    tracemalloc.start()
    began = time.monotonic()
    try:
        with pytest.raises(BundleError, match="cannot read manifest.json from the archive .*CRC"):
            Bundle(bomb)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20 and time.monotonic() - began < 2, (peak, time.monotonic() - began)


def test_a_message_listing_what_a_huge_bundle_has_names_a_few_and_counts_the_rest(dist, tmp_path):
    bundle_dir = unpacked(dist, "sm_90a", tmp_path)
    edit_manifest(bundle_dir, lambda m: m["artifacts"].extend({"kernel": f"k{i:06}"} for i in range(100_000)))
    bundle = Bundle(bundle_dir)
    with pytest.raises(NoMatchingKernel) as missing:
        bundle.find("no_such_kernel")
    assert len(str(missing.value)) < 600 and "and 99991 more" in str(missing.value), str(missing.value)[:600]
    edit_manifest(bundle_dir, lambda m: m["artifacts"].extend(
        {"kernel": "scale", "config_id": f"c{i:06}", "config": {}} for i in range(100_000)))
    with pytest.raises(NoMatchingKernel) as unmatched:
        Bundle(bundle_dir).find("scale", {"BLOCK": 3})
    assert len(str(unmatched.value)) < 1000 and "more" in str(unmatched.value)


_packages = itertools.count()


def jit_setup(tmp_path, files, record=None, module="kern", digests=None):
    """A project with the package `files` describes ({name: text}), on sys.path, and a bundle whose one
    "failed" record names <package>.<module>, with the digests of `record` (default: every file)."""
    package = f"jitpkg{next(_packages)}"
    project = tmp_path / "project"
    for name, text in files.items():
        (project / package / name).parent.mkdir(parents=True, exist_ok=True)
        (project / package / name).write_text(text.replace("PKG", package))
    if digests is None:
        digests = {f"{package}/{name}": hashlib.sha256((project / package / name).read_bytes()).hexdigest()
                   for name in (record if record is not None else files)}
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    record = {"target": "k:x@sm_90a", "kernel": "k", "config_id": "x", "config": {}, "arch": "sm_90a",
              "status": "failed", "error": "", "toolchain": "triton", "constexprs": {"BLOCK": 64},
              "options": {"num_warps": 4}, "source": {"module": f"{package}.{module}", "entry": "kernel",
                                                     "digests": digests}}
    write_manifest(bundle, json.dumps({
        "format": "kforge-bundle", "format_version": 1, "arch": "sm_90a", "vendor": "nvidia", "artifacts": [],
        "failed": [record]}))
    sys.path.insert(0, str(project))
    return Library(bundle), project / package, package


@pytest.fixture
def jit(tmp_path):
    """jit_setup, then sys.path and sys.modules as they were."""
    path, modules = list(sys.path), set(sys.modules)
    yield lambda *args, **kwargs: jit_setup(tmp_path, *args, **kwargs)
    sys.path[:] = path
    for name in set(sys.modules) - modules:
        del sys.modules[name]


RUNS = 'import pathlib\npathlib.Path(__file__).with_suffix(".ran").touch()\n'   # leaves a trace when run
KERNEL = RUNS + "kernel = 'the kernel'\n"


def jit_load(lib):
    return lib.load("k", jit_fallback=True, arch="sm_100a")


def test_the_jit_fallback_imports_the_recorded_source(jit):
    lib, package_dir, _ = jit({"__init__.py": '"""A docstring only: runs nothing."""\n', "kern.py": KERNEL})
    kernel = jit_load(lib)
    assert kernel.fn == "the kernel" and kernel.kwargs == {"BLOCK": 64, "num_warps": 4}
    assert (package_dir / "kern.ran").exists()


@pytest.mark.parametrize("case, files, kwargs, error", [
    ("changed", {"__init__.py": "", "kern.py": KERNEL}, {"digests": "stale"}, r"PKG/kern.py differs"),
    ("missing", {"__init__.py": "", "kern.py": KERNEL}, {"digests": "extra"}, r"PKG/helper.py is missing"),
    ("no digests", {"__init__.py": "", "kern.py": KERNEL}, {"digests": {}}, "records no source digests"),
    ("not recorded", {"__init__.py": "", "kern.py": KERNEL, "other.py": KERNEL}, {"record": ["other.py"]},
     r"PKG/kern.py is not among the sources"),
    ("other module", {"__init__.py": "", "kern.py": KERNEL, "other.py": KERNEL},
     {"record": ["kern.py"], "module": "other"}, r"PKG/other.py is not among the sources"),
    ("package init runs code", {"__init__.py": RUNS, "kern.py": KERNEL}, {"record": ["kern.py"]},
     r"PKG/__init__.py, which importing PKG.kern runs, is not among the sources"),
    ("package init changed", {"__init__.py": RUNS, "kern.py": KERNEL}, {"digests": "stale init"},
     r"PKG/__init__.py differs"),
    ("compiled module first", {"__init__.py": "", "kern.py": KERNEL, "kern.abi3.so": "x"}, {"record": ["kern.py"]},
     r"PKG/kern.abi3.so, not Python source"),
    ("not found", {"__init__.py": "", "kern.py": KERNEL}, {"module": "nowhere"}, r"cannot find PKG.nowhere"),
])
def test_the_jit_fallback_refuses_source_that_is_not_what_the_bundle_recorded(jit, case, files, kwargs, error):
    digests = kwargs.pop("digests", None)
    lib, package_dir, package = jit(files, **kwargs)
    recorded = lib.bundles[0].failed[0]["source"]
    if digests == "stale":
        (package_dir / "kern.py").write_text(KERNEL + "# changed\n")
    elif digests == "extra":
        recorded["digests"][f"{package}/helper.py"] = "0" * 64
    elif digests == "stale init":
        (package_dir / "__init__.py").write_text(RUNS + "# changed\n")
    elif digests is not None:
        recorded["digests"] = digests
    with pytest.raises(LaunchError, match=error.replace("PKG", package)) as raised:
        jit_load(lib)
    assert "\n" not in str(raised.value)
    assert package not in sys.modules and not list(package_dir.glob("*.ran")), "it ran unchecked code"


def test_the_jit_fallback_does_not_import_python_s_own_modules(jit):
    """Digests prove the bytes, not where they come from: the stdlib's files are known to anyone."""
    import sysconfig
    lib, _, _ = jit({"__init__.py": "", "kern.py": KERNEL})
    this = os.path.join(sysconfig.get_paths()["stdlib"], "this.py")   # prints the Zen of Python when run
    with open(this, "rb") as f:
        lib.bundles[0].failed[0]["source"] = {"module": "this", "entry": "s",
                                               "digests": {"this.py": hashlib.sha256(f.read()).hexdigest()}}
    sys.modules.pop("this", None)
    with pytest.raises(LaunchError, match="inside Python's installation"):
        jit_load(lib)
    assert "this" not in sys.modules


def test_a_checked_module_that_fails_to_import_is_a_launch_error(jit):
    lib, _, package = jit({"__init__.py": "", "kern.py": "import kforge_no_such_module\n"})
    with pytest.raises(LaunchError, match=f"{package}.kern could not be imported .*kforge_no_such_module"):
        jit_load(lib)


def test_the_jit_fallback_does_not_import_a_package_shadowing_the_checkout(jit, tmp_path):
    """Python imports the first `package` on sys.path: a checked copy behind it does not make it safe."""
    lib, package_dir, package = jit({"__init__.py": "", "kern.py": KERNEL})
    shadow = tmp_path / "shadow"
    (shadow / package).mkdir(parents=True)
    (shadow / package / "__init__.py").write_text(RUNS)
    sys.path.insert(0, str(shadow))
    with pytest.raises(LaunchError, match=f"cannot find {package}.kern"):
        jit_load(lib)
    assert package not in sys.modules and not list((shadow / package).glob("*.ran"))


class FakeTensor:
    def __init__(self, address, dtype="torch.bfloat16", is_cuda=True):
        self.address, self.dtype, self.is_cuda = address, dtype, is_cuda

    def data_ptr(self):
        return self.address


def _arguments(**entry):
    from kforge_runtime.launch import Arguments
    return Arguments({"target": "gemm:x@sm_90a", "divisible_by_16": ["a_ptr", "K"], "threads_per_block": 256,
                      "shared": 0, "signature": [{"name": "a_ptr", "type": "*bf16"}, {"name": "K", "type": "i32"},
                                                 {"name": "scale", "type": "fp32"}], **entry})


def test_launch_arguments_fill_the_kernel_params_array():
    import ctypes
    args = _arguments()
    params = args.pack((FakeTensor(4096), 64, 0.5))
    assert len(params) == 5   # the signature, then Triton's global and profile scratch pointers (null)
    assert ctypes.c_void_p.from_address(params[0]).value == 4096
    assert ctypes.c_int32.from_address(params[1]).value == 64
    assert ctypes.c_float.from_address(params[2]).value == 0.5
    assert ctypes.c_void_p.from_address(params[3]).value is None   # null scratch pointers
    assert ctypes.c_void_p.from_address(params[4]).value is None
    params = args.pack((8192, 32, 2.0))   # a raw address; the same slots, refilled
    assert ctypes.c_void_p.from_address(params[0]).value == 8192
    assert ctypes.c_int32.from_address(params[1]).value == 32


def test_global_scratch_memory_is_asked_of_tritons_allocator_for_every_program_and_passed_in_its_slot():
    """A kernel that makes tensor descriptors on the GPU writes them into global scratch memory: each launch asks
    the allocator set with triton.set_allocator for size x programs at the kernel's alignment on the launch's
    stream, as Triton's launcher does, and passes its address as the first scratch pointer (the profiler's stays
    null); with no allocator set, Triton's own error."""
    import ctypes

    import triton
    args = _arguments(global_scratch_size=256, global_scratch_align=64)
    params = args.pack((FakeTensor(4096), 64, 0.5))
    asked = []
    triton.set_allocator(lambda size, align, stream: asked.append((size, align, stream)) or FakeTensor(1 << 20))
    try:
        buffer = args.scratch(12, stream=77)
    finally:
        triton.set_allocator(triton.runtime._allocation.NullAllocator())
    assert asked == [(12 * 256, 64, 77)] and buffer.data_ptr() == 1 << 20
    assert ctypes.c_void_p.from_address(params[3]).value == 1 << 20
    assert ctypes.c_void_p.from_address(params[4]).value is None
    assert _arguments().scratch(12, stream=77) is None   # a kernel that needs none asks for none
    with pytest.raises(LaunchError, match="the allocator failed .* no allocator was set. Use triton.set_allocator"):
        args.scratch(12, stream=77)
    from kforge_runtime import launch   # without Triton (bench/gpu_check.py): the loader's own, asked first
    launch.set_allocator(lambda size, align, stream: asked.append((size, align, stream)) or FakeTensor(8 << 20))
    try:
        args.scratch(3, stream=0)
    finally:
        launch.set_allocator(None)
    assert asked[-1] == (3 * 256, 64, 0) and ctypes.c_void_p.from_address(params[3]).value == 8 << 20
    # memory the GPU cannot reach (an allocator that made a CPU tensor), or no address: refused as Triton refuses it
    for address, reaches in ((8 << 20, lambda a: False), (-1, None), (None, None), (0, None), (True, None)):
        launch.set_allocator(lambda size, align, stream: FakeTensor(address))
        try:
            with pytest.raises(LaunchError, match="scratch memory .* cannot be accessed by the GPU"):
                args.scratch(3, stream=0, reaches=reaches)
        finally:
            launch.set_allocator(None)
    for allocator in (lambda size, align, stream: None, lambda size: FakeTensor(1 << 20)):   # no data_ptr, a TypeError
        launch.set_allocator(allocator)
        try:
            with pytest.raises(LaunchError, match="the allocator failed to give 768 bytes of global scratch memory"):
                args.scratch(3, stream=0)
        finally:
            launch.set_allocator(None)
    with pytest.raises(LaunchError, match="'global_scratch_align' must be a whole number in"):
        _arguments(global_scratch_size=256, global_scratch_align=0)   # a bundle is untrusted
    with pytest.raises(LaunchError, match="'profile_scratch_size' must be a whole number in"):
        _arguments(profile_scratch_size="0")


def test_a_bool_argument_and_a_bool_tensor_are_passed_as_tritons_u1():
    """Triton types a bool argument "u1" (a uint8_t parameter) and a torch.bool tensor "*u1"."""
    import ctypes
    args = _arguments(signature=[{"name": "mask_ptr", "type": "*u1"}, {"name": "flip", "type": "u1"}],
                      divisible_by_16=[])
    params = args.pack((FakeTensor(4096, dtype="torch.bool"), True))
    assert ctypes.c_void_p.from_address(params[0]).value == 4096
    assert ctypes.c_uint8.from_address(params[1]).value == 1
    assert ctypes.c_uint8.from_address(args.pack((FakeTensor(4096, dtype="torch.bool"), False))[1]).value == 0
    with pytest.raises(TypeError, match="argument mask_ptr is \\*u1, got a torch.uint8 tensor"):
        args.pack((FakeTensor(4096, dtype="torch.uint8"), True))


def test_a_launch_breaking_the_binarys_divisibility_promise_is_refused():
    args = _arguments()
    with pytest.raises(ValueError, match="argument K must be 16-divisible .* value is 40"):
        args.pack((FakeTensor(4096), 40, 1.0))
    with pytest.raises(ValueError, match="argument a_ptr must be 16-divisible .* address is 4098"):
        args.pack((FakeTensor(4098), 64, 1.0))


def test_launch_arguments_of_the_wrong_kind_are_refused():
    from kforge_runtime.launch import LaunchError
    args = _arguments()
    with pytest.raises(TypeError, match="argument a_ptr is \\*bf16, got a torch.float32 tensor"):
        args.pack((FakeTensor(4096, dtype="torch.float32"), 64, 1.0))
    args.pack((FakeTensor(4096), 64, 1.0))   # bf16 is checked once and remembered...
    with pytest.raises(TypeError, match="argument a_ptr is \\*bf16, got a torch.float32 tensor"):
        args.pack((FakeTensor(4096, dtype="torch.float32"), 64, 1.0))   # ...another dtype still is checked
    with pytest.raises(TypeError, match="a_ptr is a CPU tensor"):
        args.pack((FakeTensor(4096, is_cuda=False), 64, 1.0))
    with pytest.raises(TypeError, match=r"takes \(a_ptr, K, scale\), got 2 arguments"):
        args.pack((FakeTensor(4096), 64))
    with pytest.raises(LaunchError, match="argument b has type f8, which this loader cannot pass"):
        _arguments(signature=[{"name": "b", "type": "f8"}])


def test_launch_options_become_the_attributes_triton_s_launcher_sets():
    """A binary compiled with launch_pdl, launch_cooperative_grid or num_ctas > 1 must be launched with them
    (cuLaunchKernelEx): without, a programmatic dependent launch loses its overlap and a grid sync can hang."""
    import ctypes
    from kforge_runtime import launch
    assert launch.launch_attributes({"num_warps": 4}, "nvidia", "k") == []   # cuLaunchKernel, as before
    assert launch.launch_attributes({"launch_pdl": True}, "nvidia", "k") == [(6, (1,))]
    assert launch.launch_attributes({"launch_cooperative_grid": True, "num_ctas": 2}, "nvidia", "k") == [
        (2, (1,)), (4, (2, 1, 1)), (5, (1,))]
    with pytest.raises(LaunchError, match="k: compiled with .*launch_pdl.* on NVIDIA only"):
        launch.launch_attributes({"launch_pdl": True}, "amd", "k")
    with pytest.raises(LaunchError, match="k: the manifest's launch options .* rebuild the bundle"):
        launch.launch_attributes({"launch_pdl": "yes"}, "nvidia", "k")
    with pytest.raises(LaunchError, match="k: the manifest's launch options"):
        launch.launch_attributes({"num_ctas": 99}, "nvidia", "k")
    # cuda.h's layouts: CUlaunchAttribute is an id padded to 8 bytes and a 64-byte union; CUlaunchConfig 56 bytes
    assert ctypes.sizeof(launch.LaunchAttribute) == 72 and launch.LaunchAttribute.value.offset == 8
    assert ctypes.alignment(launch.LaunchAttribute) == 8
    assert ctypes.sizeof(launch.LaunchConfig) == 56
    assert (launch.LaunchConfig.hStream.offset, launch.LaunchConfig.attrs.offset,
            launch.LaunchConfig.numAttrs.offset) == (32, 40, 48)


def test_a_launch_with_options_fills_the_config_per_call_and_refuses_a_grid_its_fields_would_wrap():
    """cuLaunchKernelEx's config holds C unsigned ints: a grid past CUDA's limits is a LaunchError, not a
    silently smaller grid; a cluster kernel's x is its grid x times the CTAs a cluster, as Triton launches it."""
    import ctypes
    from kforge_runtime import launch
    kernel = launch.Kernel.__new__(launch.Kernel)   # no driver here: the call it would make is recorded
    kernel.name, kernel._ctas, kernel._func = "k", 2, ctypes.c_void_p(0)
    kernel._config = launch.LaunchConfig(blockDimX=128, blockDimY=1, blockDimZ=1)
    calls = []

    def launch_ex(config, func, params, extra):
        c = config._obj
        calls.append((c.gridDimX, c.gridDimY, c.gridDimZ, c.hStream, c.blockDimX))
        return 0
    kernel._launch_ex = launch_ex
    assert kernel._submit(3, 4, 5, 1234, None) == 0
    assert calls == [(6, 4, 5, 1234, 128)]
    for grid in ((1 << 30, 1, 1), (1, 1 << 16, 1), (0, 1, 1)):
        with pytest.raises(LaunchError, match=r"k: grid .* outside CUDA's limits"):
            kernel._submit(*grid, 0, None)
    assert len(calls) == 1


def test_a_vendor_that_is_not_the_archs_is_refused_before_any_driver_is_chosen(dist, tmp_path):
    """The vendor picks the driver: an sm_90a bundle saying amd would hand a cubin to HIP."""
    d = unpacked(dist, "sm_90a", tmp_path)
    for vendor in ("amd", "foo"):
        edit_manifest(d, lambda m: m.update(vendor=vendor))
        with pytest.raises(BundleError, match=rf"arch 'sm_90a' with vendor '{vendor}' is not an arch this loader "
                                              rf"knows with its vendor \(sm_80: nvidia"):
            Bundle(d)


def test_entries_that_find_refuses_never_crash_selection_by_shape_or_the_serving_index(dist, tmp_path):
    """A list as config_id, an int as an artifact, an int as arch, constexprs as a string: each entry is passed over
    where every entry is read at once (the shape's candidates, serve's index), and refused by name where picked."""
    from kforge_runtime.select import NoTunedConfig
    from kforge_runtime.serve import entry_identity
    d = unpacked(dist, "sm_90a", tmp_path)
    junk = [7, {"kernel": "scale", "config_id": ["x"]}, {"arch": 5, "source": {"module": "a", "entry": "b"},
                                                          "signature": []}, {"arch": "sm_90a", "constexprs": "ab"}]
    edit_manifest(d, lambda m: m["artifacts"].extend(junk))
    assert [entry_identity(e) for e in junk] == [None] * 4
    with pytest.raises(NoTunedConfig, match="has no tuning table for 'scale'"):
        Bundle(d).find_for_shape("scale", {"n": 1024})


@pytest.mark.parametrize("options", ["x", {"num_ctas": 99}, {"launch_pdl": "yes"}])
def test_launch_options_of_a_crafted_manifest_are_refused_before_the_driver_sees_the_binary(options, monkeypatch):
    from kforge_runtime import launch

    def no_driver(vendor):
        raise AssertionError("the driver was asked for before the options were checked")
    monkeypatch.setattr(launch.Driver, "get", no_driver)
    entry = {"target": "gemm:x@sm_90a", "divisible_by_16": [], "threads_per_block": 256, "shared": 0,
             "signature": [{"name": "a_ptr", "type": "*bf16"}], "toolchain": "triton", "options": options}
    with pytest.raises(launch.LaunchError, match="'options' must be a table|launch options must be"):
        launch.Kernel(entry, b"\x7fELF", "nvidia")


def test_a_target_name_that_is_not_one_line_is_refused_before_it_names_anything(dist):
    from kforge_runtime.launch import LaunchError
    for target in ("evil\nline2", "x" * 100_000, 7):
        with pytest.raises(LaunchError, match="'target' must be the target's name on one line") as raised:
            _arguments(target=target)
        assert len(str(raised.value)) < 200


@pytest.mark.parametrize("field, value", [
    ("signature", [["a_ptr", "*bf16"]]), ("signature", [{"name": "a_ptr"}]), ("signature", "a_ptr"),
    ("divisible_by_16", "a_ptr"), ("divisible_by_16", [3]), ("threads_per_block", 0),
    ("threads_per_block", 4096), ("threads_per_block", "256"), ("shared", -1), ("shared", True)])
def test_launch_fields_of_a_crafted_manifest_are_refused_before_the_driver(field, value):
    """Bundle checks only top-level types; what a launch reads deeper is checked before any driver call."""
    from kforge_runtime.launch import LaunchError
    with pytest.raises(LaunchError, match=f"'{field}'|{field}"):
        _arguments(**{field: value})


def test_trusted_arguments_fill_the_same_slots_and_a_value_out_of_range_is_a_clear_error():
    import ctypes
    args = _arguments()
    params = args.pack_trusted([4098, 40, 0.25])   # unchecked: the caller matched them to the binary
    assert ctypes.c_void_p.from_address(params[0]).value == 4098
    assert ctypes.c_int32.from_address(params[1]).value == 40
    assert ctypes.c_float.from_address(params[2]).value == 0.25
    with pytest.raises(TypeError, match=r"gemm:x@sm_90a: an argument does not fit its type \(a_ptr: \*bf16, K: i32"):
        args.pack((FakeTensor(4096), 2**40, 1.0))


class ThreadContexts:
    """Stands for libcuda: a current context per thread (none in a new thread, as in PyTorch's autograd
    threads), and a module load or launch that fails with CUDA_ERROR_INVALID_CONTEXT where none is current."""

    def __init__(self):
        import threading
        self.current, self.loaded_in, self.launched_in = threading.local(), [], []

    def cuInit(self, flags):
        return 0

    def cuCtxGetCurrent(self, out):
        out._obj.value = getattr(self.current, "ctx", None)
        return 0

    def cuDeviceGet(self, out, ordinal):
        out._obj.value = ordinal
        return 0

    def cuDevicePrimaryCtxRetain(self, out, device):
        out._obj.value = 1000 + device.value
        return 0

    def cuCtxSetCurrent(self, ctx):
        self.current.ctx = ctx.value
        return 0

    def cuModuleLoadData(self, module, image):
        ctx = getattr(self.current, "ctx", None)
        self.loaded_in.append(ctx)
        return 0 if ctx else 201

    def cuModuleGetFunction(self, func, module, name):
        return 0

    def cuLaunchKernel(self, *args):
        ctx = getattr(self.current, "ctx", None)
        self.launched_in.append(ctx)
        return 0 if ctx else 201


def test_a_kernel_loaded_or_launched_in_a_thread_with_no_cuda_context_uses_its_own(monkeypatch):
    """PyTorch runs a backward pass in a thread of its own, where no CUDA call has made a context current: liger's
    served rms_norm backward failed there with cuModuleLoadData's CUDA_ERROR_INVALID_CONTEXT (on an H200)."""
    import threading

    from kforge_runtime import launch
    lib = ThreadContexts()
    driver = object.__new__(launch.Driver)
    driver.vendor, driver.prefix, driver.lib = "nvidia", "cu", lib
    monkeypatch.setattr(launch.Driver, "get", classmethod(lambda cls, vendor: driver))
    entry = {"target": "scale:x@sm_90a", "divisible_by_16": [], "threads_per_block": 128, "shared": 0,
             "signature": [{"name": "x_ptr", "type": "*fp32"}], "toolchain": "triton", "symbol": "scale"}
    kernels = []
    loader = threading.Thread(target=lambda: kernels.append(launch.Kernel(entry, b"\x7fELF", "nvidia", device=1)))
    loader.start()
    loader.join()
    assert lib.loaded_in == [1001]   # the primary context of the device it was asked to load on
    launcher = threading.Thread(target=lambda: kernels[0].launch_trusted(1, 1, 1, 0, [0]))
    launcher.start()
    launcher.join()
    assert lib.launched_in == [None, 1001]   # refused with no context, then launched in the kernel's own


def test_a_kernel_asks_the_driver_whether_the_gpu_reaches_an_address_as_tritons_launcher_does(monkeypatch):
    """Kernel.reaches: cuPointerGetAttribute(DEVICE_POINTER) refusing the address (CUDA_ERROR_INVALID_VALUE: pageable
    host memory) is the one no; pinned memory and null (an empty tensor's) reach."""
    from kforge_runtime import launch

    class Pointers(ThreadContexts):
        def cuPointerGetAttribute(self, data, attribute, address):
            asked.append((attribute, address.value))
            return 0 if address.value == 0x7000 else 1
    asked, lib = [], Pointers()
    driver = object.__new__(launch.Driver)
    driver.vendor, driver.prefix, driver.lib = "nvidia", "cu", lib
    monkeypatch.setattr(launch.Driver, "get", classmethod(lambda cls, vendor: driver))
    lib.current.ctx = 1001
    entry = {"target": "scale:x@sm_90a", "divisible_by_16": [], "threads_per_block": 128, "shared": 0,
             "signature": [{"name": "x_ptr", "type": "*fp32"}], "toolchain": "triton", "symbol": "scale"}
    kernel = launch.Kernel(entry, b"\x7fELF", "nvidia")
    assert kernel.reaches(0x7000) and not kernel.reaches(0x5000) and kernel.reaches(0)
    assert asked == [(3, 0x7000), (3, 0x5000)]


def hand_bundle(folder, **more):
    """A bundle directory whose manifest.json holds no artifact, and `more`: no build."""
    folder.mkdir(parents=True)
    manifest = {"format": "kforge-bundle", "format_version": 1, "arch": "sm_90a", "vendor": "nvidia",
                "artifacts": [], "failed": [], **more}
    write_manifest(folder, json.dumps(manifest))
    return folder


@pytest.mark.parametrize("autotune", [[1], [{"kernel": "scale", "key": [1]}], {"kernel": "scale"}])
def test_an_autotune_list_of_the_wrong_shape_is_one_bundle_error_naming_the_manifest(tmp_path, autotune):
    """bundle.py 201: reachable from an altered or foreign wheel, never run in the whole suite's coverage."""
    d = hand_bundle(tmp_path / "b", autotune=autotune)
    with pytest.raises(BundleError) as e:
        Bundle(d)
    assert str(e.value) == (f"{d}: manifest.json: 'autotune' must be a list of {{kernel, key, config}}; rebuild it "
                            f"with `doit package`")


def test_a_tuning_table_that_does_not_match_its_sha256_is_one_bundle_error_naming_it(tmp_path):
    """bundle.py 108: reachable from an altered wheel, never run in the whole suite's coverage."""
    d = hand_bundle(tmp_path / "b", tuned={"scale": {"path": "tune/scale.json", "sha256": "0" * 64}})
    (d / "tune").mkdir()
    (d / "tune" / "scale.json").write_text("{}")
    with pytest.raises(BundleError) as e:
        Bundle(d).tuned("scale")
    assert str(e.value) == (f"{d}: tune/scale.json does not match its sha256 in the manifest; reinstall or rebuild "
                            f"the bundle")


def test_a_renamed_wheel_is_one_bundle_error_naming_the_file_and_the_fix(tmp_path):
    """library.py 83 (a wheel whose file name names another arch than its manifest): reachable by renaming or
    hand-copying a wheel, never run in the whole suite's coverage. (Library's tests live here, beside Bundle's.)"""
    d = hand_bundle(tmp_path / "b" / "kforge_kernels_sm_90a")
    renamed = tmp_path / "dist" / "kforge_kernels_sm_80-0.1.0-py3-none-any.whl"
    renamed.parent.mkdir()
    with zipfile.ZipFile(renamed, "w") as zf:
        zf.write(d / "manifest.json", "kforge_kernels_sm_90a/manifest.json")
        zf.write(d / "manifest.sha256", "kforge_kernels_sm_90a/manifest.sha256")
    with pytest.raises(BundleError) as e:
        Library(tmp_path / "dist").bundles_for(["sm_80"])
    assert str(e.value) == (f"{renamed}: the name says sm_80, its manifest says sm_90a; was it renamed? Use the file "
                            f"`doit package` wrote")


def test_a_manifest_edited_after_packaging_is_refused_before_any_entry_is_read(dist, tmp_path):
    """Hostile review, round three: an entry pointed at another of the bundle's binaries (its sha256 and size with
    it) passed every binary check and was served for the first entry's calls; a wheel whose manifest was so edited
    likewise. The manifest is proven by its digest, which `doit package` writes beside it."""
    d = unpacked(dist, "sm_90a", tmp_path / "u")
    m = json.loads((d / "manifest.json").read_text())
    first, other = m["artifacts"][:2]
    first.update(binary=other["binary"], sha256=other["sha256"], size=other["size"])
    (d / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(BundleError) as e:
        Bundle(d)
    assert str(e.value) == (f"{d}: manifest.json does not match its manifest.sha256: the bundle was altered after "
                            f"`doit package` wrote it, or by a kforge before the digest; refused: package it again "
                            f"(`doit package`)")
    altered = tmp_path / "w" / wheel(dist, "sm_90a").name
    altered.parent.mkdir()
    with zipfile.ZipFile(wheel(dist, "sm_90a")) as zi, zipfile.ZipFile(altered, "w") as zo:
        for info in zi.infolist():
            zo.writestr(info, (d / "manifest.json").read_bytes() if info.filename.endswith("/manifest.json")
                        else zi.read(info))
    with pytest.raises(BundleError, match="manifest.json does not match its manifest.sha256"):
        Library(altered.parent).select("scale", first["config_id"], arch="sm_90a")
    (d / "manifest.sha256").unlink()
    with pytest.raises(BundleError, match=r"manifest.json has no manifest.sha256: the bundle was altered"):
        Bundle(d)


def test_a_folder_holding_two_wheels_for_one_arch_is_refused_naming_both(dist, tmp_path):
    """Hostile review, round three: Library(folder) with this build's wheel and an older one for the same arch
    silently picked by the order of their digests (the older code, here and there)."""
    folder = tmp_path / "two"
    folder.mkdir()
    shutil.copy(wheel(dist, "sm_90a"), folder)
    older = folder / "kforge_kernels_sm_90a-0.1.0+000000000000-py3-none-any.whl"
    shutil.copy(wheel(dist, "sm_90a"), older)
    shutil.copy(wheel(dist, "gfx942"), folder)
    with pytest.raises(BundleError) as e:
        Library(folder)
    names = ", ".join(sorted(w.name for w in folder.glob("kforge_kernels_sm_90a-*.whl")))
    assert str(e.value) == (f"{folder}: 2 bundles for sm_90a ({names}); a folder of wheels holds one per arch, as "
                            f"`doit package` leaves out/dist: remove the others, or name the wheel to load")
    assert Library(wheel(dist, "sm_90a"), older).select("scale", "bf16-b256-w4", arch="sm_90a")   # named: first
