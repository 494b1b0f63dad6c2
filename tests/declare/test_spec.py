"""Spec validation: every bad input stops with one message naming the file, the key, the value and the fix."""
import re

import pytest

from kforge.declare.spec import SpecError, load_spec
from tests.support import kernel_text, make_project, spec_text


def load(tmp_path, text, kernel=None):
    root = make_project(tmp_path, specs={"s": text}, kernels={"scale": kernel or kernel_text()})
    return load_spec(root / "specs" / "s.toml", root)


def error(tmp_path, text, kernel=None) -> str:
    with pytest.raises(SpecError) as e:
        load(tmp_path, text, kernel)
    assert "specs/s.toml" in str(e.value) and "\n" not in str(e.value)
    return str(e.value)


def test_valid_spec_loads(tmp_path):
    spec = load(tmp_path, spec_text(dtypes=("fp16", "bfloat16"), blocks=(128, 256)))
    assert spec.name == "scale" and spec.archs == ("sm_90a",)
    assert len(spec.configs) == 4
    assert {dict(c)["dtype"] for c in spec.configs} == {"fp16", "bf16"}   # alias made canonical


@pytest.mark.parametrize("edit, expected", [
    (('toolchain = "triton"', 'toolchain = "cuda"'), ["toolchain", "'cuda'", "allowed: triton"]),
    (('toolchain = "triton"', 'toolchian = "triton"'), ["unknown key 'toolchian'", "allowed:"]),
    (('archs = ["sm_90a"]', 'archs = ["sm_91"]'), ["archs", "'sm_91'", "gfx942"]),
    (('archs = ["sm_90a"]', 'archs = "sm_90a"'), ["archs", "expected", "(str)"]),
    (('dtype = ["fp16"]', 'dtype = ["fp17"]'), ["dtype", "'fp17'", "bf16"]),
    (('dtype = ["fp16"]', 'dtype = []'), ["dtype", "empty list"]),
    (('source = "tk/scale.py"', 'source = "tk/nope.py"'), ["source", "tk/nope.py", "does not exist"]),
    (('source = "tk/scale.py"', 'source = "tk"'), ["source", "'tk'", "is a folder, not a Python file"]),
    (('id = "', 'id = "" # "'), ["[kernel] id", "is empty", "leave id out"]),
    (('entry = "scale_kernel"', 'entry = "missing_kernel"'), ["entry", "missing_kernel", "scale_kernel"]),
    (('n = "i32"', 'n = "i33"'), ["[signature] n", "'i33'"]),
    (('n = "i32"\n', ''), ["must list the arguments", "'n'"]),
    (('num_warps = [4]', 'num_warps = [4]\nWIDTH = [1]'), ["WIDTH", "not a parameter"]),
    # a runtime argument of an entry that reads no arguments at load: said as such, not "not a parameter"
    (('num_warps = [4]', 'num_warps = [4]\nn = [1024]'), ["[sweep] n: a runtime i32 argument of scale_kernel",
                                                         "shape hint", "remove it"]),
    (('num_warps = [4]', 'num_warps = [3]'), ["num_warps", "3", "allowed"]),
    (('num_warps = [4]', 'num_warps = ["4"]'), ["num_warps", "'4'"]),
    (('name = "scale"', 'name = "Scale-1"'), ["name", "'Scale-1'", "lower_snake_case"]),
    (('[hints]', '[hint]'), ["unknown table [hint]"]),
    (('divisible_by_16 = ["x_ptr", "y_ptr"]', 'divisible_by_16 = ["z_ptr"]'), ["divisible_by_16", "'z_ptr'"]),
    (('id = "{dtype}-b{BLOCK}-w{num_warps}"', 'id = "{dtype}"'), ["both get id", "add the differing"]),
    (('id = "{dtype}-b{BLOCK}-w{num_warps}"', 'id = "{dtype}-{WIDTH}"'), ["placeholder {WIDTH}"]),
    (('[kernel]', 'x = 1\n[kernel]'), ["unknown table [x]"]),
    (('n = "i32"', 'n = "i32'), ["not valid TOML"]),
    (('archs = ["sm_90a"]', 'archs = ["sm_90a", "gfx942", "sm_90a"]'), ["archs", "'sm_90a'", "listed twice"]),
    (('id = "{dtype}-b{BLOCK}-w{num_warps}"', 'id = "{dtype"'), ["[kernel] id: '{dtype' is not a template"]),
    (('id = "{dtype}-b{BLOCK}-w{num_warps}"', 'id = "}{dtype}"'), ["[kernel] id: '}{dtype}' is not a template"]),
    (('source = "tk/scale.py"', 'source = "pyproject.toml"'), ["[kernel] source: 'pyproject.toml' is not Python",
                                                              "(line 3: "]),
    (('source = "tk/scale.py"', f'source = "tk/{"x" * 300}.py"'), ["[kernel] source: cannot look up 'tk/xxx",
                                                                    "(File name too long)"]),
    (('num_warps = [4]', 'num_warps = [4]\n"a\\nb" = [1]'), ["[sweep] 'a\\nb': not a name"]),
    (('num_warps = [4]', f'num_warps = [4]\n{"W" * 101} = [1]'), ["[sweep] 'WWW", "not a name", "at most 100"]),
    (('[hints]', '["hi\\nts"]'), ["unknown table ['hi\\nts']"]),
    (('divisible_by_16 = ["x_ptr", "y_ptr"]', 'divisible_by_16 = ["x_ptr", "y_ptr", "x_ptr"]'),
     ["[hints] divisible_by_16: got 'x_ptr'; allowed: each argument once (this one is listed twice)"]),
    (('BLOCK = [128, 256]', f'BLOCK = [{"9" * 5000}]'), ["not valid TOML: Exceeds the limit (4300 digits)",
                                                       "allowed: TOML's 64-bit integers"]),
    (('BLOCK = [128, 256]', f'BLOCK = [0x{"f" * 4000}]'), ["[sweep] BLOCK: got an integer of 16000 bits",
                                                         "allowed: TOML's 64-bit integers"]),
    (('BLOCK = [128, 256]', f'BLOCK = [128, {"[" * 1000}{"]" * 1000}]'), ["not valid TOML: arrays or tables nested"]),
    (('n = "i32"', f'n = {list(range(20000))}'), ["[signature] n: expected argument type", "[0, 1, 2, 3,",
                                                  "... (128,890 characters) (list)"]),
])
def test_bad_spec_names_file_key_value(tmp_path, edit, expected):
    old, new = edit
    text = spec_text(blocks=(128, 256))
    assert old in text
    message = error(tmp_path, text.replace(old, new, 1))
    for part in expected:
        assert part in message, (part, message)


def test_exclude_that_matches_nothing_is_an_error(tmp_path):
    message = error(tmp_path, spec_text() + '\n[[exclude]]\nBLOCK = 999\n')
    assert "[[exclude]] #1" in message and "matches no config" in message


def test_sweep_empty_after_excludes(tmp_path):
    message = error(tmp_path, spec_text() + '\n[[exclude]]\nBLOCK = 256\n')
    assert "empty after [[exclude]]" in message


def test_constexpr_without_value(tmp_path):
    text = spec_text().replace("BLOCK = [256]\n", "")
    assert "constexpr BLOCK has no value" in error(tmp_path, text)


def test_missing_required_table_and_key(tmp_path):
    assert error(tmp_path, spec_text().split("[sweep]")[0]) == (   # said what to put there (mamba-ssm's review)
        "specs/s.toml: missing table [sweep]; add it: the values swept, one config each combination (empty where the "
        "entry's @triton.autotune configs are all the configs)")
    assert "missing key 'entry'" in error(tmp_path, spec_text().replace('entry = "scale_kernel"\n', ""))


TUNED_KERNEL = '''
import triton
import triton.language as tl


@triton.autotune(configs=[triton.Config({"BLOCK": 64}, num_warps=4), triton.Config({"BLOCK": 64}, num_warps=4),
                          triton.Config({"BLOCK": 128}, num_warps=8)], key=["n"])
@triton.jit
def tuned_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + i, tl.load(x_ptr + i, mask=i < n), mask=i < n)


@triton.heuristics({"BLOCK": lambda args: 64})
@triton.jit
def heuristic_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + i, tl.load(x_ptr + i, mask=i < n), mask=i < n)
'''


def wrapped_spec(entry, more=""):
    return spec_text(dtypes=("fp16",)).replace("scale_kernel", entry).replace('id = "{dtype}-b{BLOCK}-w{num_warps}"\n',
                                                                             "").split("BLOCK = [")[0] + more


def test_what_an_autotuner_lists_twice_is_one_config_what_the_spec_lists_twice_is_refused(tmp_path):
    """A library's @triton.autotune may list a config twice, and a spec's [[extra]] may be one of its configs: not
    the spec's to fix, so one target each. A value the spec's own [override] list gives twice is refused, and an
    [[extra]] is numbered as the spec numbers it (the autotuner's configs made before it are not counted)."""
    from kforge.declare.sweep import config_id
    extra = '\n[[extra]]\ndtype = "fp16"\nBLOCK = 128\nnum_warps = 8\nnum_stages = 3\n'
    spec = load(tmp_path / "a", wrapped_spec("tuned_kernel", extra), kernel=TUNED_KERNEL)
    assert [config_id(spec, c) for c in spec.configs] == ["fp16-block64-num_warps4-num_stages3",
                                                          "fp16-block128-num_warps8-num_stages3"]
    message = error(tmp_path / "b", wrapped_spec("tuned_kernel", extra.replace("num_stages = 3\n", "")), TUNED_KERNEL)
    assert message.startswith("specs/s.toml: [[extra]] #1 must give exactly the swept parameters")
    message = error(tmp_path / "c", wrapped_spec("heuristic_kernel", "[override]\nBLOCK = [64, 128, 64]\n"),
                    TUNED_KERNEL)
    assert message == "specs/s.toml: [override] BLOCK: got 64; allowed: each value once (this one is listed twice)"


def test_extra_must_give_every_swept_parameter(tmp_path):
    message = error(tmp_path, spec_text() + '\n[[extra]]\ndtype = "fp16"\n')
    assert "[[extra]] #1" in message and "BLOCK" in message


TUNE = '''
[tune]
harness = "tk/scale_tune.py"
shape_args = ["n"]
shapes = [[1000], [1000000]]
'''
HARNESS = "def problem(shape, types, device):\n    pass\n\n\ndef grid(shape, config):\n    pass\n"


def load_tuned(tmp_path, tune_text, harness=HARNESS):
    root = make_project(tmp_path, specs={"s": spec_text() + tune_text},
                        kernels={"scale": kernel_text(), "scale_tune": harness})
    return load_spec(root / "specs" / "s.toml", root)


def test_tune_table_loads(tmp_path):
    spec = load_tuned(tmp_path, TUNE)
    assert spec.tune.shape_args == ("n",) and spec.tune.shapes == ((1000,), (1000000,))
    assert spec.tune.harness == "tk/scale_tune.py"


@pytest.mark.parametrize("edit, expected", [
    (('"tk/scale_tune.py"', '"tk/nope.py"'), ["[tune] harness", "tk/nope.py", "does not exist"]),
    (('shape_args = ["n"]', 'shape_args = ["x_ptr"]'), ["[tune] shape_args", "'x_ptr'", "integer runtime arguments: n"]),
    (('shape_args = ["n"]', 'shape_args = []'), ["[tune] shape_args", "non-empty"]),
    (('[[1000], [1000000]]', '[]'), ["[tune] shapes", "non-empty"]),
    (('[[1000], [1000000]]', '[[1000], [0]]'), ["[tune] shapes", "[0]", "positive integers (n)"]),
    (('[[1000], [1000000]]', '[[1000, 2]]'), ["[tune] shapes", "[1000, 2]", "1 positive integers"]),
    (('[[1000], [1000000]]', '[[1000], [1000]]'), ["[tune] shapes", "listed twice"]),
    (('[[1000], [1000000]]', '[1000]'), ["[tune] shapes", "[tune] shapes: got 1000"]),
    (('shapes =', 'shape ='), ["[tune] unknown key 'shape'"]),
])
def test_bad_tune_table_names_the_key(tmp_path, edit, expected):
    old, new = edit
    assert old in TUNE
    with pytest.raises(SpecError) as e:
        load_tuned(tmp_path, TUNE.replace(old, new, 1))
    for part in ["specs/s.toml", *expected]:
        assert part in str(e.value), (part, str(e.value))


def test_a_kernel_source_that_is_not_python_is_one_error_naming_it(tmp_path):
    message = error(tmp_path, spec_text(), kernel=kernel_text() + "\ndef broken(:\n")
    assert "[kernel] source: 'tk/scale.py' is not Python kforge can read (line 12: invalid syntax)" in message
    message = error(tmp_path / "nul", spec_text(), kernel=kernel_text() + "\0")
    assert "[kernel] source: 'tk/scale.py' is not Python kforge can read (" in message and "null bytes" in message


def test_a_tune_harness_that_is_not_python_is_one_error_naming_it(tmp_path):
    with pytest.raises(SpecError, match=r"specs/s.toml: \[tune\] harness: 'tk/scale_tune.py' is not Python kforge "
                                        r"can read \(line 1: invalid syntax\)"):
        load_tuned(tmp_path, TUNE, harness="def problem(:\n")


def test_tune_harness_must_define_problem_and_grid(tmp_path):
    with pytest.raises(SpecError, match=r"harness: tk/scale_tune.py must define problem, grid; missing grid"):
        load_tuned(tmp_path, TUNE, harness="def problem(shape, types, device):\n    pass\n")


def test_a_spec_that_is_not_readable_utf8_text_is_one_error_naming_it(tmp_path):
    root = make_project(tmp_path, specs={})
    (root / "specs" / "latin1.toml").write_bytes(b'[kernel]\nname = "caf\xe9"\n')
    with pytest.raises(SpecError, match=r"specs/latin1.toml: not UTF-8 text \(byte 20: invalid"):
        load_spec(root / "specs" / "latin1.toml", root)
    (root / "specs" / "dir.toml").mkdir()
    with pytest.raises(SpecError, match=r"specs/dir.toml: not a file \(a folder\)"):
        load_spec(root / "specs" / "dir.toml", root)


def test_a_spec_or_record_file_of_gigabytes_is_one_error_not_read_whole(tmp_path, monkeypatch):
    from kforge.declare import records, spec
    root = make_project(tmp_path, specs={})
    monkeypatch.setattr(spec, "SPEC_LIMIT", 1 << 20)
    monkeypatch.setattr(records, "RECORD_LIMIT", 1 << 20)
    for name in ("big.toml", "big.jsonl"):
        with open(root / "specs" / name, "wb") as f:
            f.truncate((1 << 20) + 1)   # sparse: the size of a huge file, no disk
    with pytest.raises(SpecError, match=r"specs/big.toml: too large for a spec \(over 1 MiB\)"):
        load_spec(root / "specs" / "big.toml", root)
    with pytest.raises(SpecError, match=r"specs/big.jsonl: too large for a record file \(over 1 MiB\); record fewer"):
        records.read(root / "specs" / "big.jsonl", "specs/big.jsonl")


def test_a_tune_harness_outside_the_project_is_refused(tmp_path):
    outside = tmp_path / "elsewhere_tune.py"
    outside.write_text(HARNESS)
    with pytest.raises(SpecError, match=r"\[tune\] harness: '../elsewhere_tune.py' is not the project's own source: "
                                        r"it is outside the project"):
        load_tuned(tmp_path / "p", TUNE.replace('"tk/scale_tune.py"', '"../elsewhere_tune.py"'))


def test_a_family_named_like_a_kforge_task_or_a_doit_command_is_refused(tmp_path):
    message = error(tmp_path, spec_text().replace('name = "scale"', 'name = "package"', 1))
    assert "[kernel] name: 'package' is the name of a kforge task or doit command" in message


def test_a_spec_that_is_not_a_regular_file_is_refused_before_it_is_read(tmp_path):
    import os
    from kforge.plan.catalog import load_specs
    (tmp_path / "specs").mkdir()
    os.mkfifo(tmp_path / "specs" / "pipe.toml")   # reading it would block forever
    with pytest.raises(SpecError, match=r"^specs/pipe.toml: not a regular file \(a pipe, a device or a broken link"):
        load_specs(tmp_path)
    os.unlink(tmp_path / "specs" / "pipe.toml")
    (tmp_path / "specs" / "folder.toml").mkdir()
    with pytest.raises(SpecError, match=r"^specs/folder.toml: not a regular file \(a folder\)"):
        load_specs(tmp_path)


def test_device_model_setup_and_per_arch_environments_load(tmp_path):
    text = spec_text(archs=("sm_90a", "gfx942")).replace(
        'toolchain = "triton"', 'toolchain = "triton"\nsetup = "tk.hooks:prepare"') + (
        '\n[env]\nLIB_MODE = "fast"\nLIB_CONFIGS = "all"\n\n[arch.gfx942.env]\nLIB_CONFIGS = "amd"\n')
    spec = load(tmp_path, text)
    assert spec.device_model is True and spec.setup == ("tk.hooks:prepare",)
    assert spec.env_on("sm_90a") == (("LIB_CONFIGS", "all"), ("LIB_MODE", "fast"))
    assert spec.env_on("gfx942") == (("LIB_CONFIGS", "amd"), ("LIB_MODE", "fast"))   # over [env]
    assert spec.on_arch("gfx942") == {}   # the env table is not a constexpr
    assert spec.importing("gfx942") == {"env": spec.env_on("gfx942"), "arch": "gfx942", "model": True,
                                        "setup": ("tk.hooks:prepare",)}
    off = load(tmp_path / "off", spec_text().replace('toolchain = "triton"',
                                                     'toolchain = "triton"\ndevice_model = false'))
    assert off.device_model is False and off.importing("sm_90a")["arch"] is None   # one probe for every arch


def test_the_projects_set_up_hook_runs_before_the_familys(tmp_path):
    root = make_project(tmp_path, specs={"s": spec_text().replace('toolchain = "triton"',
                                                                  'toolchain = "triton"\nsetup = "tk.b:own"')})
    with open(root / "pyproject.toml", "a") as f:
        f.write('\n[tool.kforge]\nsetup = "tk.a:first"\n')
    assert load_spec(root / "specs" / "s.toml", root).setup == ("tk.a:first", "tk.b:own")


@pytest.mark.parametrize("edit, expected", [
    (('toolchain = "triton"', 'toolchain = "triton"\ndevice_model = "no"'), ["[kernel] device_model: expected"]),
    (('toolchain = "triton"', 'toolchain = "triton"\nsetup = "tk.hooks"'), ["[kernel] setup: got 'tk.hooks'",
                                                                          "'module:function'"]),
    (('[sweep]', '[arch.sm_90a.env]\nPATH = "/x"\n\n[sweep]'), ["[arch.sm_90a.env] PATH: not a variable"]),
    (('[sweep]', '[arch.sm_90a.env]\nLIB = 1\n\n[sweep]'), ["[arch.sm_90a.env] LIB: expected a string, got 1"]),
    (('[sweep]', '[arch.gfx942.env]\nLIB = "x"\n\n[sweep]'), ["[arch] gfx942", "one of the spec's archs: sm_90a"]),
])
def test_bad_device_model_setup_or_arch_env_names_the_key(tmp_path, edit, expected):
    old, new = edit
    message = error(tmp_path, spec_text().replace(old, new, 1))
    for part in expected:
        assert part in message, (part, message)


@pytest.mark.parametrize("option, value", [("num_warps", "8"), ("num_stages", "2"), ("maxnreg", "128"),
                                           ("waves_per_eu", "2"), ("debug", "true")])
def test_any_compile_option_under_constants_is_refused_naming_where_it_belongs(tmp_path, option, value):
    """A compile option is no argument of the entry: under [constants] the refusal says it is an option and that it
    goes in [sweep] (or per arch, in [arch.<arch>]), not only "not a constexpr"; the line it offers is TOML
    (`debug = [true]`, never Python's `[True]`)."""
    text = spec_text().replace("num_warps = [4]", "").replace("-w{num_warps}", "").split("[sweep]")
    text = text[0] + f"[constants]\n{option} = {value}\n\n[sweep]" + text[1]
    root = make_project(tmp_path, specs={"s": text})
    with pytest.raises(SpecError) as e:
        load_spec(root / "specs" / "s.toml", root)
    assert str(e.value) == (f"specs/s.toml: [constants] {option}: {option} is a compile option, not a constexpr of "
                            f"scale_kernel; set it in [sweep] (`{option} = [{value}]`), or for one arch in "
                            f"[arch.<arch>]")


@pytest.mark.parametrize("kind, said", [("fifo", "is not a regular file (a FIFO or pipe)"),
                                        ("device", "is not a regular file (a terminal or character device)"),
                                        ("broken link", "is a broken link")])
def test_a_source_that_is_no_regular_file_says_what_it_is(tmp_path, kind, said):
    """A FIFO or a link to /dev/zero given as `source` was "does not exist": the user looked for a file that
    is there."""
    import os
    root = make_project(tmp_path, specs={"s": spec_text().replace("tk/scale.py", "tk/odd.py")})
    odd = root / "tk" / "odd.py"
    if kind == "fifo":
        os.mkfifo(odd)
    else:
        odd.symlink_to("/dev/zero" if kind == "device" else root / "nowhere.py")
    with pytest.raises(SpecError) as e:
        load_spec(root / "specs" / "s.toml", root)
    assert f"[kernel] source: file 'tk/odd.py' {said} (looked for" in str(e.value)


@pytest.mark.parametrize("key", ['""', '"A=B"', '"A\\u0000B"', '"lower"', "HOME", "XDG_CACHE_HOME"])
def test_a_bad_env_name_says_what_a_variable_name_must_be(tmp_path, key):
    """[env] keys were refused as "the kernel's argument and parameter names", which [env] has none of. HOME and
    XDG_CACHE_HOME decide where kforge keeps its local cache and bytecode: a family's [env] set the second and kforge
    wrote there (a hostile-input review)."""
    message = error(tmp_path, spec_text() + f'\n[env]\n{key} = "x"\n')
    assert "[env] " in message and "not a variable a family may set; allowed: an environment variable's name " \
        "(upper-case letters, digits and _, not starting with a digit)" in message
    assert "argument and parameter names" not in message


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "[1.0, nan]"])
def test_a_toml_nan_or_inf_is_refused_naming_the_key(tmp_path, value):
    """TOML's nan and inf were taken as swept values (a record line refuses them): NaN equals no launch's value,
    and the bundle's manifest held a bare NaN, which is no JSON (a hostile-input review)."""
    message = error(tmp_path, spec_text() + f"\n[constants]\nn = {value}\n")
    assert "[constants] n: got " in message and "allowed: a finite number" in message


@pytest.mark.parametrize("description", ["ok\x1b]0;pwned\x07", "two\nlines", "tab\there", "x" * 301])
def test_a_description_that_is_not_one_short_line_is_refused(tmp_path, description):
    """`doit list` prints a family's description as it is: an escape sequence set the window's title or cleared
    the screen, and a 20,000-character one filled it."""
    import json
    text = spec_text().replace("[kernel]\n", f"[kernel]\ndescription = {json.dumps(description)}\n", 1)
    assert "[kernel] description: not one line of text" in error(tmp_path, text)


FLY_FACTORY = "def build(dtype_str, VEC, ELEMS):\n    pass\n"
FLY_SPEC = '''
[kernel]
name = "flycopy"
source = "tk/scale.py"
entry = "build"
toolchain = "flydsl"
archs = ["gfx942"]

[signature]
X = "*{dtype}"
VEC = "constexpr"
ELEMS = "constexpr"

[constants]
ELEMS = 1024

[sweep]
dtype = ["fp16", "bf16"]
VEC = [8]

[adapter]
arguments = {dtype = "dtype_str"}
dtype_names = {fp16 = "f16", bf16 = "bf16"}
shapes = {X = [1024]}
'''


@pytest.mark.parametrize("old, new", [
    ('dtype_names = {fp16 = "f16", bf16 = "bf16"}', 'dtype_names = {fp16 = "f16", bf16 = "f16"}'),
    ('arguments = {dtype = "dtype_str"}', 'arguments = {dtype = "dtype_str", VEC = "dtype_str"}'),
    ('arguments = {dtype = "dtype_str"}', 'arguments = {dtype = "dtype_str", ELEMS = "VEC"}'),
])
def test_an_adapter_mapping_two_names_to_one_is_refused_naming_both(tmp_path, old, new):
    """Two element types given one builder name built bf16's configs as f16 code under bf16's ids; two parameters
    passed as one argument lost one of them in the call."""
    assert load(tmp_path / "ok", FLY_SPEC, FLY_FACTORY).adapter
    said = error(tmp_path / "bad", FLY_SPEC.replace(old, new), FLY_FACTORY)
    if "dtype_names" in new:
        assert said == ("specs/s.toml: [adapter] dtype_names: got {'bf16': 'f16'}; allowed: one element type per "
                        "builder name ('fp16' is 'f16' too)")
    else:
        assert said.startswith("specs/s.toml: [adapter] arguments: got {") and "each builder argument once (" in said


LONG = "x" * 100_000


@pytest.mark.parametrize("old, new, said", [
    ('id = "{dtype}-b{BLOCK}"', f'id = "{" " * 100_000}"', "[kernel] id: '    "),
    ('[sweep]', f'[arch.sm_90a]\ndefault_dot_input_precision = "{LONG}"\n\n[sweep]',
     "[arch.sm_90a] default_dot_input_precision: got 'xxx"),
    ('[sweep]', f'[arch.sm_90a]\nnum_warps = {LONG.replace("x", "9")[:18]}\n\n[sweep]',
     "[arch.sm_90a] num_warps: got 999"),
])
def test_a_value_of_thousands_of_characters_is_one_short_line(tmp_path, old, new, said):
    """A blank id of 100,000 spaces or a 100,000-character option on one arch was written whole into the message."""
    text = spec_text(blocks=(128, 256)).replace("num_warps = [4]\n", "").replace("-w{num_warps}", "")
    assert old in text
    message = error(tmp_path, text.replace(old, new, 1))
    assert message.startswith(f"specs/s.toml: {said}") and len(message) < 600, message[:300]


def test_an_adapter_name_of_thousands_of_characters_is_one_short_line(tmp_path):
    text = FLY_SPEC.replace('dtype_names = {fp16 = "f16", bf16 = "bf16"}',
                            f'dtype_names = {{fp16 = "{LONG}", bf16 = "{LONG}"}}')
    message = error(tmp_path, text, FLY_FACTORY)
    assert message.startswith("specs/s.toml: [adapter] dtype_names: got {'bf16': 'xxx") and len(message) < 600


@pytest.mark.parametrize("default, said", [
    ("2 * 128", "its default in the source, '2 * 128', is not one kforge reads"),
    ("128", None),   # a literal: read, and the spec needs no value
    # a dtype: a string in [constants] reached Triton as a string ('str' object has no attribute 'to_ir')
    ("tl.int32", "its default in the source, 'tl.int32', is a dtype; declare `BLOCK = \"dtype\"` in [signature] and "
                 "give it in [constants] or [sweep] (`BLOCK = \"i32\"`)"),
])
def test_a_constexpr_whose_default_kforge_does_not_read_says_so(tmp_path, default, said):
    """`constexpr BLOCK has no value` read as if the def had no default (an outside review: a default imported
    from a namespace package was skipped without a word); the message now quotes the default it did not read."""
    kernel = kernel_text().replace("BLOCK: tl.constexpr)", f"BLOCK: tl.constexpr = {default})")
    text = spec_text().replace('"{dtype}-b{BLOCK}-w{num_warps}"', '"{dtype}-w{num_warps}"').replace(
        "BLOCK = [256]\n", "")
    root = make_project(tmp_path, specs={"s": text}, kernels={"scale": kernel})
    if said is None:
        assert dict(load_spec(root / "specs" / "s.toml", root).constants)["BLOCK"] == 128
        return
    with pytest.raises(SpecError, match="constexpr BLOCK has no value: " + re.escape(said)):
        load_spec(root / "specs" / "s.toml", root)


@pytest.mark.parametrize("old, new, said", [
    ('archs = ["sm_90a"]', 'archs = []', "[kernel] archs: got []; allowed: a non-empty list of sm_80"),
    ('num_warps = [4]\n', 'num_warps = [4]\n\n[env]\nFOO = "a\\u0000b"\n',
     "[env] FOO: a value may not hold a NUL character"),
    ('num_warps = [4]\n', 'num_warps = [4]\n\n[arch.sm_90a.env]\nFOO = "a\\u0000b"\n',
     "[arch.sm_90a.env] FOO: a value may not hold a NUL character"),
    ('num_warps = [4]\n', 'num_warps = [4]\n\n[adapter]\narguments = {}\n',
     "[adapter] is for toolchain 'flydsl' builders; a Triton entry needs none"),
])
def test_an_empty_archs_a_nul_in_env_or_an_adapter_on_triton_is_one_line(tmp_path, old, new, said):
    """spec.py's checks of archs = [], a NUL in an [env] value and [adapter] on a Triton entry (reachable from a
    spec, never run in the whole suite's coverage)."""
    text = spec_text()
    assert old in text
    assert error(tmp_path, text.replace(old, new, 1)).startswith(f"specs/s.toml: {said}")


@pytest.mark.parametrize("old, new, said", [
    ('ELEMS = "constexpr"', 'ELEMS = "constexpr"\nZ = "none"',
     "[signature] Z: got 'none'; allowed: types of a FlyDSL launcher's arguments ('none' is Triton's)"),
    ('arguments = {dtype = "dtype_str"}', 'arguments = {dtype = "dtype_str", X = "x"}',
     "[adapter] arguments: got {'X': 'x'}; allowed: a compile-time parameter of the spec"),
    ('fp16 = "f16",', 'fp17 = "f16",', "[adapter] dtype_names: got {'fp17': 'f16'}; allowed: element types ("),
    ('fp16 = "f16",', 'fp16 = 3,', "[adapter] dtype_names: got {'fp16': 3}; allowed: element types ("),
    ('shapes = {X = [1024]}', 'shapes = {}', "[adapter] shapes: got {'X': None}; allowed: for each tensor argument (X)"),
    ('shapes = {X = [1024]}', 'shapes = {X = [0]}', "[adapter] shapes: got {'X': [0]}; allowed: for each tensor"),
    ('shapes = {X = [1024]}', 'shapes = {X = [1024], S = [1]}\n\n[signature]\nS = "i32"',
     "[adapter] shapes: got {'S': [1]}; allowed: shapes only for tensor (pointer) arguments"),
    ('shapes = {X = [1024]}', 'shapes = {X = [1024]}\nscalars = {X = 1}',
     "[adapter] scalars: got {'X': 1}; allowed: scalar runtime arguments mapped to a number"),
    ('shapes = {X = [1024]}', 'shapes = {X = [1024], Q = [1]}', "[adapter] shapes: got 'Q'; allowed: runtime arguments: "),
    ('[adapter]', '[tune]\nharness = "tk/scale.py"\nshape_args = ["X"]\nshapes = [[1]]\n\n[adapter]',
     "[tune] needs toolchain 'triton'"),
])
def test_a_bad_flydsl_signature_adapter_or_tune_is_one_line(tmp_path, old, new, said):
    """spec.py's checks of a 'none' argument, [tune] and each [adapter] key of a FlyDSL builder (reachable from a
    spec, never run in the whole suite's coverage)."""
    assert old in FLY_SPEC
    text = FLY_SPEC.replace(old, new, 1)
    if "S = " in new:   # a second [signature] table is not TOML: S goes into the one there is
        text = FLY_SPEC.replace('X = "*{dtype}"', 'X = "*{dtype}"\nS = "i32"').replace(old, new.split("\n\n")[0], 1)
    assert error(tmp_path, text, FLY_FACTORY).startswith(f"specs/s.toml: {said}")


@pytest.mark.parametrize("module, text, said", [
    ("ops_nul", "x = 1\0\n", "(source code string cannot contain null bytes (ops_nul.py))"),
    ("ops_syntax", "def (:\n", "(invalid syntax (ops_syntax.py, line 1))"),
])
def test_an_installed_module_or_a_source_that_is_not_python_is_one_line(tmp_path, monkeypatch, module, text, said):
    """spec.py's _installed_python and _project_python on a file Python does not parse (a NUL in it): reachable
    from a broken install or a project file, never run in the whole suite's coverage."""
    site = tmp_path / "site"
    (site / "nulpkg").mkdir(parents=True)
    (site / "nulpkg" / "__init__.py").write_text("")
    (site / f"nulpkg/{module}.py").write_text(text)
    monkeypatch.syspath_prepend(str(site))
    spec = spec_text().replace('source = "tk/scale.py"', f'module = "nulpkg.{module}"')
    message = error(tmp_path / "a", spec)
    assert message.startswith(f"specs/s.toml: [kernel] module: nulpkg.{module} ({site}/nulpkg/{module}.py) is not "
                              f"Python kforge can read {said}; reinstall the package"), message
    if "\0" in text:
        message = error(tmp_path / "b", spec_text(), text)
        assert message.startswith("specs/s.toml: [kernel] source: 'tk/scale.py' is not Python kforge can read "
                                  "(source code string cannot contain null bytes); fix the file"), message


AUTOTUNED = '''
import triton
import triton.language as tl


@triton.autotune(configs=[triton.Config({"BLOCK": 64}), CONFIG], key=["n"])
@triton.jit
def tuned_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + i, tl.load(x_ptr + i, mask=i < n), mask=i < n)
'''


@pytest.mark.parametrize("config, more, said", [
    ('triton.Config({"BLOCK": 128})', "BLOCK = [64]\n",
     "[sweep] BLOCK: chosen by tk.scale.tuned_kernel's @triton.autotune configs; remove it from [sweep] (an "
     "[[exclude]] filters the autotune configs)"),
    ('triton.Config({"BLOCK": 128, "n": 3})', "",
     "tk.scale.tuned_kernel's @triton.autotune configs set different parameters (['BLOCK', 'num_stages', "
     "'num_warps'] and ['BLOCK', 'n', 'num_stages', 'num_warps']); kforge sweeps configs that set the same ones"),
    ('triton.Config({"BLOCK": 128})\ntuned_kernel.configs = []', "",
     "tk.scale.tuned_kernel's @triton.autotune lists no configs; give it at least one"),
])
def test_autotune_configs_kforge_cannot_sweep_are_one_line(tmp_path, config, more, said):
    """spec.py's _with_autotune checks (reachable from a library's @triton.autotune, never run in the whole suite's
    coverage). Triton itself fills an empty configs= with one default: a list emptied after the decorator is the
    one way to none."""
    kernel = AUTOTUNED.replace("CONFIG], key", config.split("\n")[0] + "], key") + "\n".join(
        [""] + config.split("\n")[1:]) + "\n"
    assert error(tmp_path, wrapped_spec("tuned_kernel", more), kernel) == f"specs/s.toml: {said}"


@pytest.mark.parametrize("old, new, said", [
    ('n = "i32"', 'nn = "i32"', "'nn' is no argument of it"),
    ('n = "i32"\n', '', "'n' is missing"),
    ('x_ptr = "*{dtype}"\ny_ptr = "*{dtype}"', 'y_ptr = "*{dtype}"\nx_ptr = "*{dtype}"', "the order differs"),
])
def test_a_signature_that_differs_from_the_source_names_the_argument_to_fix(tmp_path, old, new, said):
    """A typo in one of 16 names printed both lists and left the user to find it (an outside review with torchao)."""
    text = spec_text()
    assert old in text
    assert error(tmp_path, text.replace(old, new, 1)).startswith(
        f"specs/s.toml: [signature] must list the arguments of scale_kernel in order: {said}; got [")


@pytest.mark.parametrize("given", ["(i32, i32, i32, i32)", "[i32,i32]"])
def test_a_tuple_argument_is_refused_in_one_line_saying_kforge_does_not_build_it(tmp_path, given):
    """mamba-ssm's rotary kernel indexes stride_q[0] of a tuple it is launched with: its type was refused with the
    list of scalar types, and "i32" loaded, then failed inside Triton with `unsupported tensor index`."""
    text = spec_text()
    assert error(tmp_path, text.replace('n = "i32"', f'n = "{given}"', 1)) == (
        f"specs/s.toml: [signature] n: got '{given}': kforge does not build kernels taking a tuple argument; leave "
        f"this kernel to Triton's JIT, or give the kernel one argument per element (docs/spec_format.md)")


def test_archs_given_as_one_string_is_told_to_be_a_list(tmp_path):
    """`archs = "sm_90a"` said 'expected archs to build for' (an outside review with torchao)."""
    text = spec_text().replace('archs = ["sm_90a"]', 'archs = "sm_90a"')
    assert error(tmp_path, text).startswith("specs/s.toml: [kernel] archs: expected a list of archs to build for, e.g. "
                                            "[\"sm_90a\"]")


def test_a_swept_value_typo_fails_before_the_module_is_imported_for_its_autotune_configs(tmp_path):
    """A probe per arch imports an autotuned family's module (seconds each for a large library): a dtype or an
    option value that cannot be fails first, with the message the sweep's own check gives (an outside review:
    9.8 s for a `bf17`)."""
    kernel = "raise RuntimeError('imported')\n" + TUNED_KERNEL
    message = error(tmp_path / "a", wrapped_spec("tuned_kernel").replace('"fp16"', '"bf17"'), kernel)
    assert message.startswith("specs/s.toml: [sweep] dtype: got 'bf17'; allowed: "), message
    assert "imported" in error(tmp_path / "b", wrapped_spec("tuned_kernel"), kernel)   # else the import runs
