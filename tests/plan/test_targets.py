"""Action keys: each input that changes a binary changes exactly the keys of the targets it feeds."""
import json
import os
import shutil

import pytest

from kforge.plan import keys
from kforge_runtime import schema
from kforge.declare.spec import load_spec
from kforge.plan.targets import build_targets
from tests.support import REPO, WARPS_KERNEL, doit, kernel_text, make_project, spec_text


def keys_of(root) -> dict[str, str]:
    keys.toolchain_fingerprint.cache_clear()
    specs = [load_spec(p, root) for p in sorted((root / "specs").glob("*.toml"))]
    return {t.name: t.key for t in build_targets(specs, root, None)}


@pytest.fixture
def project(tmp_path):
    return make_project(tmp_path, specs={"scale": spec_text(archs=("sm_90a", "gfx942"), blocks=(128, 256))})


def changed(before: dict, after: dict) -> set[str]:
    return {n for n in before.keys() | after.keys() if before.get(n) != after.get(n)}


def test_keys_are_stable(project):
    assert keys_of(project) == keys_of(project)


def test_touch_changes_nothing(project):
    before = keys_of(project)
    os.utime(project / "tk" / "scale.py", (1, 1))
    assert keys_of(project) == before


def test_editing_one_config_value_changes_only_that_config(project):
    before = keys_of(project)
    spec = project / "specs" / "scale.toml"
    spec.write_text(spec.read_text().replace("BLOCK = [128, 256]", "BLOCK = [128, 512]"))
    assert changed(before, keys_of(project)) == {
        "scale:fp16-b256-w4@sm_90a", "scale:fp16-b256-w4@gfx942",     # gone
        "scale:fp16-b512-w4@sm_90a", "scale:fp16-b512-w4@gfx942"}     # new


def test_source_and_imported_module_changes_rebuild_all_their_targets(project):
    (project / "tk" / "helper.py").write_text("SCALE = 2\n")
    (project / "tk" / "scale.py").write_text(kernel_text(imports="from tk import helper"))
    before = keys_of(project)
    (project / "tk" / "helper.py").write_text("SCALE = 3\n")
    assert changed(before, keys_of(project)) == set(before)


def test_a_package_init_the_import_runs_is_a_source_of_its_targets(project):
    """Importing tk.scale runs tk/__init__.py: editing it changes what the compile sees."""
    before = keys_of(project)
    (project / "tk" / "__init__.py").write_text("import os  # now it runs something\n")
    assert changed(before, keys_of(project)) == set(before)


def test_dtype_is_in_the_key_by_canonical_name(tmp_path):
    root = make_project(tmp_path, specs={"scale": spec_text(dtypes=("fp16", "bf16"))})
    k = keys_of(root)
    assert k["scale:fp16-b256-w4@sm_90a"] != k["scale:bf16-b256-w4@sm_90a"]
    spec = root / "specs" / "scale.toml"
    spec.write_text(spec.read_text().replace('"bf16"', '"bfloat16"'))
    assert keys_of(root)["scale:bf16-b256-w4@sm_90a"] == k["scale:bf16-b256-w4@sm_90a"]


def test_bool_and_int_constexprs_are_different_keys(tmp_path):
    """`FLAG = true` and `FLAG = 1` in a spec's [constants] compile differently in Triton: different keys."""
    kernel = kernel_text().replace("BLOCK: tl.constexpr):", "BLOCK: tl.constexpr, FLAG: tl.constexpr):")
    spec = spec_text().replace('BLOCK = "constexpr"', 'BLOCK = "constexpr"\nFLAG = "constexpr"') + "\n[constants]\nFLAG = VALUE\n"
    root = make_project(tmp_path, specs={"scale": spec.replace("VALUE", "true")}, kernels={"scale": kernel})
    as_bool = keys_of(root)
    (root / "specs" / "scale.toml").write_text(spec.replace("VALUE", "1"))
    as_int = keys_of(root)
    assert as_bool.keys() == as_int.keys() == {"scale:fp16-b256-w4@sm_90a"}
    assert as_bool != as_int
    (root / "specs" / "scale.toml").write_text(spec.replace("VALUE", "true"))
    assert keys_of(root) == as_bool


def test_toolchain_schema_and_env_change_every_key(project, monkeypatch):
    before = keys_of(project)
    monkeypatch.setenv("TRITON_F32_DEFAULT", "ieee")
    assert changed(before, keys_of(project)) == set(before)
    monkeypatch.delenv("TRITON_F32_DEFAULT")
    monkeypatch.setattr(schema, "ARTIFACT_SCHEMA", schema.ARTIFACT_SCHEMA + 1)
    assert changed(before, keys_of(project)) == set(before)
    monkeypatch.undo()
    monkeypatch.setattr(keys, "package_version", lambda dist: "9.9.9")
    assert changed(before, keys_of(project)) == set(before)


def test_listing_the_targets_writes_only_the_catalog_it_loaded(project):
    """Generating tasks builds nothing: `doit list` leaves out/ holding doit's own database and the catalog it
    loaded (kept so that the next `doit list`, `info` or build does not load the specs again), no artifact."""
    out = project / "out"
    shutil.rmtree(out, ignore_errors=True)
    doit(project, "list", "--all")
    written = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert written[:2] == [".doit.sqlite3", ".kforge/catalog.json"] and len(written) == 3
    assert written[2].startswith(".kforge/catalogs/") and written[2].endswith("-all.json")


def test_ptxas_version_is_in_nvidia_keys_only(project, monkeypatch):
    before = keys_of(project)
    monkeypatch.setattr(keys.ToolVersions, "__call__", lambda self, tool: "ptxas 99.0")
    assert changed(before, keys_of(project)) == {n for n in before if n.endswith("@sm_90a")}


def test_the_catalog_s_descriptor_kernels_name_each_descriptor_s_block_from_the_config():
    """specs/tma_matmul.toml: tensordesc<{dtype}[{BLOCK_K}, {BLOCK_N}]> in canonical spelling, per config."""
    from pathlib import Path
    root = REPO
    targets = build_targets([load_spec(root / "specs" / "tma_matmul.toml", root)], root, None)
    by_name = {t.name: dict(t.signature) for t in targets}
    assert {t.arch for t in targets} == {"sm_90a", "sm_100a"} and len(targets) == 8
    assert by_name["tma_matmul:fp16-m128n128k64-w8s3@sm_100a"] == {
        "a_desc": "tensordesc<fp16[128, 64]>", "b_desc": "tensordesc<fp16[64, 128]>",
        "c_desc": "tensordesc<fp16[128, 128]>", "K": "i32", "BLOCK_M": "constexpr", "BLOCK_N": "constexpr",
        "BLOCK_K": "constexpr"}


class _Pruner:
    """An entry probe whose autotuner's pruner keeps the given configs (rules/plan/targets.py _pruned)."""
    def __init__(self, kept):
        self.kept = kept

    def prune(self, module, entry, requests, path, name):
        return [self.kept for _ in requests]


@pytest.mark.parametrize("kept, said", [
    ([{"BLOCK": "a b", "num_warps": 4}],
     r"config .* from the autotuner's pruner on sm_90a gets the id 'fp16-ba b-w4', which is not a safe name; ids "
     r"may hold letters, digits"),
    ([{"BLOCK": 256, "num_warps": 4}, {"BLOCK": "256", "num_warps": 4}],
     r"configs .* and .* from the autotuner's pruner on sm_90a both get id 'fp16-b256-w4'; add the differing"),
])
def test_a_config_the_pruner_rewrites_gets_the_sweeps_id_checks_and_words(tmp_path, kept, said):
    """The pruner's configs were never checked with the sweep: their ids are checked as the sweep's are, and the
    message says the same rule (what a safe name holds) and where the configs came from."""
    import dataclasses
    from kforge.base.errors import SpecError
    from kforge.plan.targets import _pruned
    root = make_project(tmp_path, specs={"s": spec_text()})
    spec = dataclasses.replace(load_spec(root / "specs" / "s.toml", root), tuned=("BLOCK", "num_warps"))
    with pytest.raises(SpecError, match=rf"^specs/s.toml: {said}") as error:
        _pruned(spec, "sm_90a", list(spec.configs.on("sm_90a")), _Pruner(kept), "scale")
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("helper, said", [("FACTOR = (\n", "tk/helper.py:1, a module its source imports, is not "
                                                         "Python kforge can read ('(' was never closed)"),
                                          ("FACTOR = " + "-" * 3000 + "1\n", "tk/helper.py, a module its source "
                                           "imports, is not Python kforge can read (nested too deeply")])
def test_a_module_the_kernel_imports_that_does_not_parse_is_one_line_naming_it(tmp_path, helper, said):
    """A helper module the kernel imports that does not parse was a SyntaxError traceback from `doit list` (the
    kernel's own source was checked when its spec loaded, its imports were not)."""
    root = make_project(tmp_path / "p", specs={"scale": spec_text()},
                        kernels={"scale": kernel_text(factor="FACTOR", imports="from tk.helper import FACTOR"),
                                 "helper": helper})
    proc = doit(root, "list", check=False)
    assert f"specs/scale.toml: kernel scale: {said}" in proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr



def test_a_constexpr_named_as_a_compile_option_is_the_option_too(tmp_path):
    """kernel[grid](..., num_warps=32) on a kernel with a `num_warps: tl.constexpr` parameter (liger's sparsemax):
    Triton's JIT binds the value to the parameter and compiles with it as the option (parse_options takes every
    keyword); the build gave the constexpr alone and compiled 4 warps (found on an H200: the served suite missed
    it, the JIT's binary ran 32 warps)."""
    spec = (spec_text().replace("scale_kernel", "warps_kernel").replace('y_ptr = "*{dtype}"\n', "")
            .replace('BLOCK = "constexpr"', 'BLOCK = "constexpr"\nnum_warps = "constexpr"')
            .replace('["x_ptr", "y_ptr"]', '["x_ptr"]').replace("num_warps = [4]", "num_warps = [8]"))
    root = make_project(tmp_path / "p", specs={"scale": spec}, kernels={"scale": WARPS_KERNEL})
    [target] = build_targets([load_spec(root / "specs" / "scale.toml", root)], root, None)
    assert dict(target.options)["num_warps"] == 8 and dict(target.constexprs)["num_warps"] == 8
    doit(root, "-n", "1")
    meta = json.loads((root / "out" / "sm_90a" / "scale" / target.config_id / "meta.json").read_text())
    assert meta["num_warps"] == 8 and meta["threads_per_block"] == 256


def test_two_families_of_one_name_are_one_line_naming_both_files(tmp_path):
    """targets.py 31: reachable from two spec files, never run in the whole suite's coverage."""
    from kforge.declare.spec import SpecError
    root = make_project(tmp_path, specs={"a": spec_text(), "b": spec_text(module="other")},
                        kernels={"scale": kernel_text(), "other": kernel_text()})
    specs = [load_spec(root / "specs" / f"{n}.toml", root) for n in ("a", "b")]
    with pytest.raises(SpecError) as e:
        build_targets(specs, root, None)
    assert str(e.value) == ("specs/b.toml: kernel name 'scale' is already used by specs/a.toml; target names must be "
                            "unique: rename one [kernel] name")


def test_a_module_the_kernel_imports_holding_a_nul_is_one_line_naming_it(tmp_path):
    """targets.py 37-44: a module the kernel's source imports with a NUL byte in it. Python's parser raises a
    SyntaxError naming no file there, and Path(None) raised TypeError: a traceback out of the task loader; now the
    line names the module."""
    from kforge.declare.spec import SpecError
    root = make_project(tmp_path, specs={"s": spec_text()},
                        kernels={"scale": kernel_text(imports="from tk import helper"), "helper": "x = 1\0\n"})
    spec = load_spec(root / "specs" / "s.toml", root)
    with pytest.raises(SpecError) as e:
        build_targets([spec], root, None)
    assert str(e.value) == ("specs/s.toml: kernel scale: tk/helper.py, a module its source imports, is not Python "
                            "kforge can read (source code string cannot contain null bytes); fix that file")


PRUNED = '''
import triton
import triton.language as tl


def prune(configs, named_args, **kwargs):
    return [RETURN]


@triton.autotune(configs=[triton.Config({"BLOCK": 64}, num_warps=4), triton.Config({"BLOCK": 128}, num_warps=4)],
                 key=["n"], prune_configs_by={"early_config_prune": prune})
@triton.jit
def tuned_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + i, tl.load(x_ptr + i, mask=i < n), mask=i < n)
'''


@pytest.mark.parametrize("kept, said", [
    ('triton.Config({"BLOCK": 64, "EXTRA": 1}, num_warps=4)',
     "the autotuner of tk.scale.tuned_kernel pruned its configs into one that sets EXTRA, neither a constexpr of "
     "tuned_kernel nor a compile option (Triton refuses that launch); fix the pruner"),
    ('triton.Config({}, num_warps=4)',
     "the autotuner of tk.scale.tuned_kernel pruned its configs into one that sets ['num_stages', 'num_warps'], not "
     "['BLOCK', 'num_stages', 'num_warps']; kforge sweeps configs that set the same parameters"),
    ('triton.Config({"BLOCK": 64}, num_warps=3)',
     "the autotuner's pruner set num_warps: got 3; allowed: a power of two, at most 1024 threads a block"),
])
def test_a_pruner_returning_a_config_kforge_cannot_build_is_one_line(tmp_path, kept, said):
    """targets.py 152 and 163 (a library's early_config_prune returning a config of other parameters, or an option
    value no binary can have): reachable from any library's autotuner, never run in the whole suite's coverage.
    build_targets directly: one probe child, no build."""
    from kforge.declare.spec import SpecError
    from kforge.load.entry_probe import Probe
    text = spec_text().replace("scale_kernel", "tuned_kernel").replace('id = "{dtype}-b{BLOCK}-w{num_warps}"\n', "")
    root = make_project(tmp_path, specs={"s": text.split("BLOCK = [")[0] + "n = [1024]\n"},
                        kernels={"scale": PRUNED.replace("RETURN", kept)})
    try:
        spec = load_spec(root / "specs" / "s.toml", root)
        with pytest.raises(SpecError) as e:
            build_targets([spec], root, None)
    finally:
        Probe.close_all()
    assert str(e.value).startswith(f"specs/s.toml: {said}") and "\n" not in str(e.value), str(e.value)


DESC_SPEC = '''
[kernel]
name = "desc"
source = "tk/scale.py"
entry = "desc_kernel"
toolchain = "triton"
archs = ["sm_90a"]

[signature]
d = "tensordesc<{dtype}[{BM}, 64]>"
n = "i32"
BM = "constexpr"

[sweep]
dtype = ["fp16"]
BM = [VALUE]
'''


@pytest.mark.parametrize("value", ["0", "-64", "1.5", '"x"', "1048576"])
def test_a_descriptor_block_size_no_binary_can_have_is_one_line_with_what_is_allowed(tmp_path, value):
    """targets.py 235 (a shape variable's swept value making no descriptor type): reachable from a spec, never run
    in the whole suite's coverage; the line said 'is not a known type' and not what is allowed."""
    from kforge.declare.spec import SpecError
    kernel = "import triton\nimport triton.language as tl\n\n\n@triton.jit\ndef desc_kernel(d, n, BM: tl.constexpr):\n" \
             "    pass\n"
    root = make_project(tmp_path, specs={"s": DESC_SPEC.replace("VALUE", value)}, kernels={"scale": kernel})
    spec = load_spec(root / "specs" / "s.toml", root)
    with pytest.raises(SpecError) as e:
        build_targets([spec], root, None)
    assert str(e.value).startswith("specs/s.toml: [signature] d: type 'tensordesc<{dtype}[{BM}, 64]>' with config {")
    assert str(e.value).endswith("is not a known type; a descriptor's block sizes are integers 1 to 65536; fix the "
                                 "values the spec gives")


def test_a_module_the_kernel_imports_that_cannot_be_read_is_one_line_naming_it(tmp_path, monkeypatch):
    """targets.py 42-44 (OSError reading the sources: another user's module of mode 600). Root reads any file: the
    read is refused by a stand-in."""
    import errno
    from pathlib import Path
    from kforge.declare.spec import SpecError
    root = make_project(tmp_path, specs={"s": spec_text()},
                        kernels={"scale": kernel_text(imports="from tk import helper"), "helper": "x = 1\n"})
    spec = load_spec(root / "specs" / "s.toml", root)
    real = Path.read_bytes

    def refused(path):
        if path.name == "helper.py":
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real(path)
    monkeypatch.setattr(Path, "read_bytes", refused)
    with pytest.raises(SpecError) as e:
        build_targets([spec], root, None)
    assert str(e.value) == (f"specs/s.toml: reading the sources of kernel scale failed: PermissionError: [Errno 13] "
                            f"Permission denied: '{root / 'tk' / 'helper.py'}'")


ADDING = '''
import triton
import triton.language as tl


def prune(configs, named_args, **kwargs):
    return [triton.Config({**c.kwargs, ADDS}, num_warps=c.num_warps, num_stages=c.num_stages) for c in configs]


@triton.autotune(configs=[triton.Config({"BLOCK": 64}, num_warps=4), triton.Config({"BLOCK": 128}, num_warps=4)],
                 key=["n"], prune_configs_by={"early_config_prune": prune})
@triton.heuristics({"TWICE": lambda args: args["NS"] * 2})
@triton.jit
def tuned_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr, NS: tl.constexpr, TWICE: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + i, tl.load(x_ptr + i, mask=i < n), mask=i < n)
'''


@pytest.mark.parametrize("adds, constants, said", [
    ('"NS": c.kwargs["BLOCK"] // 64', "", None),
    ('"NS": 1', "[constants]\nNS = 1\n",
     "the autotuner of tk.scale.tuned_kernel prunes its configs into ones that set NS (to 1), which the spec gives "
     "in [constants]; leave NS out of the spec: a launch giving it fails in Triton (\"Conflicting "
     "meta-parameters\"), the pruner sets it"),
    ('"BLOCK": c.kwargs["BLOCK"]', "",
     "constexpr NS has no value, and the autotuner's pruner (tk.scale.prune) did not set it in config "
     "fp16-n1024-block64-num_warps4-num_stages3 on sm_90a; add it to [constants] or [sweep]"),
    ('"NS": 1, "OTHER": 1', "",
     "the autotuner of tk.scale.tuned_kernel pruned its configs into one that sets OTHER, neither a constexpr of "
     "tuned_kernel nor a compile option (Triton refuses that launch); fix the pruner"),
    # one config twice, apart only in what the pruner adds: one target per config would leave one unbuilt (a review)
    ('"BLOCK": 64, "NS": c.kwargs["BLOCK"] // 64', "",
     "the autotuner of tk.scale.tuned_kernel pruned its configs into two that differ only in what it adds ({'NS': "
     "1} and {'NS': 2}, with {'dtype': 'fp16', 'n': 1024, 'BLOCK': 64, 'num_warps': 4, 'num_stages': 3}); kforge "
     "builds one target per config: make the difference a swept parameter"),
])
def test_a_constexpr_the_pruner_adds_takes_its_value_from_each_pruned_config(tmp_path, adds, constants, said):
    """gemlite's pruners add NUM_STAGES (EVEN_K, ...) to the configs they return, and Triton's launch passes them:
    no spec built such a family (without NS: 'has no value'; with it: 'pruned into one that sets [BLOCK, NS]').
    Now a constexpr the spec leaves without value takes each pruned config's, in its constexprs and key, and a
    heuristic under the autotuner sees it, as at a launch; one the spec gives, or none sets, is one line."""
    from kforge.declare.spec import SpecError
    from kforge.load.entry_probe import Probe
    text = (spec_text().replace("scale_kernel", "tuned_kernel").replace('id = "{dtype}-b{BLOCK}-w{num_warps}"\n', "")
            .replace('BLOCK = "constexpr"', 'BLOCK = "constexpr"\nNS = "constexpr"\nTWICE = "constexpr"'))
    root = make_project(tmp_path, specs={"s": constants + text.split("BLOCK = [")[0] + "n = [1024]\n"},
                        kernels={"scale": ADDING.replace("ADDS", adds)})
    try:
        spec = load_spec(root / "specs" / "s.toml", root)
        if said is None:
            targets = build_targets([spec], root, None)
        else:
            with pytest.raises(SpecError) as e:
                build_targets([spec], root, None)
    finally:
        Probe.close_all()
    if said is not None:
        assert str(e.value) == f"specs/s.toml: {said}"
        return
    assert [(dict(t.config)["BLOCK"], dict(t.constexprs)["NS"], dict(t.constexprs)["TWICE"]) for t in targets] == [
        (64, 1, 2), (128, 2, 4)]
    assert len({t.key for t in targets}) == 2 and all("NS" not in dict(t.config) for t in targets)


# a pruner adding ADDS to each config it keeps
OPTION_ADDING = PRUNED.replace(
    "RETURN", 'triton.Config({**c.kwargs, ADDS}, num_warps=c.num_warps, num_stages=c.num_stages) for c in configs')


@pytest.mark.parametrize("option, value", [("matrix_instr_nonkdim", 16), ("waves_per_eu", 2)])
def test_a_compile_option_the_pruner_adds_is_each_target_s_option_and_in_its_key(tmp_path, option, value):
    """A pruner adding an AMD compile option to the configs it returns (targets.py _pruned: 'an added option is the
    target's option'): the target on gfx942 carries it in its options, not in its config or constexprs, and its key
    is not the key of the same config built without it (a pruner adding nothing)."""
    from kforge.load.entry_probe import Probe
    text = (spec_text(archs=("gfx942",)).replace("scale_kernel", "tuned_kernel")
            .replace('id = "{dtype}-b{BLOCK}-w{num_warps}"\n', ""))
    spec_body = text.split("BLOCK = [")[0] + "n = [1024]\n"

    def targets_of(folder, adds):
        root = make_project(tmp_path / folder, specs={"s": spec_body},
                            kernels={"scale": OPTION_ADDING.replace("ADDS", adds)})
        try:
            return build_targets([load_spec(root / "specs" / "s.toml", root)], root, None)
        finally:
            Probe.close_all()
    added = targets_of("added", f'"{option}": {value}')
    plain = targets_of("plain", '"BLOCK": c.kwargs["BLOCK"]')
    assert [dict(t.config)["BLOCK"] for t in added] == [64, 128] == [dict(t.config)["BLOCK"] for t in plain]
    assert all(dict(t.options).get(option) == value for t in added), [t.options for t in added]
    assert all(option not in dict(t.options) for t in plain)
    assert all(option not in dict(t.config) and option not in dict(t.constexprs) for t in added)
    assert [t.config_id for t in added] == [t.config_id for t in plain]
    assert all(a.key != p.key for a, p in zip(added, plain))


DEFAULT_SET = '''
import triton
import triton.language as tl


def prune(configs, named_args, **kwargs):
    return [triton.Config({**c.kwargs, "NS": 2}, num_warps=c.num_warps, num_stages=c.num_stages) for c in configs]


@triton.autotune(configs=[triton.Config({"BLOCK": 64}, num_warps=4), triton.Config({"BLOCK": 128}, num_warps=4)],
                 key=["n"], prune_configs_by={"early_config_prune": prune})
@triton.jit
def tuned_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr, NS: tl.constexpr = 1):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + i, tl.load(x_ptr + i, mask=i < n) * NS, mask=i < n)
'''


def test_a_source_default_the_pruner_sets_is_replaced_and_builds(tmp_path):
    """`NS: tl.constexpr = 1` in the def, and the pruner sets NS=2 (targets.py _target: 'a source default it sets is
    replaced'): each target's constexprs hold 2, NS is no longer among its defaulted values, and a real build
    compiles it (the compile checks a defaulted value against the imported def's default: 2 is not 1, and would
    be refused)."""
    from kforge.load.entry_probe import Probe
    from tests.support import build_report, statuses
    text = (spec_text().replace("scale_kernel", "tuned_kernel").replace('id = "{dtype}-b{BLOCK}-w{num_warps}"\n', "")
            .replace('BLOCK = "constexpr"', 'BLOCK = "constexpr"\nNS = "constexpr"'))
    root = make_project(tmp_path, specs={"s": text.split("BLOCK = [")[0] + "n = [1024]\n"},
                        kernels={"scale": DEFAULT_SET})
    try:
        spec = load_spec(root / "specs" / "s.toml", root)
        assert spec.defaulted == ("NS",)   # the spec gives NS no value: the source's default would be read
        targets = build_targets([spec], root, None)
    finally:
        Probe.close_all()
    assert [(dict(t.config)["BLOCK"], dict(t.constexprs)["NS"]) for t in targets] == [(64, 2), (128, 2)]
    assert all("NS" not in t.defaulted for t in targets)
    doit(root, "-n", "1")
    assert statuses(root, "built") == {t.name for t in targets}, build_report(root)
