"""rules/declare/records.py: record files in the catalog -> targets, de-duplicated, every line checked."""
import json

import pytest
import triton.language as tl

from kforge.plan.catalog import Catalog
from kforge.base.errors import SpecError
from tests.support import REPO, WARPS_KERNEL, doit, make_project, spec_text, statuses


def line(block, arch="sm_90a", warps=4, **changes):
    record = {"format": "kforge-record-1", "kernel": "tk.scale:scale_kernel", "arch": arch,
              "signature": [["x_ptr", "*fp16"], ["y_ptr", "*fp16"], ["n", "i32"], ["BLOCK", "constexpr"]],
              "constexprs": {"BLOCK": block}, "divisible_by_16": ["x_ptr", "y_ptr"],
              "options": {"num_warps": warps, "num_stages": 3}}
    return json.dumps({**record, **changes}, sort_keys=True)


@pytest.fixture
def project(tmp_path, monkeypatch):
    root = make_project(tmp_path / "p", specs={})
    monkeypatch.syspath_prepend(str(root))   # as doit puts the project first on the path
    return root


def targets(root):
    return {t.name: t for t in Catalog(root, None, 50_000).load().targets}


def test_records_become_targets_and_a_repeated_line_is_one(project):
    (project / "specs" / "app.jsonl").write_text("\n".join([line(128), line(256), line(128), ""]))
    found = targets(project)
    assert len(found) == 2 and all(n.startswith("rec_scale_kernel_") and n.endswith("@sm_90a") for n in found)
    t = next(t for t in found.values() if dict(t.constexprs)["BLOCK"] == 256)
    assert dict(t.options) == {"num_warps": 4, "num_stages": 3} and t.divisible_by_16 == ("x_ptr", "y_ptr")
    assert t.signature == (("x_ptr", "*fp16"), ("y_ptr", "*fp16"), ("n", "i32"), ("BLOCK", "constexpr"))


def test_a_config_recorded_on_two_archs_is_one_target_on_each(project):
    """Lines repeated, or one config recorded on two GPUs, are a record file's normal content: one target per arch
    (a spec giving a config twice is refused; a record file's lines are merged)."""
    (project / "specs" / "app.jsonl").write_text("\n".join([line(128), line(128, arch="gfx942"), line(128), ""]))
    assert sorted(t.arch for t in targets(project).values()) == ["gfx942", "sm_90a"]


def test_record_archs_build_a_record_for_more_archs(project):
    """A plain launch leaves num_stages at its vendor's default, 3 on NVIDIA and 2 on AMD, and a line holds 3
    whether the call gave it or not: the same call on an MI300X compiles with 2 unless it gives 3, and only 3 was
    built there, so the default launch was never served on AMD (an outside review). Both are built on the other
    vendor's archs; an autotuner's pick gives its own, and a vendor a line was recorded on launches what it holds."""
    (project / "specs" / "app.jsonl").write_text(line(128) + "\n" + tuned(256, [7, "torch.float16"]) + "\n")
    pyproject = project / "pyproject.toml"
    pyproject.write_text(pyproject.read_text() + '\n[tool.kforge]\nrecord_archs = ["gfx942", "sm_100a"]\n')
    built = sorted((t.arch, dict(t.constexprs)["BLOCK"], dict(t.options)["num_stages"])
                   for t in targets(project).values())
    assert built == [("gfx942", 128, 2), ("gfx942", 128, 3), ("gfx942", 256, 3), ("sm_100a", 128, 3),
                     ("sm_100a", 256, 3), ("sm_90a", 128, 3), ("sm_90a", 256, 3)]
    from kforge_runtime.serve import identity   # what the MI300X's default call is matched by: one of them
    from kforge.declare.records import identity as target_identity
    call = json.loads(line(128, arch="gfx942", options={"num_warps": 4, "num_stages": 2}))
    runtime = [[a, t] for a, t in call["signature"] if t != "constexpr"]
    wanted = identity(call["kernel"], "gfx942", runtime, call["constexprs"], call["divisible_by_16"], call["options"])
    assert wanted in {json.loads(target_identity(t))[0] for t in targets(project).values()}


def test_a_record_the_catalog_already_builds_is_dropped(project):
    (project / "specs" / "scale.toml").write_text(spec_text(blocks=(128,)))   # fp16, BLOCK 128, 4 warps
    (project / "specs" / "app.jsonl").write_text(line(128) + "\n" + line(256) + "\n" + line(128, warps=8) + "\n")
    found = targets(project)
    recorded = sorted((dict(t.constexprs)["BLOCK"], dict(t.options)["num_warps"])
                      for n, t in found.items() if n.startswith("rec_"))
    assert recorded == [(128, 8), (256, 4)] and "scale:fp16-b128-w4@sm_90a" in found


@pytest.mark.parametrize("bad, message", [
    ("{not json", r"specs/app.jsonl:2: not a JSON object"),
    (line(64, arch="sm_89"), r"specs/app.jsonl:2: arch 'sm_89' is not one kforge builds"),
    (line(64, arch=["sm_90a"]), r"specs/app.jsonl:2: arch \['sm_90a'\] is not one kforge builds"),
    (line(64, kernel="tk/scale.py"), r"specs/app.jsonl:2: kernel 'tk/scale.py' is not 'module:function'"),
    (line(64, format="other"), r"specs/app.jsonl:2: not a kforge-record-1 record"),
    (line(64, signature={"x": "*fp16"}), r"specs/app.jsonl:2: signature must be a list of \[argument, type\] pairs"),
])
def test_a_bad_line_is_one_error_naming_the_file_and_line(project, bad, message):
    (project / "specs" / "app.jsonl").write_text(line(128) + "\n" + bad + "\n")
    with pytest.raises(SpecError, match=message):
        targets(project)


def test_a_record_that_does_not_match_the_kernel_gets_the_specs_message_naming_its_first_line(project):
    # a family is all the lines of one shape: its message names the first of them (gemlite's suite: 62 lines of
    # four families were refused, named by the file alone)
    wrong = [line(b, signature=[["x_ptr", "*fp16"], ["n", "i32"], ["BLOCK", "constexpr"]]) for b in (128, 64, 32)]
    (project / "specs" / "app.jsonl").write_text("\n".join([line(128), *wrong]) + "\n")
    with pytest.raises(SpecError, match=r"specs/app.jsonl:2 \(and 2 more lines\): tk.scale:scale_kernel: \[signature\] "
                                        r"must list the arguments of scale_kernel in order"):
        targets(project)
    (project / "specs" / "app.jsonl").write_text(wrong[0] + "\n")
    with pytest.raises(SpecError, match=r"specs/app.jsonl:1: tk.scale:scale_kernel: \[signature\]"):
        targets(project)


def test_a_kernels_lines_whose_module_no_import_finds_are_one_broken_family_saying_why(project):
    # flag_gems makes modules at run time (_gen_module_*, loaded from generated files): 93 families of its suite's
    # record, one a line shape, each failed alone with the same error
    made = "_gen_module_5f5f_rank_2:copy_kernel_rank_2"
    lines = [line(128, kernel=made, signature=[["x_ptr", t], ["y_ptr", t], ["n", "i32"], ["BLOCK", "constexpr"]])
             for t in ("*fp16", "*fp32", "*bf16")]
    (project / "specs" / "app.jsonl").write_text("\n".join([line(128), *lines]) + "\n")
    catalog = Catalog(project, None, 50_000).load(keep_going=True)
    assert len(catalog.targets) == 1 and len(catalog.broken) == 1
    assert catalog.broken[0].error.startswith(f"specs/app.jsonl:2 (and 2 more lines): {made}: [kernel] module: no "
                                              f"_gen_module_5f5f_rank_2 on this Python's module path")
    assert "may have been made at run time" in catalog.broken[0].error


def test_recorded_targets_build(project):
    (project / "specs" / "app.jsonl").write_text(line(128) + "\n" + line(256) + "\n")
    doit(project, "-n", "2")
    assert len(statuses(project, "built")) == 2


def test_a_record_that_cannot_run_on_an_added_arch_is_left_out_there(project):
    """32 warps (a Hopper choice) exceed wave64 AMD's 1,024 threads a block: that arch runs another config."""
    (project / "specs" / "app.jsonl").write_text(line(128, warps=32) + "\n" + line(256) + "\n")
    pyproject = project / "pyproject.toml"
    pyproject.write_text(pyproject.read_text() + '\n[tool.kforge]\nrecord_archs = ["gfx942"]\n')
    found = {(dict(t.constexprs)["BLOCK"], t.arch) for t in targets(project).values()}
    assert found == {(128, "sm_90a"), (256, "sm_90a"), (256, "gfx942")}


def test_a_line_with_one_vendors_option_is_built_only_for_that_vendor(project):
    amd = line(128, arch="gfx942", options={"num_warps": 4, "num_stages": 2, "waves_per_eu": 2})
    (project / "specs" / "app.jsonl").write_text(amd + "\n")
    pyproject = project / "pyproject.toml"
    pyproject.write_text(pyproject.read_text() + '\n[tool.kforge]\nrecord_archs = ["sm_90a", "gfx950"]\n')
    assert sorted(t.arch for t in targets(project).values()) == ["gfx942", "gfx950"]


def tuned(block, key, warps=4, **changes):
    return line(block, warps=warps, autotune={"key": key, "config": {"BLOCK": block, "num_warps": warps}}, **changes)


def test_an_autotuners_pick_builds_once_and_reaches_the_bundle_for_its_key(project):
    """Two keys that picked the same config are one target; the manifest lists each key's picks with the number
    of lines that made each (processes that tuned apart picked differently: serving needs every pick); a pick is
    listed for each arch its line builds for."""
    from kforge_runtime import Bundle
    from tests.ship.test_package import wheel
    lines = [tuned(128, [1000, "torch.float16"]), tuned(128, [4096, "torch.float16"]),
             tuned(256, [7, "torch.float16"]), tuned(128, [7, "torch.float16"]), line(256),
             tuned(512, [99, "torch.float16"], warps=32)]
    (project / "specs" / "app.jsonl").write_text("\n".join(lines) + "\n")
    pyproject = project / "pyproject.toml"
    pyproject.write_text(pyproject.read_text() + '\n[tool.kforge]\nrecord_archs = ["gfx942"]\n')
    catalog = Catalog(project, None, 50_000).load()
    assert sorted((dict(t.constexprs)["BLOCK"], t.arch) for t in catalog.targets) == [
        (128, "gfx942"), (128, "sm_90a"), (256, "gfx942"), (256, "sm_90a"), (512, "sm_90a")]
    assert sorted((t["arch"], t["key"][0], t["config"]["BLOCK"]) for t in catalog.tuned) == [
        ("gfx942", 7, 128), ("gfx942", 7, 256), ("gfx942", 1000, 128), ("gfx942", 4096, 128),   # 32 warps: not
        ("sm_90a", 7, 128), ("sm_90a", 7, 256), ("sm_90a", 99, 512), ("sm_90a", 1000, 128),    # on gfx942
        ("sm_90a", 4096, 128)]
    doit(project, "-n", "2", "archs=sm_90a")
    doit(project, "package", "archs=sm_90a")
    def picks():
        found = {}
        for t in Bundle(wheel(project, "sm_90a")).autotune:
            found.setdefault(t["key"][0], {})[t["config"]["BLOCK"]] = t["lines"]
        return found
    assert picks() == {1000: {128: 1}, 4096: {128: 1}, 7: {256: 1, 128: 1}, 99: {512: 1}}
    # a new pick re-packages (the saved catalog and the package stamp both see the record file change)
    (project / "specs" / "app.jsonl").write_text("\n".join([*lines, tuned(256, [1000, "torch.float16"])]) + "\n")
    doit(project, "package", "archs=sm_90a")
    assert picks()[1000] == {128: 1, 256: 1}


@pytest.mark.parametrize("bad", [{"key": "n", "config": {}}, {"key": [{"n": 1}], "config": {}}, {"key": []},
                                 {"key": [], "config": {"B": [1]}}, []])
def test_a_malformed_autotune_field_is_one_error(project, bad):
    (project / "specs" / "app.jsonl").write_text(line(128, autotune=bad) + "\n")
    with pytest.raises(SpecError, match=r'specs/app.jsonl:1: "autotune" must be \{"key": \[numbers and strings\], '
                                        r'"config": \{name: value\}\}'):
        targets(project)


def test_a_recorded_line_reads_back_as_written(project, tmp_path):
    """Format round trip: what the recorder writes is what the catalog reads (an autotuner's pick included)."""
    from kforge.declare.records import read, tuned_choices
    from kforge_runtime.record import Recorder
    path = project / "specs" / "app.jsonl"
    recorder = Recorder(str(path), arch="sm_90a")
    plain = json.loads(line(128))
    picked = json.loads(tuned(256, [1000, "torch.float16"]))
    for written in (plain, picked, plain):
        recorder.write(written)
    assert read(path, "specs/app.jsonl") == [plain, {k: v for k, v in picked.items() if k != "autotune"}]
    assert tuned_choices([path], project) == [{"kernel": picked["kernel"], "arch": "sm_90a", "key": [1000, "torch.float16"],
                                            "config": {"BLOCK": 256, "num_warps": 4}, "lines": 1}]
    assert len(path.read_text().splitlines()) == 2   # the repeated line is written once


def test_a_recorded_call_with_tensor_descriptors_becomes_a_target_serve_matches(project):
    """A record line of a call with TensorDescriptors (Triton's spelling: tensordesc<fp16[64, 64]>) builds a
    target whose meta.json has the identity serve() computes for that line, and the compile's TMA metadata."""
    from pathlib import Path

    from kforge_runtime import record, serve
    (project / "tk" / "tma.py").write_text((REPO / "kernels" / "tma.py").read_text())
    recorded = record.record_line(
        "tk.tma", "tma_scale_kernel", ["x_desc", "y_desc", "scale", "BLOCK_M", "BLOCK_N"],
        {"x_desc": "tensordesc<fp16[64, 64]>", "y_desc": "tensordesc<fp16[64, 64]>", "scale": "fp32",
         "BLOCK_M": "constexpr", "BLOCK_N": "constexpr"}, {(3,): 64, (4,): 64}, {}, {"num_warps": 4, "num_stages": 3},
        "sm_90a")
    (project / "specs" / "app.jsonl").write_text(json.dumps(recorded) + "\n")
    doit(project, "-n", "1", "archs=sm_90a")
    meta = json.loads(next((project / "out" / "sm_90a").glob("rec_tma_scale_kernel_*/*/meta.json")).read_text())
    options = {"num_warps": 4, "num_stages": 3}   # the bundle's manifest adds the target's options to meta.json
    assert serve.entry_identity({**meta, "options": options}) == serve.record_identity(recorded)
    assert [m["block_size"] for m in meta["tensordesc_meta"]] == [[64, 64], [64, 64]]


CAST = """
import triton
import triton.language as tl


@triton.jit
def cast_kernel(x_ptr, y_ptr, n, flip, OUT: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    v = tl.load(x_ptr + i, mask=i < n)
    tl.store(y_ptr + i, tl.where(flip, -v, v).to(OUT), mask=i < n)
"""


def test_a_recorded_bool_argument_and_integer_dtype_build_a_target_serve_matches(project):
    """What Triton's JIT hands the record hook for a bool argument ("u1") and an integer dtype constexpr
    (tl.int32, which Triton names "int32"): the line loads, builds, and its meta.json has the identity serve()
    computes for the same call (gemlite's suite: "u1" was refused, and every int32 / uint8 dtype missed)."""
    from kforge_runtime import record, serve
    (project / "tk" / "cast.py").write_text(CAST)
    recorded = record.record_line(
        "tk.cast", "cast_kernel", ["x_ptr", "y_ptr", "n", "flip", "OUT", "BLOCK"],
        {"x_ptr": "*fp32", "y_ptr": "*i32", "n": "i32", "flip": "u1", "OUT": "constexpr", "BLOCK": "constexpr"},
        {(4,): tl.int32, (5,): 128}, {}, {"num_warps": 4, "num_stages": 3}, "sm_90a")
    (project / "specs" / "app.jsonl").write_text(json.dumps(recorded) + "\n")
    doit(project, "-n", "1", "archs=sm_90a")
    meta = json.loads(next((project / "out" / "sm_90a").glob("rec_cast_kernel_*/*/meta.json")).read_text())
    assert [a["type"] for a in meta["signature"]] == ["*fp32", "*i32", "i32", "u1"]
    options = {"num_warps": 4, "num_stages": 3}   # the bundle's manifest adds the target's options to meta.json
    assert serve.entry_identity({**meta, "options": options}) == serve.record_identity(recorded)


@pytest.mark.parametrize("bad, message", [
    ('{"BLOCK": NaN}', r"specs/app.jsonl:2: constexprs BLOCK: NaN is not a value kforge builds"),
    ('{"BLOCK": 1e400}', r"specs/app.jsonl:2: constexprs BLOCK: Infinity is not a value kforge builds"),
    ('{"BLOCK": 1' + "0" * 400 + '}', r"specs/app.jsonl:2: constexprs BLOCK: an integer of 1329 bits is not a value "),
    ('{"BLOCK": [1, 2]}', r"specs/app.jsonl:2: constexprs BLOCK: \[1, 2\] is not a value kforge builds"),
    ('{"BLOCK": 64, "../../x": 1}', r"specs/app.jsonl:2: constexprs: '../../x' is not an argument name"),
])
def test_a_line_with_a_hostile_value_is_one_error_naming_the_file_and_line(project, bad, message):
    """NaN and 1e400 were built as BLOCK=nan and inf; a huge number, a list or a path as a name were refused only
    for the family, without the line."""
    (project / "specs" / "app.jsonl").write_text(line(128) + "\n" + line(64).replace('{"BLOCK": 64}', bad) + "\n")
    with pytest.raises(SpecError, match=message):
        targets(project)


def test_lines_whose_strings_no_id_can_spell_are_families_of_their_own(project):
    """A family's config ids spell the values that tell its lines apart; a string constexpr such as 'ñ→✓' or 'a b'
    spells no safe id, and the family of every line of that kernel failed (an outside review)."""
    (project / "specs" / "app.jsonl").write_text("\n".join(
        [line(128), line(256), line("ñ→✓"), line("a b"), ""]))
    found = targets(project)
    assert sorted(map(str, (dict(t.constexprs)["BLOCK"] for t in found.values()))) == ["128", "256", "a b", "ñ→✓"]


WIDE = """
import triton
import triton.language as tl


@triton.jit
def wide_kernel(x_ptr, {params}):
    tl.store(x_ptr + tl.arange(0, 16), tl.zeros((16,), tl.float32))
"""
STRIDES = [f"stride_of_the_cache_dimension_{i}" for i in range(8)]


def test_lines_differing_in_many_long_named_values_get_short_ids_that_tell_them_apart(project):
    """lmdeploy's fill_kv_cache lines differ in 20 strides (all following the head size): the id spelling every
    varying value passed 200 characters, and the recorded family failed with 'not a safe name ... change [kernel]
    id', which a record cannot."""
    (project / "tk" / "wide.py").write_text(WIDE.format(params=", ".join(f"{s}: tl.constexpr" for s in STRIDES)))
    def wide(head, decoding):
        constexprs = {s: head << i for i, s in enumerate(STRIDES)}
        constexprs[STRIDES[0]] += decoding   # what tells two lines of one head size apart
        return json.dumps({"format": "kforge-record-1", "kernel": "tk.wide:wide_kernel", "arch": "sm_90a",
                           "signature": [["x_ptr", "*fp32"], *([s, "constexpr"] for s in STRIDES)],
                           "constexprs": constexprs, "divisible_by_16": [],
                           "options": {"num_warps": 4, "num_stages": 3}})
    (project / "specs" / "app.jsonl").write_text("\n".join([wide(h, d) for h in (64, 96, 128) for d in (0, 1)]) + "\n")
    found = targets(project)
    assert len(found) == 6 and all(len(n.split(":")[1].split("@")[0]) <= 200 for n in found), list(found)
    assert {dict(t.constexprs)[STRIDES[1]] for t in found.values()} == {128, 192, 256}
    # lines each telling itself apart by a flag of its own: every flag is needed, each then named by its place
    flags = []
    for i in range(len(STRIDES)):
        line = json.loads(wide(64, 0))
        line["constexprs"] = {s: int(j == i) for j, s in enumerate(STRIDES)}
        flags.append(json.dumps(line))
    (project / "specs" / "app.jsonl").write_text("\n".join(flags) + "\n")
    found = targets(project)
    assert len(found) == 8 and all(len(n.split(":")[1].split("@")[0]) <= 200 for n in found), list(found)


def test_a_line_with_a_value_kforge_cannot_build_fails_alone_and_the_file_s_other_lines_build(project):
    """A string constexpr of thousands of characters, -inf, an integer past 64 bits: Triton compiles them and the
    recorder writes them; one such line failed the whole file, so none of an application's kernels was built (an
    outside review). It fails alone now, naming its line."""
    long = line(64).replace('"BLOCK": 64', '"BLOCK": "' + "x" * 2000 + '"')
    (project / "specs" / "app.jsonl").write_text("\n".join([line(128), long, line(256), ""]))
    doit(project, "-n", "1", env={"KFORGE_LOCAL_CACHE": "off"}, check=False)
    assert len(statuses(project, "built")) == 2
    assert {json.loads(m.read_text())["constexprs"]["BLOCK"]
            for m in (project / "out" / "sm_90a").glob("rec_*/*/meta.json")} == {128, 256}
    report = json.loads((project / "out" / "build-report.json").read_text())
    failed = [t for t in report["tasks"] if t["status"] == "failed"]
    assert len(failed) == 1 and "specs/app.jsonl:2: constexprs BLOCK: " in failed[0]["error"]
    assert "the line is not built" in failed[0]["error"]


@pytest.mark.parametrize("bad, message", [
    ('{"BLOCK": 64, "BLOCK": 128}', r"^specs/app.jsonl:2: key 'BLOCK' given twice in one object; each line is one "
                                    r"record"),
    ('{"BLOCK": 64}, "arch": "gfx942"', r"^specs/app.jsonl:2: key 'arch' given twice in one object"),
])
def test_a_line_giving_a_key_twice_is_one_error_naming_it_not_the_last_value_taken(project, bad, message):
    """json.loads keeps the last of a key given twice: `{"BLOCK": 64, "BLOCK": 128}` built BLOCK=128 without a
    word (a hand-edited or merged line; the recorder writes none)."""
    (project / "specs" / "app.jsonl").write_text(line(128) + "\n" + line(64).replace('{"BLOCK": 64}', bad) + "\n")
    with pytest.raises(SpecError, match=message):
        targets(project)


@pytest.mark.parametrize("field, bad, message", [
    ("divisible_by_16", ["x_ptr", "y_ptr", "x_ptr"], r"divisible_by_16 names argument 'x_ptr' twice; record the "
                                                     r"kernel again$"),
    ("options", {"num_warps": 10 ** 30}, r"options num_warps: an integer of 100 bits"),
    ("options", {"num_warps": float("nan")}, r"options num_warps: NaN"),
    ("divisible_by_16", [5], r"divisible_by_16: 5 is not an argument name"),
    ("autotune", {"key": [float("inf")], "config": {}}, r"autotune key: Infinity is not a value kforge builds"),
])
def test_a_line_with_a_hostile_option_hint_or_key_names_the_line(project, field, bad, message):
    (project / "specs" / "app.jsonl").write_text(line(128) + "\n" + line(64, **{field: bad}) + "\n")
    with pytest.raises(SpecError, match=r"specs/app.jsonl:2: " + message):
        targets(project)


def test_lines_that_differ_only_in_a_values_type_are_targets_of_their_own(project):
    # Python's == makes 1, 1.0 and true one value; Triton compiles them as three kernels, and serving matches a
    # call to a bundle entry by the exact value (a record of liger's tests holds label_smoothing 0 and 0.0)
    (project / "specs" / "app.jsonl").write_text("\n".join([line(1), line(1.0), line(True), line(1), ""]))
    found = targets(project).values()
    assert sorted(json.dumps(dict(t.constexprs)["BLOCK"]) for t in found) == ["1", "1.0", "true"]
    assert len({t.name for t in found}) == 3


def test_every_line_becomes_a_target_that_serving_matches_to_it(project):
    # the class of the 0 / 0.0 miss: whatever a record's lines differ in, each must reach a target whose identity
    # (what serving matches a call to a bundle entry by) is the line's own, or a served call would miss or worse
    from kforge.declare.records import identity
    from kforge_runtime.serve import record_identity
    lines = [line(1), line(1.0), line(True), line(False), line(0), line(0.0), line(1, warps=8),
             line(1, divisible_by_16=["x_ptr"]), line(1, divisible_by_16=["x_ptr", "y_ptr", "n"]),
             line(1, arch="gfx942"), line(1, options={"num_warps": 4, "num_stages": 3, "num_ctas": 1}),
             line(1, signature=[["x_ptr", "*fp16"], ["y_ptr", "*bf16"], ["n", "i32"], ["BLOCK", "constexpr"]]),
             *(line(1, options={"num_warps": 4, "num_stages": 3, **option}) for option in OPTIONS_A_CALL_SETS)]
    (project / "specs" / "app.jsonl").write_text("\n".join(lines) + "\n")
    built = {json.loads(identity(t))[0] for t in targets(project).values()}
    missing = [text for text in lines if record_identity(json.loads(text)) not in built]
    assert not missing
    # each option line its own binary: the default line's is served to none of them
    ids = [record_identity(json.loads(text)) for text in [line(1), *lines[-len(OPTIONS_A_CALL_SETS):]]]
    assert len(set(ids)) == len(ids)


# what a launch (`kernel[grid](..., debug=True)`, @triton.jit(debug=True)) or the process's knobs (TRITON_DEBUG,
# TRITON_F32_DEFAULT) change a binary by: a record keeps each, or a call would be served the default's binary
OPTIONS_A_CALL_SETS = ({"debug": True}, {"debug": True, "sanitize_overflow": False}, {"enable_reflect_ftz": False},
                       {"default_dot_input_precision": "ieee"}, {"launch_pdl": True}, {"maxnreg": 128})


def test_a_call_with_an_option_no_spec_can_set_is_refused_at_build_naming_the_line(project):
    """ir_override (a file of IR standing in for the kernel) cannot be built from a record: the line is refused
    (so strict names the call, and it is never served the binary of the kernel's own source)."""
    (project / "specs" / "app.jsonl").write_text(
        line(128) + "\n" + line(64, options={"num_warps": 4, "num_stages": 3, "ir_override": "k.ttgir"}) + "\n")
    with pytest.raises(SpecError, match=r"specs/app.jsonl:2: tk.scale:scale_kernel: .*ir_override"):
        targets(project)


def test_a_line_nested_too_deeply_is_one_error_naming_the_file_and_line(project):
    """`{"x": [[[...]]]}` 100,000 deep: json.loads' RecursionError was a traceback."""
    (project / "specs" / "app.jsonl").write_text(line(128) + "\n" + '{"x": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
    with pytest.raises(SpecError) as e:
        targets(project)
    assert str(e.value).startswith("specs/app.jsonl:2: not a record: arrays or objects nested too deeply to read")


def test_a_line_longer_than_any_record_is_one_error_not_parsed(project, monkeypatch):
    """One line of the whole file's 256 MiB (`[1, 1, ...]`) was parsed whole into gigabytes of objects."""
    from kforge.declare import records
    monkeypatch.setattr(records, "LINE_LIMIT", 4096)   # the same check as at 1 MiB, on a small file
    (project / "specs" / "app.jsonl").write_text(line(128) + "\n[" + "1, " * 2000 + "1]\n")
    parsed, real = [], json.loads
    monkeypatch.setattr(records.json, "loads", lambda *a, **k: parsed.append(1) or real(*a, **k))
    with pytest.raises(SpecError, match=r"^specs/app.jsonl:2: a line of 6,003 characters, longer than a record can "
                                        r"be \(at most 4,096\); each line is one record"):
        targets(project)
    assert len(parsed) == 1   # the first line only


def test_a_kernel_name_of_thousands_of_characters_is_one_short_line(project):
    """A 5,000-character module was looked up as a file name: `OSError: File name too long`, a traceback; and
    every message of its family would carry the whole name."""
    (project / "specs" / "app.jsonl").write_text(line(128, kernel="a" * 5000 + ":f") + "\n")
    with pytest.raises(SpecError) as e:
        targets(project)
    message = str(e.value)
    assert message.startswith("specs/app.jsonl:1: kernel 'aaa") and len(message) < 400
    assert message.endswith("is not 'module:function' (at most 500 characters)")


def test_a_signature_naming_an_argument_twice_is_refused_naming_the_line(project):
    """One of the two types was dropped without a word (the record's dict of the signature kept the last)."""
    twice = [["x_ptr", "*fp16"], ["y_ptr", "*fp16"], ["n", "i32"], ["n", "i64"], ["BLOCK", "constexpr"]]
    (project / "specs" / "app.jsonl").write_text(line(128, signature=twice) + "\n")
    with pytest.raises(SpecError, match=r"^specs/app.jsonl:1: signature names argument 'n' twice; record the kernel "
                                        r"again$"):
        targets(project)


def test_a_line_recorded_from_other_code_builds_nothing_and_says_so(project):
    """A record line now carries the kernel's code as Triton's source key. A kernel generated and exec'd under
    its def's name (xformers' split-k, an outside review) or another version of the library resolves to a def of
    other code: it was built, and failed in Triton or made a binary never served. The compile now compares the
    key on the arch the line was recorded on and builds nothing where it differs (an arch record_archs adds has
    code of its own there: not compared)."""
    import importlib
    from kforge_runtime.source_key import source_key, tagged
    scale = importlib.import_module("tk.scale")
    mine = tagged(source_key(scale.scale_kernel))
    fp32 = [["x_ptr", "*fp32"], ["y_ptr", "*fp32"], ["n", "i32"], ["BLOCK", "constexpr"]]   # a family of its own
    (project / "specs" / "app.jsonl").write_text("\n".join(
        [line(128, source_key=mine), line(256, signature=fp32, source_key=tagged("0" * 64)), ""]))
    pyproject = project / "pyproject.toml"
    pyproject.write_text(pyproject.read_text() + '\n[tool.kforge]\nrecord_archs = ["gfx942"]\n')
    doit(project, "-n", "1", env={"KFORGE_LOCAL_CACHE": "off"}, check=False)
    saved = targets(project)   # the catalog the build saved, read back: the recorded code with it
    assert {(dict(t.constexprs)["BLOCK"], t.arch, t.recorded_code) for t in saved.values()} == {
        (128, "sm_90a", (mine,)), (256, "sm_90a", (tagged("0" * 64),)), (128, "gfx942", ()), (256, "gfx942", ())}
    made = {name: (dict(t.constexprs)["BLOCK"], t.arch) for name, t in saved.items()}
    assert {made[n] for n in statuses(project, "built")} == {(128, "sm_90a"), (128, "gfx942"), (256, "gfx942")}
    report = json.loads((project / "out" / "build-report.json").read_text())
    error = next(t["error"] for t in report["tasks"] if made.get(t["name"]) == (256, "sm_90a"))
    assert f"is none of the code its record lines were recorded from ({tagged('0' * 64)[:15]}...)" in error
    assert "specs/app.jsonl" in error


def test_lines_of_one_kernel_recorded_with_two_keys_on_one_arch_are_built_checked_against_either(project):
    """Two GPUs of one arch whose import gives the code another value (an SM count) record two keys for the same
    code: both are kept, and the compile builds where its code is either (it refused the family at 63491da)."""
    import importlib
    from kforge_runtime.source_key import source_key, tagged
    mine = tagged(source_key(importlib.import_module("tk.scale").scale_kernel))
    (project / "specs" / "app.jsonl").write_text("\n".join(
        [line(128, source_key=tagged("a" * 64)), line(256, source_key=mine), line(512, source_key="v1:" + "b" * 64),
         ""]))
    found = targets(project)
    assert {t.recorded_code for t in found.values()} == {tuple(sorted([tagged("a" * 64), mine, "v1:" + "b" * 64]))}
    doit(project, "-n", "1", env={"KFORGE_LOCAL_CACHE": "off"})
    assert len(statuses(project, "built")) == 3


@pytest.mark.parametrize("bad", ["x" * 64, 12, "ab"])
def test_a_malformed_source_key_is_one_error_naming_the_line(project, bad):
    (project / "specs" / "app.jsonl").write_text(line(128, source_key=bad) + "\n")
    with pytest.raises(SpecError, match=r"app.jsonl:1: source_key .* is not a digest \(v<n>: and hex digits\)"):
        targets(project)


def test_one_specialization_recorded_with_two_keys_keeps_both(project):
    """The same specialization recorded on two GPUs of an arch whose import gave the code another value (an SM
    count): one line each, one target; it kept only the first line's key, so a build whose code is the second's
    was refused as other code."""
    import importlib
    from kforge_runtime.source_key import source_key, tagged
    mine = tagged(source_key(importlib.import_module("tk.scale").scale_kernel))
    (project / "specs" / "app.jsonl").write_text("\n".join(
        [line(128, source_key=tagged("c" * 64)), line(128, source_key=mine), ""]))
    (found,) = targets(project).values()
    assert found.recorded_code == tuple(sorted([tagged("c" * 64), mine]))
    doit(project, "-n", "1", env={"KFORGE_LOCAL_CACHE": "off"})
    assert len(statuses(project, "built")) == 1



def test_a_parameter_named_as_an_option_builds_from_a_keyword_call_and_a_positional_one_fails_alone(project):
    """`num_warps: tl.constexpr` passed by keyword is the parameter and the option (32 warps); passed by position,
    the parameter's value and the option's default differ: a config holds one value per name, so that line was
    built with the option's value as the parameter's too, a binary no call matches. It fails alone, saying why."""
    (project / "tk" / "warps.py").write_text(WARPS_KERNEL)
    def warps_line(param, option):
        return json.dumps({"format": "kforge-record-1", "kernel": "tk.warps:warps_kernel", "arch": "sm_90a",
                           "signature": [["x_ptr", "*fp32"], ["n", "i32"], ["BLOCK", "constexpr"],
                                         ["num_warps", "constexpr"]],
                           "constexprs": {"BLOCK": 128, "num_warps": param}, "divisible_by_16": ["x_ptr"],
                           "options": {"num_warps": option, "num_stages": 3}})
    (project / "specs" / "app.jsonl").write_text("\n".join([warps_line(8, 8), warps_line(2, 4), ""]))
    doit(project, "-n", "1", env={"KFORGE_LOCAL_CACHE": "off"}, check=False)
    [meta] = [json.loads(m.read_text()) for m in (project / "out" / "sm_90a").glob("rec_*/*/meta.json")]
    assert meta["constexprs"]["num_warps"] == 8 and meta["num_warps"] == 8
    report = json.loads((project / "out" / "build-report.json").read_text())
    [failed] = [t for t in report["tasks"] if t["status"] == "failed"]
    assert "specs/app.jsonl:2: num_warps is the kernel's parameter (2) and, otherwise, its compile option (4)" \
        in failed["error"] and "the line is not built" in failed["error"]


@pytest.mark.parametrize("data, message", [
    (b"\xff\n", r"^specs/app\.jsonl: cannot read it \(.*\); a record file is UTF-8 JSON lines$"),
    (b"\n  \n", r"^specs/app\.jsonl: holds no record; record one with `python -m kforge_runtime\.record --out"),
    (line(64, constexprs=[64]).encode(), r"^specs/app\.jsonl:1: constexprs and options must be objects"),
])
def test_a_record_file_that_is_not_utf8_holds_no_record_or_a_list_for_an_object_is_one_error(tmp_path, data,
                                                                                               message):
    from kforge.declare import records
    (tmp_path / "app.jsonl").write_bytes(data)
    with pytest.raises(SpecError, match=message):
        records._lines(tmp_path / "app.jsonl", "specs/app.jsonl")


def test_a_line_whose_option_its_own_arch_cannot_take_fails_alone_and_the_kernels_others_load(project):
    """num_warps 64 on sm_90a (2,048 threads a block: no such launch ran there) failed the kernel's whole family,
    named by its first line with an [[exclude]] a record file cannot hold, and its built lines left the bundle (a
    hostile-input review)."""
    (project / "specs" / "app.jsonl").write_text("\n".join([line(128), line(256), line(1024, warps=64), ""]))
    catalog = Catalog(project, None, 50_000).load(keep_going=True)
    assert sorted(dict(t.constexprs)["BLOCK"] for t in catalog.targets) == [128, 256]
    assert [b.error for b in catalog.broken] == [
        "specs/app.jsonl:3: options num_warps: num_warps 64 x 32 threads is more than 1024 threads a block; the line "
        "is not built (served, such a call compiles with Triton): remove it to build clean"]


def test_a_line_whose_option_no_arch_takes_fails_alone_named_by_its_line_and_the_kernels_others_load(project):
    """A 4th line with num_warps 3 was `specs/app.jsonl:1 (and 3 more lines): ...: [extra] num_warps: got 3`: the
    kernel's first line and a spec table no record file has, and its three good lines failed with it. The line is
    a family of its own now, as a value kforge cannot build is (_unbuildable): named, in the record's terms."""
    (project / "specs" / "app.jsonl").write_text("\n".join([line(128), line(256), line(512), line(1024, warps=3), ""]))
    catalog = Catalog(project, None, 50_000).load(keep_going=True)
    assert sorted(dict(t.constexprs)["BLOCK"] for t in catalog.targets) == [128, 256, 512]
    assert [b.error for b in catalog.broken] == [
        "specs/app.jsonl:4: options num_warps: got 3; allowed: a power of two, at most 1024 threads a block (checked "
        "per arch); the line is not built (served, such a call compiles with Triton): remove it to build clean"]
