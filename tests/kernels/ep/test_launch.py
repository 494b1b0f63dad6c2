"""The op's kernels are ordinary kforge targets: specs/ep_*.toml name the functions the op launches, and their
[constants], and the compile options their sweeps fix, are what its JIT path uses (read from the specs)."""
from kernels.ep import launch
from kforge.plan.catalog import load_specs
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


FLAG_FAMILIES = ("ep_combine", "ep_barrier", "ep_dispatch_done")   # release stores
STORE_FAMILIES = FLAG_FAMILIES + ("ep_dispatch",)   # STORE_SIGNAL: PTX stores (and loads) on NVIDIA
CHAINED_FAMILIES = ("ep_route", "ep_dispatch", "ep_dispatch_done")


def test_the_jit_takes_the_arch_values_of_the_device_it_runs_on():
    """The flags (combine's arrivals, the barriers' signals) and the tagged counts are PTX stores on NVIDIA, atomics
    elsewhere: the JIT compiles what the bundle of the device's arch holds ([arch.<name>] over [constants])."""
    specs = {s.name: s for s in load_specs(REPO)}
    for family in STORE_FAMILIES:
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


def _sm90a_ptx(specs, family: str, **config) -> str:
    """The kernel's PTX body for sm_90a as its bundle builds it (spec constants, the arch's table, a config)."""
    import triton
    from triton.backends.compiler import GPUTarget
    spec = specs[family]
    table = {**dict(spec.constants), **spec.on_arch("sm_90a"), **config}
    signature = {n: t.replace("{dtype}", table.get("dtype", "bf16")) for n, t in spec.signature}
    constexprs = {n: table[n] for n, t in spec.signature if t == "constexpr"}
    source = triton.compiler.ASTSource(fn=launch.FAMILIES[family], signature=signature, constexprs=constexprs)
    ptx = triton.compile(source, target=GPUTarget("cuda", 90, 32)).asm["ptx"]
    return ptx[ptx.index(".entry"):]


def test_on_sm_90a_each_chained_kernel_waits_before_touching_memory_and_the_flags_are_release_stores():
    """What the spec tables promise, in the code the bundle holds: griddepcontrol.wait before the first global
    access of every kernel launched early, and the PTX release store as the barriers' and arrivals' signal."""
    import re
    specs = {s.name: s for s in load_specs(REPO)}
    configs = {"ep_route": {"W": 2, "K": 8}, "ep_dispatch_done": {"W": 2},
               "ep_dispatch": {"W": 2, "K": 8, "HAS_W": True, "HAS_SCALES": False}, "ep_barrier": {"W": 2},
               "ep_combine": {"W": 2}}
    for family, config in configs.items():
        body = _sm90a_ptx(specs, family, **config)
        memory = re.search(r"\b(ld|st|atom|red)\.(?!param)", body).start()   # the first access past the params
        if family in CHAINED_FAMILIES:
            assert body.find("griddepcontrol.wait") in range(0, memory), family
        else:
            assert "griddepcontrol" not in body, family
        assert ("st.release.sys.global.s64" in body) == (family in FLAG_FAMILIES), family   # int64 epochs
        # the tagged counts: relaxed 8-byte stores, no exchange awaiting a reply, polled by acquire loads
        assert ("st.relaxed.sys.global.b64" in body) == (family == "ep_dispatch"), family
        assert ("ld.acquire.sys.global.b64" in body) == (family == "ep_dispatch"), family
        assert ".exch." not in body, family
