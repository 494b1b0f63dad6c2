"""rules/load/entry_probe.py with rules/declare/spec.py and rules/plan/targets.py: the autotuner as the library defines it (its
pruning, its own Autotuner subclass, do_not_specialize; a perf_model noted, not applied) and a heuristic's value
pinned by the spec ([override]). The library is tests/tune_library.py."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kforge.base import cpus
from kforge.plan.catalog import Catalog
from kforge.base.errors import SpecError
from tests import observed_library, tune_library
from tests.support import computed_once, doit, make_project, statuses, write_files

SM90_TARGETS = {   # what the library's pruner keeps with H100's shared memory (tests/tune_library.py prune)
    "tune_gemm:m64n64k32-w4s2-K64@sm_90a",      # num_stages 3 rewritten to 2: K=64 has two 32-wide blocks
    "tune_gemm:m128n128k64-w4s1-K64@sm_90a",
    "tune_gemm:m256n256k128-w8s1-K64@sm_90a",   # three configs for K=64: top_k = 2 was not applied
    "tune_gemm:m64n64k32-w4s3-K256@sm_90a",
    "tune_gemm:m128n128k64-w4s4-K256@sm_90a",
}   # not m256n256k128-w8s2-K256 (262,144 bytes of shared memory), nor any 16-warp config (LibTuner's max_warps)


def described(probe, module: str, entry: str, where: str, family: str = "") -> dict:
    """One probe's answer for an entry, as the catalog asks it (describe_together, one probe)."""
    type(probe).describe_together([probe], module, entry, where, family)
    return probe.described[(module, entry)]


@pytest.fixture
def site(tmp_path, monkeypatch):
    found = tune_library.install(tmp_path / "site")
    monkeypatch.syspath_prepend(str(found))
    return found


def load(root):
    return {t.name: t for t in Catalog(root, None, 50_000).load().targets}


TUNED = {   # the library's entry as each test below declares it: spec file -> its text (the family's name: the file's)
    "tune_gemm": tune_library.spec(),
    "tune_gemm_mi300": tune_library.spec("tune_gemm_mi300", "gfx942", tune_library.MI300X_SHARED),
    "tune_gemm_excluded": tune_library.spec("tune_gemm_excluded") + '\n[[exclude]]\nnum_stages = 1\n',
    "tune_gemm_no_k": tune_library.spec("tune_gemm_no_k").replace("K = [64, 256]", "").replace("-K{K}", ""),
    "tune_gemm_swept": (tune_library.spec("tune_gemm_swept").replace("NUM_SMS = 132", "NUM_SMS = [114, 132]")
                        .replace('-K{K}"', '-K{K}-sm{NUM_SMS}"')),
    "tune_gemm_per_arch": (tune_library.spec("tune_gemm_per_arch")
                           .replace('archs = ["sm_90a"]', 'archs = ["sm_90a", "gfx942"]')
                           .replace("[env]", "[arch.gfx942]\nNUM_SMS = 304\n\n[env]")),
    # with the device model off (imported as this CPU-only machine is)
    "tune_gemm_unpinned": tune_library.spec("tune_gemm_unpinned").replace("[override]\nNUM_SMS = 132\n", "").replace(
        "[kernel]\n", "[kernel]\ndevice_model = false\n", 1),
}


def _loaded_with(site: Path, root: Path) -> Catalog:
    """The project at root's catalog, loaded here as a build loads it (keep_going) with the library's site folder
    on sys.path for the load only: the computed_once loads run outside any test's monkeypatch."""
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(site))
        return Catalog(root, None, 50_000).load(keep_going=True)

@pytest.fixture(scope="module")
def tuned(tmp_path_factory) -> dict:
    """Every TUNED spec, one family each, loaded in one catalog (keep_going: a family that does not load is one
    broken entry, as in a build): the probe children import the library once per arch and environment, not once
    per test. {"targets": {family: {target: {arch, options, constexprs, notes}}}, "broken": {spec file: error},
    "imported_here": whether the loading process imported the library}. Once for the run (computed_once)."""
    return computed_once(tmp_path_factory, "entry-probe-tuned", _tuned)


def _tuned(folder: Path) -> dict:
    site = tune_library.install(folder / "site")
    root = make_project(folder / "p", kernels={}, specs=TUNED)
    catalog = _loaded_with(site, root)
    targets: dict[str, dict] = {}
    for t in catalog.targets:
        targets.setdefault(t.kernel, {})[t.name] = {"arch": t.arch, "options": dict(t.options),
                                                     "constexprs": dict(t.constexprs), "notes": dict(t.notes)}
    return {"targets": targets, "broken": {b.path: b.error for b in catalog.broken},
            "imported_here": tune_library.PACKAGE in sys.modules}


def renamed(names, family: str) -> set[str]:
    return {n.replace("tune_gemm:", f"{family}:") for n in names}


def test_a_config_the_librarys_pruner_drops_is_no_target_and_one_it_rewrites_is_built_as_rewritten(tuned):
    targets = {**tuned["targets"]["tune_gemm"], **tuned["targets"]["tune_gemm_mi300"]}
    assert {n for n in targets if n.startswith("tune_gemm:")} == SM90_TARGETS
    assert {n for n in targets if n.startswith("tune_gemm_mi300:")} == {   # 64 KiB of LDS drops more
        "tune_gemm_mi300:m64n64k32-w4s2-K64@gfx942", "tune_gemm_mi300:m128n128k64-w4s1-K64@gfx942",
        "tune_gemm_mi300:m64n64k32-w4s3-K256@gfx942"}
    rewritten = targets["tune_gemm:m64n64k32-w4s2-K64@sm_90a"]
    assert rewritten["options"] == {"num_warps": 4, "num_stages": 2}
    assert rewritten["constexprs"] == {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32, "NUM_SMS": 132, "EVEN_K": True}
    assert targets["tune_gemm:m256n256k128-w8s1-K64@sm_90a"]["constexprs"]["EVEN_K"] is False   # 64 % 128
    notes = rewritten["notes"]
    assert notes["prune"] == "kforge_tunelib.ops.gemm.prune"
    assert (notes["perf_model"], notes["top_k"]) == ("kforge_tunelib.ops.gemm.estimate", "2")
    assert notes["autotuner"] == "kforge_tunelib.ops.gemm.LibTuner(max_warps)"
    assert notes["unspecialized"] == "M (do_not_specialize)"
    assert not tuned["imported_here"]   # asked of a child process, never imported in the catalog's


def test_the_spec_excludes_apply_to_what_the_pruner_keeps(tuned):
    assert set(tuned["targets"]["tune_gemm_excluded"]) == renamed(
        SM90_TARGETS - {"tune_gemm:m128n128k64-w4s1-K64@sm_90a", "tune_gemm:m256n256k128-w8s1-K64@sm_90a"},
        "tune_gemm_excluded")


def test_a_pruner_reading_a_shape_the_spec_does_not_give_is_refused_naming_it(tuned):
    assert "tune_gemm_no_k" not in tuned["targets"]
    error = tuned["broken"]["specs/tune_gemm_no_k.toml"]
    assert re.match(r"^specs/tune_gemm_no_k.toml: the autotuner of kforge_tunelib.ops.gemm.gemm_kernel prunes its "
                    r"configs by 'K', which the spec does not give \(in kforge_tunelib/ops/gemm.py:\d+\); add it to "
                    r"\[constants\] or \[sweep\]", error), error


def test_a_heuristic_the_spec_overrides_is_never_run_and_its_value_is_in_the_key(site, tmp_path):
    """NUM_SMS reads torch.cuda.get_device_properties, which this CPU cannot answer: pinned, it is not asked."""
    root = make_project(tmp_path / "p", kernels={}, specs={"tune_gemm": tune_library.spec()})
    before = load(root)
    assert {dict(t.constexprs)["NUM_SMS"] for t in before.values()} == {132}
    assert dict(next(iter(before.values())).notes)["overrides"] == "NUM_SMS"
    (root / "specs" / "tune_gemm.toml").write_text(tune_library.spec().replace("NUM_SMS = 132", "NUM_SMS = 114"))
    after = load(root)
    assert set(after) == set(before) and all(after[n].key != before[n].key for n in before)


def test_an_override_list_sweeps_the_value_one_config_each(tuned):
    targets = tuned["targets"]["tune_gemm_swept"]
    assert set(targets) == {n.replace("@", f"-sm{s}@") for n in renamed(SM90_TARGETS, "tune_gemm_swept")
                            for s in (114, 132)}
    assert targets["tune_gemm_swept:m64n64k32-w4s3-K256-sm114@sm_90a"]["constexprs"]["NUM_SMS"] == 114


def test_an_override_may_differ_per_arch(tuned):
    sms = {t["arch"]: t["constexprs"]["NUM_SMS"] for t in tuned["targets"]["tune_gemm_per_arch"].values()}
    assert sms == {"sm_90a": 132, "gfx942": 304}


def test_a_heuristic_nobody_pins_that_needs_a_gpu_names_the_line_of_the_library(tuned):
    """With the device model off (imported as this CPU-only machine is), the heuristic's torch.cuda call fails."""
    assert "tune_gemm_unpinned" not in tuned["targets"]
    error = tuned["broken"]["specs/tune_gemm_unpinned.toml"]
    assert re.match(r"specs/tune_gemm_unpinned.toml: heuristic NUM_SMS of kforge_tunelib.ops.gemm.gemm_kernel "
                    r"failed on .*: AssertionError: Torch not compiled with CUDA enabled \(in "
                    r"kforge_tunelib/ops/gemm.py:\d+\); if it needs what the build machine lacks \(a GPU\), pin its "
                    r"value: \[override\] NUM_SMS = ...$", error), error


WRONG = {   # a spec's edit -> what loading it says (after specs/<file>.toml: )
    "constants": (("[override]\nNUM_SMS = 132", "[constants]\nNUM_SMS = 132"),
                  r"NUM_SMS is computed by the entry's @triton.heuristics; to pin its value, give it in \[override\] "
                  r"instead of \[constants\]"),
    "not-a-heuristic": (("NUM_SMS = 132", "NUM_SMS = 132\nBLOCK_M = 64"),
                        r"\[override\] BLOCK_M: not computed by the entry's @triton.heuristics \(it computes NUM_SMS, "
                        r"EVEN_K\)"),
    "empty": (("NUM_SMS = 132", "NUM_SMS = []"), r"\[override\] NUM_SMS: empty list"),
    "arch-without-override": (("[env]", "[arch.sm_90a]\nEVEN_K = true\n\n[env]"),
                              r"\[arch.sm_90a\] EVEN_K: computed by the entry's @triton.heuristics; to pin it on "
                              r"sm_90a, name it in \[override\] too"),
    "divisible-but-unspecialized": (("[override]", "[hints]\ndivisible_by_16 = [\"a_ptr\", \"M\"]\n\n[override]"),
                                    r"\[hints\] divisible_by_16: M is in kforge_tunelib.ops.gemm.gemm_kernel's "
                                    r"@triton.jit\(do_not_specialize=...\): Triton never specializes it on "
                                    r"16-divisibility"),
    # an integer equal to 1 made a constexpr: Triton passes M as a runtime integer whatever its value
    "constexpr-but-unspecialized": (('M = "i32"\nN = "i32"\nK = "i32"\nBLOCK_M = "constexpr"\nBLOCK_N = "constexpr"\n'
                                     'BLOCK_K = "constexpr"\nNUM_SMS = "constexpr"\nEVEN_K = "constexpr"\n',
                                     'M = "constexpr"\nN = "i32"\nK = "i32"\nBLOCK_M = "constexpr"\nBLOCK_N = "constexpr"\n'
                                     'BLOCK_K = "constexpr"\nNUM_SMS = "constexpr"\nEVEN_K = "constexpr"\n\n'
                                     '[constants]\nM = 1\n'),
                                    r"\[signature\] M: a constexpr, but kforge_tunelib.ops.gemm.gemm_kernel's "
                                    r"@triton.jit\(do_not_specialize=...\) names it: Triton passes it as a runtime "
                                    r"integer at every launch"),
}


@pytest.fixture(scope="module")
def wrong_loaded(tmp_path_factory) -> dict[str, str]:
    """Every WRONG spec, one family each, loaded in one catalog (keep_going: each is one broken entry, as in a
    build): the probe imports the library (and torch) once for all of them, not once per case. Spec file ->
    the error its family did not load with. Once for the run: the xdist workers that run these tests share it
    (computed_once)."""
    return computed_once(tmp_path_factory, "entry-probe-wrong", _wrong_loaded)


def _wrong_loaded(folder: Path) -> dict[str, str]:
    site = tune_library.install(folder / "site")
    root = make_project(folder / "p", kernels={}, specs={
        f"tune_gemm_{case}": tune_library.spec(f"tune_gemm_{case.replace('-', '_')}").replace(*edit)
        for case, (edit, _) in WRONG.items()})
    catalog = _loaded_with(site, root)
    return {b.path: b.error for b in catalog.broken}


@pytest.mark.parametrize("case", WRONG)
def test_a_wrong_override_or_hint_is_refused_in_one_line_with_the_fix(wrong_loaded, case):
    error = wrong_loaded[f"specs/tune_gemm_{case}.toml"]
    assert re.match(rf"^specs/tune_gemm_{case}.toml: " + WRONG[case][1], error), error


def test_the_pruned_configs_build_and_doit_info_shows_the_autotuner_and_the_override(site, tmp_path):
    root = make_project(tmp_path / "p", kernels={}, specs={"tune_gemm": tune_library.spec()})
    env = {"PYTHONPATH": str(site)}
    doit(root, "-n", "1", "tune_gemm", env=env)
    assert statuses(root, "built") == SM90_TARGETS
    info = doit(root, "info", "tune_gemm:m64n64k32-w4s2-K64@sm_90a", env=env).stdout
    assert "  overrides: NUM_SMS=132 (given by the spec, in place of the entry's @triton.heuristics)\n" in info
    assert "    configs pruned by kforge_tunelib.ops.gemm.prune (applied" in info
    assert "    perf_model kforge_tunelib.ops.gemm.estimate (noted, not applied" in info
    assert "    top_k 2 (noted, not applied)\n" in info
    assert "    the library's own autotuner kforge_tunelib.ops.gemm.LibTuner(max_warps)\n" in info
    assert "    never specialized by @triton.jit: M (do_not_specialize)\n" in info
    assert "state: up to date" in info


def test_pointer_stand_ins_are_made_only_when_a_rule_reads_a_pointer():
    """A heuristic that reads only the spec's values never imports torch in the probe (1.3 s of CPU a probe); one
    that reads a pointer gets a stand-in tensor of its element type, and a whole view (`{**args}`) holds them all.
    The stand-in answers what the spec gives (its dtype) and refuses what only a launch knows (LaunchOnly)."""
    script = """
import subprocess
import sys
from kforge.load.entry_probe import _Arguments, LaunchOnly
args = _Arguments({"n": 4096, "x_ptr": 7}, {"x_ptr": "fp16", "y_ptr": "bf16"})
assert args["n"] == 4096 and args.get("missing") is None and args["x_ptr"] == 7   # the spec's value stands
assert "torch" not in sys.modules
import torch
y = args["y_ptr"]
assert "y_ptr" in args and isinstance(y, torch.Tensor) and y.dtype == torch.bfloat16 and y is not None
assert (y.element_size(), y.itemsize, y.dtype.itemsize, y.is_floating_point(), y.is_complex()) == (2, 2, 2, True, False)
assert (y == None, y != None) == (False, True)   # as any tensor answers
for read, said in ((lambda: y.shape, "y_ptr.shape: a tensor's shape is"),
                   (lambda: y.size(-1), "y_ptr.size(): a tensor's shape is"),
                   (lambda: y.numel(), "y_ptr.numel()"), (lambda: len(y), "y_ptr.__len__()"),
                   (lambda: y.ndim, "y_ptr.ndim"), (lambda: y.stride(0), "y_ptr.stride()"),
                   (lambda: y.data_ptr(), "y_ptr.data_ptr(): a tensor's address is"),
                   (lambda: y.device, "y_ptr.device: a tensor's device is"), (lambda: y.is_cuda, "y_ptr.is_cuda"),
                   (lambda: y + 1, "y_ptr.add(): a tensor's values, shape and device are"),
                   (lambda: bool(y), "y_ptr.__bool__()"), (lambda: torch.empty_like(y), "y_ptr.empty_like()")):
    try:
        read()
    except LaunchOnly as e:
        assert str(e).startswith("reads " + said) and str(e).endswith(" known only at launch"), str(e)
    else:
        raise AssertionError(said + " answered")
assert "stand-in for y_ptr" in repr(y) and "stand-in for y_ptr" in f"{y}"   # never Tensor's repr (it reads the shape)
assert sorted({**_Arguments({"n": 1}, {"z_ptr": "fp32"})}) == ["n", "z_ptr"]
try:
    _Arguments({}, {})["n"]
except KeyError:
    print("ok")
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "ok", done.stdout + done.stderr


TOGETHER = '''
import os
import time
from pathlib import Path

# every arch's probe child imports this module; each waits here until MEET children have arrived
ARRIVED = Path(__file__).with_name("arrived")
ARRIVED.mkdir(exist_ok=True)
(ARRIVED / str(os.getpid())).touch()
deadline = time.monotonic() + 20
while len(list(ARRIVED.iterdir())) < int(os.environ["MEET"]):
    if time.monotonic() > deadline:
        raise RuntimeError("imported alone: the other archs' children are not importing at the same time")
    time.sleep(0.05)
'''   # then FLAKY's kernel

def probed_spec(name, module, archs, extra=""):
    """A spec of the module's copy_kernel for the archs, fp32; extra: more tables ([env], [arch.<name>.env])."""
    return observed_library.SPEC.format(name=name, module=module, entry="copy_kernel", archs=archs, sweep=extra)


def test_the_archs_children_import_the_module_at_the_same_time(tmp_path, monkeypatch):
    """One child per arch (the device model answers as each arch's GPU), as many asked at once as there are CPUs,
    before any answer is read: the library's import waits until that many children are importing it."""
    meet = min(3, cpus.available())
    if meet < 2:
        pytest.skip("one CPU: the children are asked one at a time")
    (tmp_path / "site" / "together").mkdir(parents=True)
    (tmp_path / "site" / "together" / "__init__.py").write_text(TOGETHER + FLAKY.replace("(32, 4096)", "(64,)"))
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    root = make_project(tmp_path / "p", kernels={}, specs={
        "together": probed_spec("together", "together", '["sm_90a", "sm_100a", "gfx942"]',
                                f'\n[env]\nMEET = "{meet}"\n')})
    targets = load(root).values()
    assert sorted(t.arch for t in targets) == ["gfx942", "sm_100a", "sm_90a"]
    assert all(dict(t.constexprs)["BLOCK"] == 64 for t in targets)


SLEEPY = '''
import os
import time

time.sleep(float(os.environ["SLEEP"]))
'''


def test_catalog_timeout_counts_from_when_the_child_was_asked_not_from_when_its_answer_is_read(tmp_path,
                                                                                           monkeypatch):
    """gfx942's child answers after about 2 s, sm_90a's would after 7: both are asked at once, and sm_90a's is
    stopped at the 6 s limit, though its answer is read only after gfx942's."""
    if cpus.available() < 2:
        pytest.skip("one CPU: the children are asked one at a time")
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sleepy.py").write_text(SLEEPY + FLAKY)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setenv("KFORGE_CATALOG_TIMEOUT", "6")
    root = make_project(tmp_path / "p", kernels={}, specs={"sleepy": probed_spec(
        "sleepy", "sleepy", '["gfx942", "sm_90a"]', '\n[arch.gfx942.env]\nSLEEP = "2"\n\n[arch.sm_90a.env]\nSLEEP = "7"\n')})
    catalog = Catalog(root, None, 50_000).load(keep_going=True)
    assert [b.name for b in catalog.broken] == ["sleepy"] and not catalog.targets
    assert "ran past catalog_timeout (6 s)" in catalog.broken[0].error


FLAKY = '''
import os

import triton
import triton.language as tl

if os.environ.get("FLAKY_FAILS"):
    raise RuntimeError("flaky fails on this arch")


@triton.autotune(configs=[triton.Config({"BLOCK": BLOCK}) for BLOCK in (32, 4096)], key=["n"])
@triton.jit
def copy_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)
'''


def test_an_arch_whose_import_fails_leaves_no_other_archs_answer_to_the_next_family(tmp_path, monkeypatch):
    """gfx942's child fails first while sm_90a's still owes its answer about `flaky`: that child is stopped, so the
    next family asking sm_90a's child about its own module gets its own configs, not flaky's."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "flaky.py").write_text(FLAKY)
    (site / "steady.py").write_text(FLAKY.replace("(32, 4096)", "(128,)").replace("FLAKY_FAILS", "NEVER_SET"))
    monkeypatch.syspath_prepend(str(site))
    root = make_project(tmp_path / "p", kernels={}, specs={
        "a_flaky": probed_spec("a_flaky", "flaky", '["gfx942", "sm_90a"]', '\n[arch.gfx942.env]\nFLAKY_FAILS = "1"\n'),
        "b_steady": probed_spec("b_steady", "steady", '["sm_90a"]')})
    catalog = Catalog(root, None, 50_000).load(keep_going=True)
    assert [(b.name, b.error.split(": ")[0]) for b in catalog.broken] == [("a_flaky", "specs/a_flaky.toml")]
    assert "RuntimeError: flaky fails on this arch" in catalog.broken[0].error
    [steady] = catalog.targets
    assert (steady.kernel, steady.arch, dict(steady.constexprs)["BLOCK"]) == ("b_steady", "sm_90a", 128)


def test_a_module_whose_import_kills_the_probe_is_one_broken_family_and_the_next_family_still_loads(tmp_path,
                                                                                                    monkeypatch):
    site = tmp_path / "site"
    site.mkdir()
    (site / "crashy.py").write_text("import os\nos._exit(7)   # as a crash in a native extension would\n" + FLAKY)
    (site / "steady.py").write_text(FLAKY.replace("(32, 4096)", "(128,)").replace("FLAKY_FAILS", "NEVER_SET"))
    monkeypatch.syspath_prepend(str(site))
    root = make_project(tmp_path / "p", kernels={}, specs={
        "a_crashy": probed_spec("a_crashy", "crashy", '["gfx942", "sm_90a"]'),
        "b_steady": probed_spec("b_steady", "steady", '["sm_90a"]')})
    catalog = Catalog(root, None, 50_000).load(keep_going=True)
    assert [b.line() for b in catalog.broken] == [
        "family a_crashy did not load: specs/a_crashy.toml: importing crashy to read the entry's autotune / heuristics "
        "crashed the probe process; run `python -c 'import crashy'` to see why"]
    assert [(t.kernel, t.arch) for t in catalog.targets] == [("b_steady", "sm_90a")]


def test_what_a_module_writes_to_stdout_outside_python_does_not_reach_the_probes_answers(tmp_path, monkeypatch):
    """A native extension or a subprocess writing to file descriptor 1 at import, a print too: the answers still
    come through."""
    site = tmp_path / "site"
    site.mkdir()
    noisy = 'import os\nos.write(1, b"1\\n{not json\\n")\nprint("hello")\nos.system("echo from a subprocess")\n'
    (site / "noisy.py").write_text(noisy + FLAKY.replace("(32, 4096)", "(256,)"))
    monkeypatch.syspath_prepend(str(site))
    root = make_project(tmp_path / "p", kernels={}, specs={"noisy": probed_spec("noisy", "noisy", '["sm_90a"]')})
    [target] = load(root).values()
    assert dict(target.constexprs)["BLOCK"] == 256


# --- entries a library defines under a module-level if, or builds by calls (issue 53) -------------------------

GUARDED_LIBRARY = {
    "glib/__init__.py": "",
    "glib/ops.py": """
        import triton
        import triton.language as tl


        def has_triton():
            return True


        if has_triton():   # libraries that also run without Triton guard their kernels
            @triton.jit
            def guarded_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
                i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
                tl.store(y_ptr + i, tl.load(x_ptr + i, mask=i < n) * 2, mask=i < n)
        else:
            guarded_kernel = None


        def _scaled(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
            i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            tl.store(y_ptr + i, tl.load(x_ptr + i, mask=i < n) * 3, mask=i < n)


        # built by calls, not decorators
        scaled_kernel = triton.autotune(configs=[triton.Config({"BLOCK": 128}, num_warps=4),
                                                 triton.Config({"BLOCK": 256}, num_warps=4)],
                                        key=["n"])(triton.jit(_scaled))
        """,
}


def test_a_guarded_kernel_and_one_built_by_calls_are_found_and_built_for_both_vendors(tmp_path):
    site = write_files(tmp_path / "site", GUARDED_LIBRARY)
    archs = '["sm_90a", "gfx942"]'
    specs = {name: observed_library.SPEC.format(name=name, module="glib.ops", entry=entry, archs=archs, sweep=sweep)
             for name, entry, sweep in (("g_guarded", "guarded_kernel", "BLOCK = [128]"),
                                        ("g_scaled", "scaled_kernel", ""))}
    root = make_project(tmp_path / "p", specs=specs, kernels={})
    out = doit(root, "-n", "1", env={"PYTHONPATH": str(site)}).stdout
    assert statuses(root, "built") == {"g_guarded:fp32-block128@sm_90a", "g_guarded:fp32-block128@gfx942",
                                       *(f"g_scaled:fp32-block{b}-num_warps4-num_stages3@{a}"
                                         for b in (128, 256) for a in ("sm_90a", "gfx942"))}, out


TWIN = '''
import json, os
import triton
import triton.language as tl

from twin.helper import WARPS
BLOCKS = json.load(open(os.path.join(os.path.dirname(__file__), "{name}.json")))


@triton.autotune(configs=[triton.Config({{"BLOCK": b}}, num_warps=WARPS) for b in BLOCKS], key=["n"])
@triton.jit
def kernel(x_ptr, n, BLOCK: tl.constexpr):
    tl.store(x_ptr + tl.arange(0, BLOCK), tl.arange(0, BLOCK))
'''


def test_each_module_is_probed_in_its_own_process_and_its_family_gets_all_that_process_read(tmp_path, monkeypatch):
    """Two modules of one package share a helper: the second one asked imports it too (in a process forked
    before the first's import), so both families have it among their inputs, and neither has the other's
    config file; a module whose import crashes leaves the others' answers standing."""
    from kforge.load.entry_probe import Probe
    site = write_files(tmp_path / "site", {"twin/__init__.py": "", "twin/helper.py": "WARPS = 4\n",
                                           "twin/one.py": TWIN.format(name="one"), "twin/one.json": "[64]",
                                           "twin/two.py": TWIN.format(name="two"), "twin/two.json": "[128]",
                                           "twin/crash.py": "import os\nos._exit(3)\n",
                                           **{f"twin/more{n}.py": TWIN.format(name="two") for n in range(4)}})
    monkeypatch.syspath_prepend(str(site))
    root = make_project(tmp_path / "p", kernels={}, specs={})
    probe = Probe.of(root)
    try:
        assert described(probe, "twin.one", "kernel", "one", "f_one")["autotune"] == [
            {"BLOCK": 64, "num_warps": 4, "num_stages": 3}]
        with pytest.raises(SpecError, match="importing twin.crash to read .* crashed the probe process"):
            described(probe, "twin.crash", "kernel", "crash", "f_crash")
        assert described(probe, "twin.two", "kernel", "two", "f_two")["autotune"][0]["BLOCK"] == 128
        for n in range(4):   # more modules than a child keeps processes for: twin.one's is ended
            described(probe, f"twin.more{n}", "kernel", "more", f"f_more{n}")
        config = {"BLOCK": 64, "num_warps": 4, "num_stages": 3}   # twin.one again, in a fresh process
        assert probe.prune("twin.one", "kernel", [{"configs": [config], "args": {}, "kwargs": {}, "pointers": {}}],
                           "one", "f_one") == [[config]]
        ops = site / "twin"
        one, two = Probe.reads_of("f_one"), Probe.reads_of("f_two")
        assert {str(ops / f) for f in ("one.py", "one.json", "helper.py", "__init__.py")} <= one
        assert {str(ops / f) for f in ("two.py", "two.json", "helper.py", "__init__.py")} <= two
        assert not {str(ops / f) for f in ("two.py", "two.json", "crash.py")} & one
        assert not {str(ops / f) for f in ("one.py", "one.json", "crash.py")} & two
    finally:
        Probe.close_all()


def test_the_librarys_line_is_added_to_a_probe_message_only_where_the_message_does_not_name_it(tmp_path,
                                                                                                 monkeypatch):
    """A NeedsGPU names `at oslib/_device.py:11 (...)` itself: the probe's `(in ...)` said it a second time."""
    from kforge.load import entry_probe
    (tmp_path / "twice_lib.py").write_text("def fail(message):\n    raise RuntimeError(message)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    import twice_lib
    for message, added in (("a stream at twice_lib.py:2 (`raise`) needs a real GPU", ""),
                           ("no such key", " (in twice_lib.py:2)")):
        with pytest.raises(RuntimeError) as e:
            twice_lib.fail(message)
        assert entry_probe._where(e.value) == added


HEURISTICS_LIB = {
    "kforge_heurlib/__init__.py": "",
    "kforge_heurlib/ops.py": '''
        import triton
        import triton.language as tl


        @triton.autotune(configs=[triton.Config({"BLOCK_K": 128}, num_warps=4),
                                  triton.Config({"BLOCK_K": 32}, num_warps=4)], key=["n"])
        @triton.heuristics({"BLOCK_K": lambda args: min(args["BLOCK_K"], args["GROUP"])})
        @triton.jit
        def tuned_kernel(x_ptr, n, GROUP: tl.constexpr, BLOCK_K: tl.constexpr):
            tl.static_assert(GROUP % BLOCK_K == 0)
            tl.store(x_ptr + tl.arange(0, BLOCK_K), tl.zeros([BLOCK_K], tl.float32))


        @triton.heuristics({"SPLIT": lambda args: 2, "WIDE": lambda args: args["SPLIT"] * 8})
        @triton.heuristics({"SPLIT": lambda args: 4})
        @triton.jit
        def layered_kernel(x_ptr, n, SPLIT: tl.constexpr, WIDE: tl.constexpr):
            tl.store(x_ptr + tl.arange(0, WIDE), tl.zeros([WIDE], tl.float32) + SPLIT)


        @triton.heuristics({"BLOCK_K": lambda args: 16})
        @triton.autotune(configs=[triton.Config({"BLOCK_K": 128})], key=["n"])
        @triton.jit
        def clashing_kernel(x_ptr, n, BLOCK_K: tl.constexpr):
            tl.store(x_ptr + tl.arange(0, BLOCK_K), tl.zeros([BLOCK_K], tl.float32))
    ''',
}


def _heuristics_spec(entry: str, constexprs: str, constants: str = "") -> str:
    return f'''
[kernel]
name = "{entry.replace("_kernel", "")}"
module = "kforge_heurlib.ops"
entry = "{entry}"
toolchain = "triton"
archs = ["sm_90a"]

[signature]
x_ptr = "*fp32"
n = "i32"
{constexprs}

[constants]
{constants}

[sweep]
n = [1024]
'''


@pytest.fixture
def heurlib(tmp_path, monkeypatch):
    from tests.support import write_site_package
    site = write_site_package(tmp_path / "heursite", "kforge_heurlib", HEURISTICS_LIB)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("PYTHONPATH", str(site))
    return site


def test_a_heuristic_under_the_autotuner_rewrites_each_configs_value_as_triton_does(heurlib, tmp_path):
    """Triton's Autotuner passes a config's values to the @heuristics it wraps, which overwrite them (here
    BLOCK_K = min(BLOCK_K, GROUP)): the 128 config launches BLOCK_K = 64; compiling 128 failed its static_assert."""
    root = make_project(tmp_path / "p", kernels={}, specs={"tuned": _heuristics_spec(
        "tuned_kernel", 'GROUP = "constexpr"\nBLOCK_K = "constexpr"', "GROUP = 64")})
    targets = load(root)
    assert sorted(dict(t.constexprs)["BLOCK_K"] for t in targets.values()) == [32, 64]
    assert not any("overrides" in dict(t.notes) for t in targets.values())   # nothing the spec pinned
    doit(root, "-n", "2", "archs=sm_90a")
    assert len(statuses(root, "built")) == 2


def test_stacked_heuristics_run_outermost_first_and_the_inner_value_stands(heurlib, tmp_path):
    """heuristics(A)(heuristics(B)(fn)): Triton runs A's rules, then B's, which see A's values and overwrite
    them: SPLIT = 4 (B's), WIDE = 2 * 8 (A's, computed before B's SPLIT)."""
    root = make_project(tmp_path / "p", kernels={}, specs={"layered": _heuristics_spec(
        "layered_kernel", 'SPLIT = "constexpr"\nWIDE = "constexpr"')})
    (target,) = load(root).values()
    assert dict(target.constexprs) == {"SPLIT": 4, "WIDE": 16}


def test_a_heuristic_over_the_autotuner_setting_a_tuned_value_is_refused_as_triton_fails_at_launch(heurlib, tmp_path):
    root = make_project(tmp_path / "p", kernels={}, specs={"clash": _heuristics_spec(
        "clashing_kernel", 'BLOCK_K = "constexpr"')})
    with pytest.raises(SpecError, match=r"^specs/clash.toml: kforge_heurlib.ops.clashing_kernel: @triton.heuristics "
                                        r"around @triton.autotune sets BLOCK_K, which the autotune configs set too"):
        load(root)


def indented_under(head: str) -> str:
    """FLAKY with its kernel under `head` (a line ending in a colon), indented one step (two spaces)."""
    return FLAKY.replace("@triton.autotune", head + "\n  @triton.autotune").replace(
        "\n@triton.jit\ndef copy_kernel", "\n  @triton.jit\n  def copy_kernel").replace(
        "\n    offs", "\n      offs").replace("\n    tl.store", "\n      tl.store")


ELSEWHERE = {   # modules whose copy_kernel no import holds as the spec names it: module -> its source
    # torchao defines to_mxfp8_dim0_kernel only under sm_100+ (or gfx950)
    "newer": indented_under("from triton.runtime import driver\n\n"
                            "if driver.active.get_current_target().arch >= 100:"),
    # torchao's blockwise_fp8_gemm_kernel is a def inside _build_triton_impls()
    "made": indented_under("def _build():") + "  return copy_kernel\n",
    "held": indented_under("class Ops:"),
    "tuned": FLAKY,   # the two autotune configs under one id
}


@pytest.fixture(scope="module")
def elsewhere_loaded(tmp_path_factory) -> dict:
    """The families of ELSEWHERE's modules loaded in one catalog (keep_going): {"targets": {family: [arch, ...]},
    "broken": {family: error}}. Once for the run (computed_once)."""
    return computed_once(tmp_path_factory, "entry-probe-elsewhere", _elsewhere_loaded)


def _elsewhere_loaded(folder: Path) -> dict:
    (folder / "site").mkdir()
    for module, text in ELSEWHERE.items():
        (folder / "site" / f"{module}.py").write_text(text)
    specs = {"newer": probed_spec("newer", "newer", '["sm_100a"]'),
             "older": probed_spec("older", "newer", '["sm_90a"]'),   # the same module, imported as sm_90a
             "made": probed_spec("made", "made", '["sm_90a"]'), "held": probed_spec("held", "held", '["sm_90a"]'),
             "tuned": probed_spec("tuned", "tuned", '["sm_90a"]').replace('toolchain = "triton"\n',
                                                                          'toolchain = "triton"\nid = "{dtype}"\n')}
    root = make_project(folder / "p", kernels={}, specs=specs)
    catalog = _loaded_with(folder / "site", root)
    targets: dict[str, list] = {}
    for t in catalog.targets:
        targets.setdefault(t.kernel, []).append(t.arch)
    return {"targets": targets, "broken": {b.name: b.error for b in catalog.broken}}


def test_an_entry_the_library_defines_only_on_other_archs_names_the_arch_it_was_imported_as(elsewhere_loaded):
    """torchao defines to_mxfp8_dim0_kernel only under sm_100+ (or gfx950): on sm_90a's model the module has no such
    attribute. The message names the arch the module was imported as, and the two fixes."""
    assert sorted(elsewhere_loaded["targets"]["newer"]) == ["sm_100a", "sm_100a"]
    assert "newer" not in elsewhere_loaded["broken"] and "older" not in elsewhere_loaded["targets"]
    error = elsewhere_loaded["broken"]["older"]
    assert "\n" not in error, error
    assert "AttributeError: module 'newer' has no attribute 'copy_kernel' when imported as sm_90a (" in error
    assert "drop sm_90a from the spec's archs, or give sm_90a a spec of its own" in error, error


def test_an_entry_defined_inside_a_function_says_so_not_that_an_arch_lacks_it(elsewhere_loaded):
    """torchao's blockwise_fp8_gemm_kernel is a def inside _build_triton_impls(): no import holds it, on any arch,
    and the message told the user to drop the arch (an outside review with torchao 0.18.0)."""
    line = ELSEWHERE["made"].splitlines().index("  def copy_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):") + 1
    assert "made" not in elsewhere_loaded["targets"]
    error = elsewhere_loaded["broken"]["made"]
    assert "\n" not in error and "when imported as" not in error, error
    assert ("AttributeError: module 'made' has no attribute 'copy_kernel': its source defines copy_kernel inside "
            f"`_build()` (line {line}), so only a call makes it, not the import; kforge builds the kernels a module holds "
            "once imported") in error, error


def test_an_entry_defined_in_a_class_is_told_its_dotted_name(elsewhere_loaded):
    assert "held" not in elsewhere_loaded["targets"]
    error = elsewhere_loaded["broken"]["held"]
    assert "its source defines copy_kernel in class Ops (line " in error and \
        error.endswith("; name the entry Ops.copy_kernel"), error


def test_autotune_configs_that_share_an_id_are_said_to_come_from_the_autotuner(elsewhere_loaded):
    """The two configs of copy_kernel's @triton.autotune under `id = "{dtype}"` were said to come from [sweep] (an
    outside review with torchao)."""
    assert "tuned" not in elsewhere_loaded["targets"]
    error = elsewhere_loaded["broken"]["tuned"]
    assert "configs {'BLOCK': 32} and {'BLOCK': 4096}" in error and \
        "from [sweep] and the entry's autotune configs both get id 'fp32'" in error, error
    assert sorted(elsewhere_loaded["broken"]) == ["held", "made", "older", "tuned"]   # and nothing else broke


# --- a heuristic or pruner reading what only a launch knows (found by an outside review on xformers) -----------

LAUNCH_ONLY_LIB = {
    "kforge_launchlib/__init__.py": "",
    "kforge_launchlib/ops.py": '''
        import torch
        import triton
        import triton.language as tl


        @triton.jit
        def _body(x_ptr, n, A: tl.constexpr, B: tl.constexpr):
            i = tl.arange(0, A)
            tl.store(x_ptr + i, tl.zeros([A], tl.float32) + B, mask=i < n)


        def _swallowed(args):   # a library's own fallback must not hide the read
            try:
                return triton.next_power_of_2(args["x_ptr"].shape[-1])
            except Exception:
                return 1024


        def _rows(configs, named_args, **kwargs):   # an empty tensor's 0 rows kept only the 64 config
            rows = named_args["x_ptr"].shape[0]
            return [c for c in configs if c.kwargs["A"] <= max(rows, 64)]


        shape_kernel = triton.heuristics({"A": lambda args: max(128, triton.next_power_of_2(args["x_ptr"].shape[-1])),
                                          "B": lambda args: 1})(_body)
        numel_kernel = triton.heuristics({"A": lambda args: 128,
                                          "B": lambda args: args["x_ptr"].numel() % 1024 == 0})(_body)
        swallowed_kernel = triton.heuristics({"A": _swallowed, "B": lambda args: 1})(_body)
        dtype_kernel = triton.heuristics({   # what the spec gives answers as at launch
            "A": lambda args: args["x_ptr"].element_size() * 32 + args["x_ptr"].dtype.itemsize,
            "B": lambda args: (isinstance(args["x_ptr"], torch.Tensor) and args["x_ptr"] is not None
                               and args.get("y_ptr") is None and args["x_ptr"].dtype == torch.float32
                               and args["x_ptr"].is_floating_point())})(_body)
        pruned_kernel = triton.autotune(configs=[triton.Config({"A": 64, "B": 1}), triton.Config({"A": 128, "B": 1})],
                                        key=["n"], prune_configs_by={"early_config_prune": _rows})(_body)
    ''',
}


@pytest.fixture(scope="module")
def launch_only_loaded(tmp_path_factory) -> list[dict]:
    """Each LAUNCH_ONLY_LIB kernel as one family, loaded in one catalog (keep_going; the probe imports the library
    once): [{broken spec file: its error}, {family: the constexprs of its targets}]. Once for the run: the xdist
    workers that run these tests share it (computed_once)."""
    return computed_once(tmp_path_factory, "entry-probe-launch-only", _launch_only_loaded)


def _launch_only_loaded(folder: Path) -> list[dict]:
    from tests.support import write_site_package
    site = write_site_package(folder / "site", "kforge_launchlib", LAUNCH_ONLY_LIB)
    specs = {name: _heuristics_spec(f"{name}_kernel", 'A = "constexpr"\nB = "constexpr"').replace(
        "kforge_heurlib.ops", "kforge_launchlib.ops") for name in ("shape", "numel", "swallowed", "dtype", "pruned")}
    root = make_project(folder / "p", kernels={}, specs=specs)
    catalog = _loaded_with(site, root)
    built: dict[str, list] = {}
    for t in catalog.targets:
        built.setdefault(t.kernel, []).append(dict(t.constexprs))
    return [{b.path: b.error for b in catalog.broken}, built]


HEURISTIC_LAUNCH_ONLY = (": a tensor's shape is known only at launch, and kforge builds before it (a spec gives a "
                         "pointer argument its dtype, nothing more); pin the value to build: [override] {} = ...")


@pytest.mark.parametrize("family, heuristic, read", [("shape", "A", "x_ptr.shape"), ("numel", "B", "x_ptr.numel()"),
                                                     ("swallowed", "A", "x_ptr.shape")])
def test_a_heuristic_reading_a_tensors_shape_is_refused_naming_the_read_and_the_pin(launch_only_loaded, family,
                                                                                     heuristic, read):
    """Each pointer argument was an empty meta tensor: shape (0,), numel 0, and kforge built A = 128, B = True where
    Triton launches an (8, 4104) tensor with A = 8192, B = False. Now the read is refused (a library's own `except
    Exception` fallback around it included), in one line naming the heuristic, the read, its line and the pin."""
    broken, built = launch_only_loaded
    assert family not in built
    error = broken[f"specs/{family}.toml"]
    assert re.fullmatch(rf"specs/{family}.toml: heuristic {heuristic} of kforge_launchlib.ops.{family}_kernel reads "
                        rf"{re.escape(read)} \(in kforge_launchlib/ops.py:\d+\)"
                        + re.escape(HEURISTIC_LAUNCH_ONLY.format(heuristic)), error), error


def test_a_pruner_reading_a_tensors_shape_is_refused_as_needing_launch_time_tensors(launch_only_loaded):
    broken, built = launch_only_loaded
    assert "pruned" not in built
    error = broken["specs/pruned.toml"]
    assert re.fullmatch(r"specs/pruned.toml: the autotuner of kforge_launchlib.ops.pruned_kernel prunes its configs by "
                        r"x_ptr.shape \(in kforge_launchlib/ops.py:\d+\): a tensor's shape is known only at launch, "
                        r"and kforge builds before it .*: this pruner needs launch-time tensors, and kforge cannot "
                        r"prune these configs as a launch would", error), error


def test_a_heuristic_reading_a_tensors_dtype_isinstance_or_none_still_answers_as_at_launch(launch_only_loaded):
    broken, built = launch_only_loaded
    assert "specs/dtype.toml" not in broken
    assert built["dtype"] == [{"A": 4 * 32 + 4, "B": True}]


CRASHING = '''
import os
import signal
import triton
import triton.language as tl
CRASH


@triton.autotune(configs=[triton.Config({"BLOCK": 64})], key=["n"])
@triton.jit
def tuned_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + i, tl.load(x_ptr + i, mask=i < n), mask=i < n)
'''


@pytest.mark.parametrize("crash", ["os.kill(os.getpid(), signal.SIGSEGV)"])   # os._exit: the test above
def test_a_module_whose_import_kills_the_probe_is_one_line_naming_it_and_how_to_see_why(tmp_path, crash):
    """entry_probe.py 162-163 and 172-173 (the probe child killed by a signal importing the module, as a segfault
    in a native extension: no reply): load_spec directly, one probe child, no build."""
    from kforge.declare.spec import load_spec
    from kforge.load.entry_probe import Probe
    from tests.support import spec_text
    text = spec_text().replace("scale_kernel", "tuned_kernel").replace('id = "{dtype}-b{BLOCK}-w{num_warps}"\n', "")
    root = make_project(tmp_path, specs={"s": text.split("BLOCK = [")[0]},
                        kernels={"scale": CRASHING.replace("CRASH", crash)})
    try:
        with pytest.raises(SpecError) as e:
            load_spec(root / "specs" / "s.toml", root)
    finally:
        Probe.close_all()
    assert str(e.value) == ("specs/s.toml: importing tk.scale to read the entry's autotune / heuristics crashed the "
                            "probe process; run `python -c 'import tk.scale'` to see why")


def test_a_probe_child_gone_before_it_reads_the_request_is_the_same_one_line(tmp_path):
    """entry_probe.py 147-148: the child died between the liveness check and the write (a race no input forces:
    a stand-in child whose pipe is broken)."""
    from types import SimpleNamespace
    from kforge.load.entry_probe import Probe

    def broken(text):
        raise BrokenPipeError(32, "Broken pipe")
    probe = Probe(tmp_path)
    probe.child = SimpleNamespace(poll=lambda: None, stdin=SimpleNamespace(write=broken))
    probe.close = lambda: setattr(probe, "child", None)   # nothing was started: nothing to stop
    with pytest.raises(SpecError) as e:
        described(probe, "tk.scale", "tuned_kernel", "specs/s.toml")
    assert str(e.value) == ("specs/s.toml: importing tk.scale to read the entry's autotune / heuristics crashed the "
                            "probe process; run `python -c 'import tk.scale'` to see why")
    assert probe.child is None


# --- what a pruner is given (an outside review on gemlite) ---------------------------------------------------------

POSITIONAL = '''
import triton
import triton.language as tl


def by_n(configs, nargs, **kwargs):   # gemlite's pruners: N read from nargs, as its launch passes it positionally
    return [c for c in configs if c.kwargs["BLOCK"] <= nargs["N"] and c.kwargs["BLOCK"] <= kwargs["N"]]


@triton.autotune(configs=[triton.Config({"BLOCK": 64}), triton.Config({"BLOCK": 8192})], key=["N"],
                 prune_configs_by={"early_config_prune": by_n})
@triton.jit
def kernel(x_ptr, N: tl.constexpr, BLOCK: tl.constexpr):
    tl.store(x_ptr + tl.arange(0, BLOCK), tl.arange(0, BLOCK))
'''


def test_a_pruner_finds_the_specs_constexprs_in_nargs_and_in_kwargs_as_either_launch_would_give_them(tmp_path,
                                                                                                      monkeypatch):
    """A launch passes a constexpr positionally (Triton's nargs) or by name (kwargs); which, only the library's code
    says. The spec's N was given in kwargs alone, and gemlite's nine matmul kernels, whose pruners read nargs["N"],
    were refused as pruning by a value the spec does not give. kforge gives both (this pruner reads both to show
    it; no one launch would give it both)."""
    from kforge.load import entry_probe
    write_files(tmp_path, {"positional_lib.py": POSITIONAL})
    monkeypatch.syspath_prepend(str(tmp_path))
    configs = [{"BLOCK": 64, "num_warps": 4, "num_stages": 3}, {"BLOCK": 8192, "num_warps": 4, "num_stages": 3}]
    assert entry_probe._prune("positional_lib", "kernel", [
        {"configs": configs, "args": {}, "kwargs": {"N": 4096}, "pointers": {"x_ptr": "fp32"}}]) == {
        "kept": [[configs[0]]]}


VENDOR_CONFIGS = '''
import triton
import triton.language as tl
IS_HIP = triton.runtime.driver.active.get_current_target().backend == "hip"
CONFIGS = [triton.Config({"BLOCK": 64, "WIDE": 1})] if IS_HIP else [triton.Config({"BLOCK": 64})]


@triton.autotune(configs=CONFIGS + [triton.Config({**c.kwargs, "BLOCK": 128}) for c in CONFIGS], key=["n"])
@triton.jit
def copy_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr, WIDE: tl.constexpr = 0):
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + o, tl.load(x_ptr + o, mask=o < n) * (WIDE + 1), mask=o < n)
'''
COPY_SPEC = ('[kernel]\nname = "copy"\nsource = "tk/vk.py"\nentry = "copy_kernel"\ntoolchain = "triton"\n'
             'archs = ["sm_80", "sm_90a", "gfx942"]\n\n[signature]\nx_ptr = "*{dtype}"\ny_ptr = "*{dtype}"\n'
             'n = "i32"\nBLOCK = "constexpr"\n\n[sweep]\ndtype = ["fp32"]\n')


def refusal(root) -> str:
    """The one line loading the project's specs/copy.toml is refused with (its probes closed after)."""
    from kforge.declare.spec import load_spec
    from kforge.load.entry_probe import Probe
    try:
        with pytest.raises(SpecError) as e:
            load_spec(root / "specs" / "copy.toml", root)
    finally:
        Probe.close_all()
    return str(e.value)


def test_autotune_configs_that_set_other_parameters_per_vendor_name_the_archs_and_one_spec_per_vendor(tmp_path):
    """AMD's configs set a constexpr NVIDIA's leave to its default: refused naming the two parameter lists, the
    archs each came from and the fix (a spec per vendor)."""
    spec = COPY_SPEC.replace('BLOCK = "constexpr"\n', 'BLOCK = "constexpr"\nWIDE = "constexpr"\n')
    root = make_project(tmp_path, specs={"copy": spec}, kernels={"vk": VENDOR_CONFIGS})
    assert refusal(root) == (
        "specs/copy.toml: tk.vk.copy_kernel's @triton.autotune configs set different parameters on different archs "
        "(['BLOCK', 'num_stages', 'num_warps'] on sm_80, sm_90a; ['BLOCK', 'WIDE', 'num_stages', "
        "'num_warps'] on gfx942); kforge sweeps configs that set the same ones: give each side a spec of its "
        'own, one per vendor (archs = ["sm_80", "sm_90a"] and archs = ["gfx942"])')


def copy_library(configs: str, pruner: str = "") -> str:
    """A test library's autotuned copy kernel: `configs` (Python) defines CONFIGS, `pruner` the autotuner's
    prune_configs_by argument, if any."""
    return (f"import triton\nimport triton.language as tl\n{configs}\n\n\n"
            f"@triton.autotune(configs=CONFIGS, key=[\"n\"]{', prune_configs_by=' + pruner if pruner else ''})\n"
            "@triton.jit\ndef copy_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):\n"
            "    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)\n"
            "    tl.store(y_ptr + o, tl.load(x_ptr + o, mask=o < n), mask=o < n)\n")


IS_HIP = 'IS_HIP = triton.runtime.driver.active.get_current_target().backend == "hip"\n'
OPTION_CONFIGS = copy_library(IS_HIP + '''
CONFIGS = ([triton.Config({"BLOCK": b, "waves_per_eu": 2}) for b in (64, 128)] if IS_HIP else
           [triton.Config({"BLOCK": b}, num_warps=4, maxnreg=r) for b in (64, 128) for r in (None, 128)])''')


def test_autotune_configs_leaving_a_triton_option_unset_take_its_default_and_each_vendor_drops_the_others(tmp_path):
    """mamba-ssm's configs sweep maxnreg over [None, 128, 256] (None: not set), gemlite's AMD configs add
    waves_per_eu: each was a family refused for configs setting different parameters. A config leaving an option
    unset has Triton's default for it; another vendor's option is dropped on an arch, as Triton's backend drops it
    (an AMD config's maxnreg, NVIDIA's waves_per_eu), so that two configs differing only there are one binary."""
    root = make_project(tmp_path, specs={"copy": COPY_SPEC}, kernels={"vk": OPTION_CONFIGS})
    targets = load(root)
    options = {name: dict(t.options) for name, t in targets.items()}
    nvidia = {n: o for n, o in options.items() if not n.endswith("@gfx942")}
    assert len(nvidia) == 8 and {n.split("@")[0] for n in nvidia} == {
        f"copy:fp32-block{b}-num_warps4-num_stages3-maxnreg{r}-waves_per_eu0" for b in (64, 128) for r in ("None", 128)}
    assert all(o == {"num_warps": 4, "num_stages": 3, **({"maxnreg": 128} if "maxnreg128" in n else {})}
               for n, o in nvidia.items())
    amd = {n: o for n, o in options.items() if n.endswith("@gfx942")}
    assert set(amd) == {f"copy:fp32-block{b}-num_warps4-num_stages3-maxnregNone-waves_per_eu2@gfx942"
                        for b in (64, 128)}
    assert all(o == {"num_warps": 4, "num_stages": 3, "waves_per_eu": 2} for o in amd.values())
    assert len({t.key for t in targets.values()}) == len(targets)


SPELLED_CONFIGS = copy_library(IS_HIP + '''
CONFIGS = ([triton.Config({"BLOCK": 64, "waves_per_eu": w}) for w in (0, 2)] if IS_HIP else
           [triton.Config({"BLOCK": 64}), triton.Config({"BLOCK": 128}, maxnreg=128)])''')


def test_a_config_one_vendor_spells_with_the_default_and_the_other_leaves_unset_is_one_built_for_both(tmp_path):
    """AMD's configs spell waves_per_eu=0 where NVIDIA's leave it out: once filled they are one config, built on
    every arch that lists either (every target of each vendor was lost: each was excluded on the other's archs)."""
    targets = load(make_project(tmp_path, specs={"copy": COPY_SPEC}, kernels={"vk": SPELLED_CONFIGS}))
    built = {(t.arch, dict(t.config)["BLOCK"], dict(t.config)["waves_per_eu"], dict(t.config)["maxnreg"])
             for t in targets.values()}
    assert built == {*((a, 64, 0, None) for a in ("sm_80", "sm_90a", "gfx942")), ("gfx942", 64, 2, None),
                     *((a, 128, 0, 128) for a in ("sm_80", "sm_90a"))}


def test_an_extra_config_giving_another_vendors_option_is_refused_not_dropped(tmp_path):
    """The review of the fix: an [[extra]] giving waves_per_eu=2 for sm_90a was dropped silently (a binary Triton's
    launch never makes there, under its own id); only a default the library's config left unset is dropped."""
    spec = (COPY_SPEC + '\n[[extra]]\ndtype = "fp32"\nBLOCK = 256\nnum_warps = 4\nnum_stages = 3\nmaxnreg = 128\n'
            'waves_per_eu = 2\n\n[[exclude]]\nBLOCK = 256\narch = ["gfx942"]\n')
    with pytest.raises(SpecError, match=r"config fp32-block256\S* for sm_80: waves_per_eu is an AMD option"):
        load(make_project(tmp_path, specs={"copy": spec}, kernels={"vk": SPELLED_CONFIGS}))


FOREIGN_CONFIGS = '''
def keep(configs, named_args, **kwargs):
    return configs


CONFIGS = [triton.Config({"BLOCK": 64}), triton.Config({"BLOCK": 128}, maxnreg=128)]'''


def test_a_config_setting_another_vendors_option_fails_the_family_there_unless_a_pruner_may_drop_it(tmp_path):
    """mamba-ssm lists maxnreg=128 on every vendor: Triton's launch on gfx942 refuses the keyword (KeyError in
    JITFunction._pack_args), so every call there fails and the family is refused naming the arch; with a pruner,
    which may drop that config there, the config is no target on gfx942 and the others are."""
    spec = COPY_SPEC.replace('"sm_80", "sm_90a", "gfx942"', '"sm_90a", "gfx942"')
    root = make_project(tmp_path / "a", specs={"copy": spec}, kernels={"vk": copy_library(FOREIGN_CONFIGS)})
    assert refusal(root) == (
        "specs/copy.toml: tk.vk.copy_kernel's @triton.autotune configs listed on gfx942 set maxnreg, an option of "
        "another vendor that Triton's launch refuses there (the kernel's every call on gfx942 fails): drop gfx942 "
        "from archs, or give that vendor a spec of its own")
    pruned = copy_library(FOREIGN_CONFIGS, pruner='{"early_config_prune": keep}')
    targets = load(make_project(tmp_path / "b", specs={"copy": spec}, kernels={"vk": pruned}))
    assert {(t.arch, dict(t.config)["BLOCK"], dict(t.options).get("maxnreg")) for t in targets.values()} == {
        ("sm_90a", 64, None), ("sm_90a", 128, 128), ("gfx942", 64, None)}


KEYWORD_PRUNER = '''
import triton
import triton.language as tl


def prune(configs, nargs, **kwargs):
    return [c for c in configs if c.kwargs["BLOCK"] <= 64 or kwargs["big"]]


@triton.autotune(configs=[triton.Config({"BLOCK": 64}), triton.Config({"BLOCK": 128})], key=["n"],
                 prune_configs_by={"early_config_prune": prune})
@triton.jit
def copy_kernel(x_ptr, y_ptr, n, big, BLOCK: tl.constexpr):
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + o, tl.load(x_ptr + o, mask=o < n), mask=o < n)
'''


def test_a_pruner_reading_a_runtime_argument_from_its_kwargs_gets_the_specs_shape_hint(tmp_path):
    """gemlite's pruners read kwargs['load_scales_as_block'], a runtime argument its launch passes by keyword:
    given as a shape hint, the pruner found it only in nargs, and the family was refused as pruning by a value
    'the spec does not give' (which launch passes it by keyword, only the library's launch says)."""
    from kforge.declare.spec import load_spec
    from kforge.load.entry_probe import Probe
    from kforge.plan.targets import build_targets
    spec = ('[kernel]\nname = "copy"\nsource = "tk/kp.py"\nentry = "copy_kernel"\ntoolchain = "triton"\n'
            'archs = ["sm_90a"]\n\n[signature]\nx_ptr = "*{dtype}"\ny_ptr = "*{dtype}"\nn = "i32"\nbig = "i32"\n'
            'BLOCK = "constexpr"\n\n[constants]\nbig = 0\n\n[sweep]\ndtype = ["fp32"]\n')
    root = make_project(tmp_path, specs={"copy": spec}, kernels={"kp": KEYWORD_PRUNER})
    try:
        targets = build_targets([load_spec(root / "specs" / "copy.toml", root)], root, None)
    finally:
        Probe.close_all()
    assert [dict(t.constexprs)["BLOCK"] for t in targets] == [64]


ECHO = '''
import triton
import triton.language as tl


@triton.heuristics({"GRAD": lambda args: args["GRAD"], "EVEN": lambda args: args["n"] % 64 == 0})
@triton.jit
def kernel(x_ptr, n, GRAD: tl.constexpr, EVEN: tl.constexpr):
    tl.store(x_ptr + tl.arange(0, 64), tl.arange(0, 64))
'''


def test_a_heuristic_keeping_a_value_the_launch_passes_names_override_as_the_fix(tmp_path, monkeypatch):
    """cut-cross-entropy's `"REQUIRES_GRAD": lambda args: args["REQUIRES_GRAD"]`: the line said to add it to
    [constants] or [sweep], and each of those refuses a heuristic's name; [override] is the one that builds (an
    outside review). A value no heuristic computes keeps the old fix."""
    from kforge.load import entry_probe
    write_files(tmp_path, {"echo_lib.py": ECHO})
    monkeypatch.syspath_prepend(str(tmp_path))
    kept = entry_probe._heuristics("echo_lib", "kernel", [{"n": 128}], [{}], [])["error"]
    assert kept == ("heuristic GRAD of echo_lib.kernel reads 'GRAD', which the spec does not give; give it in "
                    "[override] (GRAD = [...]): a heuristic computes it, so [constants] and [sweep] cannot")
    shape = entry_probe._heuristics("echo_lib", "kernel", [{}], [{}], ["GRAD"])["error"]
    assert shape.endswith("reads 'n', which the spec does not give; add it to [constants] or [sweep] (a runtime "
                          "argument counts as a shape hint there)")


NAMED_ONLY = POSITIONAL.replace("def by_n(configs, nargs, **kwargs):", "def by_n(configs, nargs, N=None):").replace(
    'and c.kwargs["BLOCK"] <= kwargs["N"]', 'and c.kwargs["BLOCK"] <= N')


def test_a_pruner_taking_no_kwargs_gets_only_the_names_it_takes(tmp_path, monkeypatch):
    """A pruner without **kwargs works in Triton when the library's launch passes by name only what it names; kforge
    gave it every value the spec gives, and it failed on one it does not take (TypeError)."""
    from kforge.load import entry_probe
    assert "**kwargs" not in NAMED_ONLY
    write_files(tmp_path, {"named_only_lib.py": NAMED_ONLY})
    monkeypatch.syspath_prepend(str(tmp_path))
    configs = [{"BLOCK": 64, "num_warps": 4, "num_stages": 3}, {"BLOCK": 8192, "num_warps": 4, "num_stages": 3}]
    assert entry_probe._prune("named_only_lib", "kernel", [
        {"configs": configs, "args": {"m": 7}, "kwargs": {"N": 4096, "OTHER": 1}, "pointers": {"x_ptr": "fp32"}}]) == {
        "kept": [[configs[0]]]}
