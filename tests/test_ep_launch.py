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


FLAG_FAMILIES = ("ep_combine", "ep_barrier", "ep_dispatch_done")
CHAINED_FAMILIES = ("ep_route", "ep_exchange_counts", "ep_dispatch", "ep_dispatch_done")


def test_the_jit_takes_the_arch_values_of_the_device_it_runs_on():
    """The flags (combine's arrivals, the barriers' signals) are PTX stores on NVIDIA, atomics elsewhere: the JIT
    compiles what the bundle of the device's arch holds ([arch.<name>] over [constants])."""
    specs = {s.name: s for s in load_specs(REPO)}
    for family in FLAG_FAMILIES:
        assert launch.CONSTANTS[family]["STORE_SIGNAL"] is False, family
        assert launch.arch_constants(family, ["sm_90a", "sm_90", "sm_80"])["STORE_SIGNAL"] is True
        assert launch.arch_constants(family, ["sm_86a", "sm_86", "sm_85", "sm_84", "sm_83", "sm_82", "sm_81",
                                              "sm_80"]) == {"STORE_SIGNAL": True}   # an A10 runs sm_80's binary
        assert launch.arch_constants(family, ["gfx942"]) == {}
        for arch in specs[family].archs:
            assert specs[family].on_arch(arch).get("STORE_SIGNAL", False) == arch.startswith("sm_"), (family, arch)


def test_dispatch_s_kernels_wait_for_the_one_before_exactly_where_they_are_launched_early():
    """launch_pdl lets a kernel start before the one before it ends; only a kernel compiled with PDL waits for it
    (griddepcontrol, sm_90 and later) before touching memory. One without the other is a race or a wasted
    launch, so the two go together, per arch."""
    specs = {s.name: s for s in load_specs(REPO)}
    for family in CHAINED_FAMILIES:
        assert launch.CONSTANTS[family]["PDL"] is False, family
        for arch in specs[family].archs:
            table = specs[family].on_arch(arch)
            chained = arch in ("sm_90a", "sm_100a")
            assert table.get("PDL", False) is chained and table.get("launch_pdl", False) is chained, (family, arch)
            assert launch.arch_constants(family, [arch]).get("launch_pdl", False) is chained, (family, arch)
    for family in set(launch.FAMILIES) - set(CHAINED_FAMILIES):   # the rest are launched plainly
        assert all("launch_pdl" not in specs[family].on_arch(a) for a in specs[family].archs), family
