"""rules/declare/triton_options.py: every Triton compile option of the pinned version, checked by value at load and by
arch when targets are made; each one a target sets is in its key and its meta.json."""
import json

import pytest

from kforge.base.errors import SpecError
from kforge.plan.catalog import load_specs
from kforge.plan.targets import build_targets
from kforge.declare.triton_options import OPTIONS, arch_problem, value_problem
from tests.support import doit, make_project, spec_text


def test_the_table_covers_the_pinned_tritons_options_for_both_vendors():
    from triton.backends.amd.compiler import HIPOptions
    from triton.backends.nvidia.compiler import CUDAOptions
    nvidia, amd = set(CUDAOptions.__dataclass_fields__), set(HIPOptions.__dataclass_fields__)
    for name, option in OPTIONS.items():
        assert name in {"nvidia": nvidia, "amd": amd, None: nvidia & amd}[option.vendor], name
    never = {"ir_override", "extern_libs", "ptx_options", "arch", "warp_size", "backend_name", "ptx_version",
             "supported_fp8_dtypes", "deprecated_fp8_dot_operand_dtypes", "allowed_dot_input_precisions",
             "max_num_imprecise_acc_default", "instrumentation_mode"}
    assert (nvidia | amd) - set(OPTIONS) <= never


def test_the_options_a_record_keeps_are_options_a_spec_may_set_and_their_defaults_are_the_pinned_tritons():
    """The record format (kforge_runtime.schema) keeps every option a call can change its binary by, leaving out
    those equal to Triton's defaults: a recorded option must build as a target's, but the two no build honours,
    kept so that a line holding one is refused (and its call never served); a default must be Triton's own."""
    import dataclasses

    from triton.backends.amd.compiler import HIPOptions
    from triton.backends.nvidia.compiler import CUDAOptions

    from kforge_runtime.schema import RECORD_OPTIONS, TRITON_DEFAULTS, TRITON_VENDOR_DEFAULTS
    refused = {"ir_override", "instrumentation_mode"}
    assert set(RECORD_OPTIONS) - refused <= set(OPTIONS) and not refused & set(OPTIONS)
    assert set(TRITON_DEFAULTS) <= set(RECORD_OPTIONS)
    for name, default in TRITON_DEFAULTS.items():
        fields = [f for options in (CUDAOptions, HIPOptions) for f in dataclasses.fields(options) if f.name == name]
        assert fields and all(f.default == default for f in fields), name
    for vendor, options in (("nvidia", CUDAOptions), ("amd", HIPOptions)):
        assert set(TRITON_VENDOR_DEFAULTS[vendor]) == set(RECORD_OPTIONS) - set(TRITON_DEFAULTS)   # the vendor's own
        assert TRITON_VENDOR_DEFAULTS[vendor] == {f.name: f.default for f in dataclasses.fields(options)
                                                  if f.name in TRITON_VENDOR_DEFAULTS[vendor]}


@pytest.mark.parametrize("name, value", [("num_warps", 3), ("num_warps", True), ("num_stages", 9), ("kpack", 3),
                                         ("waves_per_eu", -1), ("matrix_instr_nonkdim", 8), ("maxnreg", 0),
                                         ("schedule_hint", "fast"), ("enable_fp_fusion", 1),
                                         ("default_dot_input_precision", "fp64")])
def test_a_bad_value_says_what_is_allowed(name, value):
    assert "allowed:" in value_problem(name, value)


@pytest.mark.parametrize("value", [None, 1, 256, 65535])
def test_maxnreg_takes_what_ptxas_takes(value):
    """mamba-ssm's Mamba-3 configs say maxnreg=256 (ptxas takes any positive value, at most 255 registers used): its
    five largest families were refused for 16..255; None is a Config's "not set"."""
    assert value_problem("maxnreg", value) is None


def test_per_arch_checks():
    assert arch_problem("waves_per_eu", 2, "nvidia", 32, 90) == "waves_per_eu is an AMD option"
    assert arch_problem("maxnreg", 128, "amd", 64, "gfx942") == "maxnreg is an NVIDIA option"
    assert arch_problem("num_warps", 32, "nvidia", 32, 90) is None
    assert "1024 threads" in arch_problem("num_warps", 32, "amd", 64, "gfx942")
    assert arch_problem("num_ctas", 2, "nvidia", 32, 80) is not None and arch_problem("num_ctas", 2, "nvidia", 32, 90) is None
    assert arch_problem("default_dot_input_precision", "tf32", "amd", 64, "gfx942") is not None


def options_spec(archs, sweep):
    return spec_text(archs=archs).replace("num_warps = [4]", sweep)


def test_an_amd_option_on_an_nvidia_arch_is_refused_at_load_naming_the_config_and_the_fix(tmp_path):
    root = make_project(tmp_path / "p", specs={"scale": options_spec(("sm_90a", "gfx942"),
                                                                     "num_warps = [4]\nwaves_per_eu = [2]")})
    with pytest.raises(SpecError, match=r"specs/scale.toml: config fp16-b256-w4 for sm_90a: waves_per_eu is an AMD "
                                        r"option; set it only where it applies"):
        build_targets(load_specs(root), root, None)


def test_a_bad_option_value_is_refused_at_load(tmp_path):
    root = make_project(tmp_path / "p", specs={"scale": options_spec(("gfx942",), "num_warps = [4]\nkpack = [3]")})
    with pytest.raises(SpecError, match=r"\[sweep\] kpack: got 3; allowed: 1 or 2"):
        load_specs(root)


def test_options_of_both_vendors_build_and_are_in_the_key_and_meta(tmp_path):
    specs = {"scale": options_spec(("sm_90a",), "num_warps = [32]\nmaxnreg = [128]\nenable_fp_fusion = [false]"),
             "amd": options_spec(("gfx942",), "num_warps = [4]\nwaves_per_eu = [0, 2]\nkpack = [2]\n"
                                 "matrix_instr_nonkdim = [16]").replace('name = "scale"', 'name = "amd"').replace(
                                     '-w{num_warps}"', '-w{num_warps}-e{waves_per_eu}"')}
    root = make_project(tmp_path / "p", specs=specs)
    targets = build_targets(load_specs(root), root, None)
    assert len({t.key for t in targets}) == len(targets) == 3
    doit(root, "-n", "2")
    meta = json.loads((root / "out" / "sm_90a" / "scale" / "fp16-b256-w32" / "meta.json").read_text())
    assert meta["num_warps"] == 32 and meta["config"]["maxnreg"] == 128 and meta["config"]["enable_fp_fusion"] is False
    amd = json.loads((root / "out" / "gfx942" / "amd" / "fp16-b256-w4-e2" / "meta.json").read_text())
    assert (amd["config"]["waves_per_eu"], amd["config"]["kpack"], amd["config"]["matrix_instr_nonkdim"]) == (2, 2, 16)
    assert (root / "out" / "gfx942" / "amd" / "fp16-b256-w4-e0" / "meta.json").is_file()


def test_per_arch_values_set_options_and_constexprs_for_one_arch(tmp_path):
    """liger's own choice for cross entropy: 32 warps on Hopper, 16 on AMD (at most 1,024 threads there)."""
    text = options_spec(("sm_90a", "gfx942"), "").replace('id = "{dtype}-b{BLOCK}-w{num_warps}"', 'id = "{dtype}"')
    text = text.replace("BLOCK = [256]\n", "") + "\n[constants]\nBLOCK = 256\n\n[arch.sm_90a]\nnum_warps = 32\n" \
        "\n[arch.gfx942]\nnum_warps = 16\nBLOCK = 512\n"
    root = make_project(tmp_path / "p", specs={"scale": text})
    targets = {t.arch: t for t in build_targets(load_specs(root), root, None)}
    assert dict(targets["sm_90a"].options) == {"num_warps": 32} and dict(targets["sm_90a"].constexprs) == {"BLOCK": 256}
    assert dict(targets["gfx942"].options) == {"num_warps": 16} and dict(targets["gfx942"].constexprs) == {"BLOCK": 512}


@pytest.mark.parametrize("table, message", [
    ("[arch.gfx950]\nnum_warps = 8\n", r"\[arch\] gfx950: .*one of the spec's archs: sm_90a, gfx942"),
    ("[arch.gfx942]\nnum_warps = 3\n", r"\[arch.gfx942\] num_warps: got 3; allowed: a power of two"),
    ("[arch.gfx942]\nBLOCK = 64\n", r"\[arch.gfx942\] BLOCK: also in \[sweep\]; keep one"),
    ("[arch.gfx942]\nnope = 1\n", r"\[arch.gfx942\] nope: not a constexpr or compile option"),
    ("[arch.gfx942]\nnum_warps = 32\n", r"config fp16-b256 for gfx942: num_warps 32 x 64 threads"),
])
def test_a_bad_per_arch_value_is_refused_at_load(tmp_path, table, message):
    text = options_spec(("sm_90a", "gfx942"), "").replace("-w{num_warps}", "") + "\n" + table
    root = make_project(tmp_path / "p", specs={"scale": text})
    with pytest.raises(SpecError, match=message):
        build_targets(load_specs(root), root, None)


DTYPE_KERNEL = '''
import triton
import triton.language as tl


@triton.jit
def cast_kernel(x_ptr, y_ptr, n, OUT: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + i, tl.load(x_ptr + i, mask=i < n).to(OUT).to(tl.float32), mask=i < n)
'''


def test_a_per_arch_table_sets_a_dtype_argument_in_its_canonical_name(tmp_path):
    spec = spec_text(archs=("sm_90a", "gfx942")).replace('entry = "scale_kernel"', 'entry = "cast_kernel"').replace(
        'BLOCK = "constexpr"', 'OUT = "dtype"\nBLOCK = "constexpr"') + '\n[arch.sm_90a]\nOUT = "bfloat16"\n' \
        '\n[arch.gfx942]\nOUT = "fp16"\n'
    root = make_project(tmp_path / "p", specs={"scale": spec}, kernels={"scale": DTYPE_KERNEL})
    found = {t.arch: dict(t.constexprs)["OUT"] for t in build_targets(load_specs(root), root, None)}
    assert found == {"sm_90a": "bf16", "gfx942": "fp16"}
