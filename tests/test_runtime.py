"""The runtime loader on CPU: opening bundles, refusing tampered ones, and picking the artifact to launch."""
import json
import shutil
import sys
import zipfile

import pytest

from kforge_runtime import Bundle, BundleError, Library, NoMatchingKernel
from kforge_runtime import library as library_module
from kforge_runtime.device import cuda_archs
from tests.support import doit, make_project, spec_text

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
    path = bundle_dir / "manifest.json"
    m = json.loads(path.read_text())
    change(m)
    path.write_text(json.dumps(m))


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
    with pytest.raises(BundleError, match="sha256 .* the bundle was altered"):
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
    (d / "manifest.json").write_text("{not json")
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


class FakeTensor:
    def __init__(self, address, dtype="torch.bfloat16", is_cuda=True):
        self.address, self.dtype, self.is_cuda = address, dtype, is_cuda

    def data_ptr(self):
        return self.address


def _arguments(**entry):
    from kforge_runtime.launch import Arguments
    return Arguments({"target": "gemm:x@sm_90a", "divisible_by_16": ["a_ptr", "K"],
                      "signature": [{"name": "a_ptr", "type": "*bf16"}, {"name": "K", "type": "i32"},
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
