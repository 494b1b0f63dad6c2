"""The op's kernels are ordinary kforge targets: specs/ep_*.toml name the functions the op launches, and their
[constants], and the compile options their sweeps fix, are what its JIT path uses (read from the specs)."""
from kernels.ep import launch
from kforge.edge.dodo_tasks import load_specs
from tests.support import REPO


def test_every_op_kernel_has_a_spec_with_the_same_entry_and_constants():
    specs = {s.name: s for s in load_specs(REPO)}
    for family, fn in launch.FAMILIES.items():
        spec = specs[family]
        assert spec.entry == fn.fn.__name__ and spec.source == "kernels/ep/triton_kernels.py"
        configs = [dict(c) for c in spec.configs]
        fixed = {k: v for k, v in configs[0].items() if k in launch.COMPILE_OPTIONS}
        assert all(c[k] == v for c in configs for k, v in fixed.items())   # one value each
        assert {**dict(spec.constants), **fixed} == launch.CONSTANTS.get(family, {})


def test_dispatch_finds_tokens_in_the_blocks_route_made():
    assert launch.CONSTANTS["ep_dispatch"]["BLOCK_T"] == launch.CONSTANTS["ep_route"]["BLOCK_T"]


def test_the_jit_takes_the_arch_values_of_the_device_it_runs_on():
    """combine's arrival signal is a PTX store on NVIDIA, an atomic elsewhere: the JIT compiles what the bundle of
    the device's arch holds ([arch.<name>] over [constants])."""
    assert launch.CONSTANTS["ep_combine"]["STORE_SIGNAL"] is False
    assert launch.arch_constants("ep_combine", ["sm_90a", "sm_90", "sm_80"]) == {"STORE_SIGNAL": True}
    assert launch.arch_constants("ep_combine", ["sm_86a", "sm_86", "sm_85", "sm_84", "sm_83", "sm_82", "sm_81",
                                                "sm_80"]) == {"STORE_SIGNAL": True}   # an A10 runs sm_80's binary
    assert launch.arch_constants("ep_combine", ["gfx942"]) == {}
    specs = {s.name: s for s in load_specs(REPO)}
    for arch in specs["ep_combine"].archs:
        assert specs["ep_combine"].on_arch(arch).get("STORE_SIGNAL", False) == arch.startswith("sm_"), arch
