"""rules/runtime/record.py: what Triton's JIT hook is given becomes one stable record line; recording never
changes what runs."""
import json
import types
from pathlib import Path

import pytest
import triton
import triton.language as tl

from kforge_runtime import record, schema
from kforge_runtime.source_key import source_key, tagged
from tests.support import Compiled


@triton.jit
def relu(x):
    return tl.maximum(x, 0)


ARGS = ["x_ptr", "y_ptr", "n", "scale", "bias", "X_dtype", "ACT", "BLOCK"]
SIGNATURE = {"x_ptr": "*bf16", "y_ptr": "*bf16", "n": "i32", "scale": "constexpr", "bias": "constexpr",
             "X_dtype": "constexpr", "ACT": "constexpr", "BLOCK": "constexpr"}
CONSTANTS = {(3,): 1, (4,): None, (5,): tl.bfloat16, (6,): relu, (7,): tl.constexpr(256)}
ATTRS = {(0,): [["tt.divisibility", 16]], (1,): [["tt.divisibility", 16]], (2,): []}
OPTIONS = {"num_warps": 8, "num_stages": 3, "num_ctas": 1, "maxnreg": None, "enable_fp_fusion": True,
           "ptx_options": None, "debug": False, "arch": "sm90", "extern_libs": [["libdevice", "/x"]]}


def test_a_specialization_becomes_one_record_with_each_kind_of_value():
    line = record.record_line("tk.scale", "scale_kernel", ARGS, SIGNATURE, CONSTANTS, ATTRS, OPTIONS, "sm_90a")
    assert line == {
        "format": "kforge-record-1", "kernel": "tk.scale:scale_kernel", "arch": "sm_90a",
        "signature": [["x_ptr", "*bf16"], ["y_ptr", "*bf16"], ["n", "i32"], ["scale", "constexpr"],
                      ["bias", "none"], ["X_dtype", "dtype"], ["ACT", "function"], ["BLOCK", "constexpr"]],
        "constexprs": {"scale": 1, "X_dtype": "bf16", "ACT": f"{__name__}:relu", "BLOCK": 256},
        "divisible_by_16": ["x_ptr", "y_ptr"],
        "options": {"num_warps": 8, "num_stages": 3}}   # the other options are Triton's defaults
    assert json.loads(json.dumps(line)) == line   # plain JSON
    assert tuple(line) == schema.RECORD_FIELDS   # the format rules/declare/records.py reads


def test_a_dtype_is_recorded_as_kforge_spells_it_whatever_tritons_name():
    """str(tl.int32) is "int32" and a bool argument's type "u1": the record (and a served call's identity) carries
    the spelling keys and meta.json carry, so a bundle built from it is found (gemlite's int32 / uint8 / int8 dtype
    constexprs were all missed before)."""
    from kforge.base.dtypes import DTYPES, canonical_dtype
    spelled = {}
    for name in dir(tl):
        value = getattr(tl, name)
        if isinstance(value, tl.dtype) and not isinstance(value, tl.pointer_type):
            spelled[str(value)] = record._constant(value)
    assert spelled["int32"] == ("dtype", "i32") and spelled["uint8"] == ("dtype", "u8")
    assert spelled["int1"] == ("dtype", "u1") and spelled["bfloat16" if "bfloat16" in spelled else "bf16"][1] == "bf16"
    for triton_name, (kind, value) in spelled.items():   # every type kforge builds is recorded in its one spelling
        if canonical_dtype(triton_name) is not None:
            assert value == canonical_dtype(triton_name) and value in DTYPES, triton_name
    assert all(canonical_dtype(t) == k for t, k in schema.TRITON_DTYPE_NAMES.items())
    # and every argument type Triton's specializer writes (its canonical names) is kforge's spelling too, but the
    # two it never gives a torch tensor or a Python scalar (fp8e4b15, void)
    from triton._utils import type_canonicalisation_dict
    for name in set(type_canonicalisation_dict.values()) - {"fp8e4b15", "void"}:
        assert canonical_dtype(name) == name, name


@pytest.mark.parametrize("arch, changed, kept", [
    ("sm_90a", {"debug": True}, {"debug": True}),   # @triton.jit(debug=True), or TRITON_DEBUG=1
    ("sm_90a", {"debug": True, "sanitize_overflow": False}, {"debug": True, "sanitize_overflow": False}),
    ("sm_90a", {"enable_reflect_ftz": False}, {"enable_reflect_ftz": False}),
    ("sm_90a", {"default_dot_input_precision": "ieee"}, {"default_dot_input_precision": "ieee"}),  # F32_DEFAULT
    ("gfx942", {"default_dot_input_precision": "ieee"}, {}),   # AMD's default
    ("sm_90a", {"ir_override": "k.ttgir"}, {"ir_override": "k.ttgir"}),   # refused at build: never served
    ("sm_90a", {"instrumentation_mode": "fpsan"}, {"instrumentation_mode": "fpsan"}),
])
def test_every_option_a_call_can_change_its_binary_by_is_recorded(arch, changed, kept):
    """A record left out what a launch or the process's knobs set beyond num_warps and the like: the call was then
    matched to a binary compiled without it (served, another binary than the JIT's)."""
    defaults = {**OPTIONS, "sanitize_overflow": True, "enable_reflect_ftz": True, "ir_override": None,
                "instrumentation_mode": "", "default_dot_input_precision": "ieee" if arch.startswith("gfx") else "tf32"}
    line = record.record_line("tk.scale", "scale_kernel", ARGS, SIGNATURE, CONSTANTS, ATTRS, defaults, arch)
    assert line["options"] == {"num_warps": 8, "num_stages": 3}
    line = record.record_line("tk.scale", "scale_kernel", ARGS, SIGNATURE, CONSTANTS, ATTRS, {**defaults, **changed},
                              arch)
    assert line["options"] == {"num_warps": 8, "num_stages": 3, **kept}


def test_a_value_that_cannot_be_recorded_says_so():
    with pytest.raises(ValueError, match="a constexpr of type object"):
        record.record_line("m", "k", ["a"], {"a": "constexpr"}, {(0,): object()}, {}, {}, "sm_90a")


@pytest.mark.parametrize("backend, arch, name", [("cuda", 90, "sm_90a"), ("cuda", 80, "sm_80"),
                                                 ("cuda", 100, "sm_100a"), ("hip", "gfx942", "gfx942")])
def test_triton_targets_get_kforge_arch_names(backend, arch, name):
    assert record.arch_name(types.SimpleNamespace(backend=backend, arch=arch)) == name


@triton.jit
def scale_kernel(x_ptr, y_ptr, n, scale, bias, X_dtype, ACT, BLOCK):
    pass


def hook_call(recorder, specialization):
    fn = types.SimpleNamespace(module="tk.scale", name="scale_kernel", jit_function=scale_kernel)
    compile = {"signature": SIGNATURE, "constants": CONSTANTS, "configs": [ATTRS],
               "specialization_data": json.dumps({"options": OPTIONS}) if specialization else "not json"}
    return recorder.hook(key="k", repr="r", fn=fn, compile=compile, is_manual_warmup=False, already_compiled=False)


def test_the_hook_appends_each_specialization_once_and_chains_the_hook_it_replaced(tmp_path, capsys):
    path = tmp_path / "app.jsonl"
    recorder = record.Recorder(str(path), arch="sm_90a")
    calls = []
    recorder.previous = lambda **kw: calls.append(kw["key"]) or "theirs"
    assert hook_call(recorder, True) == "theirs" and hook_call(recorder, True) == "theirs"
    assert len(path.read_text().splitlines()) == 1 and calls == ["k", "k"]
    # the kernel's code, by the key a build compares with what it compiles (rules/compile/triton_backend.py)
    assert json.loads(path.read_text())["source_key"] == tagged(source_key(scale_kernel))
    assert hook_call(recorder, False) == "theirs"   # a record that fails is a warning, never an error
    assert "kforge record: not recorded (tk.scale.scale_kernel)" in capsys.readouterr().err


def test_recording_installs_and_restores_tritons_hook(tmp_path):
    from triton import knobs
    before = knobs.runtime.jit_post_compile_hook
    with record.recording(str(tmp_path / "r.jsonl")) as recorder:
        assert knobs.runtime.jit_post_compile_hook == recorder.hook
    assert knobs.runtime.jit_post_compile_hook is before


def test_only_options_that_differ_from_tritons_defaults_are_kept_so_a_record_builds_for_either_vendor():
    amd = {"num_warps": 4, "num_stages": 2, "waves_per_eu": 2, "matrix_instr_nonkdim": 0, "kpack": 1,
           "schedule_hint": "none", "num_ctas": 1, "enable_fp_fusion": True}
    nvidia = {"num_warps": 4, "num_stages": 3, "launch_pdl": False, "maxnreg": None, "num_ctas": 2}
    assert record.record_line("m", "k", [], {}, {}, {}, amd, "gfx942")["options"] == {
        "num_warps": 4, "num_stages": 2, "waves_per_eu": 2}
    assert record.record_line("m", "k", [], {}, {}, {}, nvidia, "sm_90a")["options"] == {
        "num_warps": 4, "num_stages": 3, "num_ctas": 2}


def test_an_autotuned_kernel_is_recorded_once_per_key_with_the_config_it_picked(tmp_path, monkeypatch):
    """The configs it only benchmarked are not recorded; the line carries Triton's autotuning key."""
    import torch
    from triton.runtime.autotuner import Autotuner
    from tests.runtime.test_serve import StubDriver, copy_tuned
    from triton.runtime import driver
    monkeypatch.setattr(driver, "_active", StubDriver())
    copy_tuned.fn.device_caches.clear()
    copy_tuned.fn.device_caches[0]
    monkeypatch.setattr(copy_tuned.fn, "compile", lambda *a, **k: Compiled(), raising=False)
    monkeypatch.setattr(Autotuner, "_bench", lambda self, *a, config, **k: [1.0 / config.kwargs["BLOCK"]])
    copy_tuned.cache.clear()
    before = Autotuner.run
    path = tmp_path / "app.jsonl"
    x, y = torch.zeros(1000, dtype=torch.float16), torch.zeros(1000, dtype=torch.float16)
    with record.recording(str(path)):
        for n in (1000, 1000, 100):
            copy_tuned[(1,)](x, y, n)
    lines = [json.loads(t) for t in path.read_text().splitlines()]
    assert [(r["constexprs"], r["options"], r["autotune"]) for r in lines] == [
        ({"BLOCK": 256}, {"num_warps": 8, "num_stages": 3},
         {"key": [n, "torch.float16", "torch.float16"],
          "config": {"BLOCK": 256, "num_warps": 8, "num_ctas": 1, "num_stages": 3}}) for n in (1000, 100)]
    assert all(set(r) == {"format", "kernel", "arch", "signature", "constexprs", "divisible_by_16", "options",
                          "autotune", "source_key"} for r in lines)
    assert {r["source_key"] for r in lines} == {tagged(source_key(copy_tuned.fn))}
    assert Autotuner.run is before   # recording undone


def test_another_kernel_launched_while_an_autotuner_runs_is_recorded_its_candidates_are_not(tmp_path, monkeypatch):
    """A kernel the tuning itself launches (do_bench's cache flush through a library that put its kernels under
    torch's ops: flag_gems's zeros_kernel with an int32 output; a config's pre_hook) runs again whenever that tuner
    runs, served or not: it is a launch like any other. The tuned kernel's benchmarked configs are not."""
    import torch
    from triton.runtime.autotuner import Autotuner
    from tests.runtime.test_serve import StubDriver, copy, copy_tuned
    from triton.runtime import driver
    monkeypatch.setattr(driver, "_active", StubDriver())
    for fn in (copy, copy_tuned.fn):
        fn.device_caches.clear()
        fn.device_caches[0]
        monkeypatch.setattr(fn, "compile", lambda *a, **k: Compiled(), raising=False)
    x, y = torch.zeros(1000, dtype=torch.float16), torch.zeros(1000, dtype=torch.float16)
    flush = torch.zeros(64, dtype=torch.int32)

    def bench(self, *args, config, **kwargs):   # as do_bench's L2 flush would, through a library's op
        copy[(1,)](flush, flush, 64, BLOCK=64)
        copy_tuned.fn[(1,)](x, y, 1000, BLOCK=config.kwargs["BLOCK"], num_warps=config.num_warps)
        return [1.0 / config.kwargs["BLOCK"]]
    monkeypatch.setattr(Autotuner, "_bench", bench)
    copy_tuned.cache.clear()
    path = tmp_path / "app.jsonl"
    with record.recording(str(path)):
        copy_tuned[(1,)](x, y, 1000)
    lines = [json.loads(t) for t in path.read_text().splitlines()]
    assert sorted((r["kernel"].split(":")[1], r["signature"][0][1], r.get("autotune") is not None) for r in lines) == [
        ("copy", "*i32", False), ("copy_tuned", "*fp16", True)]   # not BLOCK 128 / 256's benchmarked compiles


def test_a_kernel_a_configs_pre_hook_launches_is_recorded_it_runs_at_every_served_call_too(tmp_path, monkeypatch):
    """Triton's Autotuner runs the picked config's pre_hook before each launch, served or not: a kernel it launches
    (a buffer zeroed by a kernel of its own) is a launch of the workload."""
    import torch
    from triton.runtime.autotuner import Autotuner
    from tests.runtime.test_serve import StubDriver, copy
    from triton.runtime import driver
    flags = torch.zeros(64, dtype=torch.int32)

    def zero_flags(nargs):
        copy[(1,)](flags, flags, 64, BLOCK=64)

    hooked = triton.autotune(configs=[triton.Config({"BLOCK": 128}, pre_hook=zero_flags),
                                      triton.Config({"BLOCK": 256}, pre_hook=zero_flags)], key=["n"])(copy_hooked)
    monkeypatch.setattr(driver, "_active", StubDriver())
    for fn in (copy, copy_hooked):
        fn.device_caches.clear()
        fn.device_caches[0]
        monkeypatch.setattr(fn, "compile", lambda *a, **k: Compiled(), raising=False)
    monkeypatch.setattr(Autotuner, "_bench", lambda self, *a, config, **k: [1.0 / config.kwargs["BLOCK"]])
    path = tmp_path / "app.jsonl"
    x, y = torch.zeros(1000, dtype=torch.float16), torch.zeros(1000, dtype=torch.float16)
    with record.recording(str(path)):
        hooked[(1,)](x, y, 1000)
    lines = [json.loads(t) for t in path.read_text().splitlines()]
    assert sorted((r["kernel"].split(":")[1], r["signature"][0][1], "autotune" in r) for r in lines) == [
        ("copy", "*i32", False), ("copy_hooked", "*fp16", True)]


@triton.jit
def copy_hooked(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + i, tl.load(x_ptr + i, mask=i < n), mask=i < n)


def append_many(args) -> None:
    path, start = args
    for n in (i % 400 for i in range(start, start + 300)):   # lines up to 6 kB: over a pipe's atomic 4 kB
        record.append_once(path, json.dumps({"line": n, "pad": "x" * (n % 97) * 60}))


def test_writers_at_the_same_time_never_interleave_or_repeat_a_line(tmp_path):
    import multiprocessing   # spawned children import this module: it stays light (no torch)
    path = str(tmp_path / "r.jsonl")
    with multiprocessing.get_context("spawn").Pool(4) as pool:   # overlapping ranges: each line offered twice or more
        pool.map(append_many, [(path, s) for s in (0, 100, 200, 300)])
    lines = Path(path).read_text().splitlines()
    assert sorted(json.loads(t)["line"] for t in lines) == list(range(400))   # every line whole, each once


def test_a_line_is_appended_once_after_a_file_that_lost_its_last_newline(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text('{"a": 1}')
    assert record.append_once(str(path), '{"b": 2}') and not record.append_once(str(path), '{"a": 1}')
    assert path.read_text() == '{"a": 1}\n{"b": 2}\n'


def test_a_record_destination_that_is_a_link_is_refused_and_its_target_kept(tmp_path):
    """KFORGE_RECORD=specs/app.jsonl where a checkout put a link there (to ~/.bashrc, say): nothing is appended
    through it."""
    precious = tmp_path / "precious"
    precious.write_text("mine\n")
    (tmp_path / "app.jsonl").symlink_to(precious)
    with pytest.raises(record.Unwritable, match="a symbolic link"):
        record.append_once(str(tmp_path / "app.jsonl"), '{"a": 1}')
    assert precious.read_text() == "mine\n"


def test_a_write_that_fails_partway_is_one_warning_and_recording_stops(tmp_path, monkeypatch, capsys):
    """A full disk, an I/O error (/proc/self/mem reads as a regular file and fails with EIO): said once, not once
    per specialization, and the process runs on."""
    import errno
    recorder = record.Recorder(str(tmp_path / "r.jsonl"), arch="sm_90a")

    def full(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(record.os, "write", full)
    for n in range(3):
        recorder.write({"line": n})
    warned = [t for t in capsys.readouterr().err.splitlines() if t.startswith("kforge record:")]
    assert len(warned) == 1 and "No space left on device" in warned[0] and recorder.off, warned


def test_a_record_file_in_a_missing_folder_names_the_folder(tmp_path):
    with pytest.raises(record.Unwritable, match=f"its folder {tmp_path / 'nowhere'} does not exist"):
        record.append_once(str(tmp_path / "nowhere" / "app.jsonl"), '{"a": 1}')


class _Mode:   # printed with its address: no other process makes the key of a kernel reading it
    pass


MODE = tl.constexpr(_Mode())


@triton.jit
def moded_kernel(x_ptr, BLOCK: tl.constexpr):
    tl.store(x_ptr + tl.arange(0, BLOCK), (MODE is not None) * 1.0)


def test_a_kernel_whose_key_no_other_process_makes_is_recorded_without_one(tmp_path):
    """Each recording process (xdist workers, ranks) wrote another key for the same code: the file grew by a line
    per process and the build refused the family as two versions of the code (a review of 63491da)."""
    line = record.record_line("m", "moded_kernel", ["x_ptr", "BLOCK"], {"x_ptr": "*fp32", "BLOCK": "constexpr"},
                              {(1,): 64}, {}, {"num_warps": 4, "num_stages": 3}, "sm_90a", record._code(moded_kernel))
    assert "source_key" not in line
    assert record._code(scale_kernel) == tagged(source_key(scale_kernel))


def test_a_tuple_arguments_specialized_element_is_one_warning_and_the_launch_goes_on(tmp_path, capsys):
    """record.py 31 (Triton specializes an element of a tuple argument): reachable from a kernel taking a tuple,
    never run in the whole suite's coverage."""
    recorder = record.Recorder(str(tmp_path / "app.jsonl"), arch="sm_90a")
    recorder.previous = lambda **kw: "theirs"
    fn = types.SimpleNamespace(module="tk.scale", name="scale_kernel", jit_function=scale_kernel)
    compile = {"signature": SIGNATURE, "constants": {(0, 1): 3}, "configs": [ATTRS],
               "specialization_data": json.dumps({"options": OPTIONS})}
    assert recorder.hook(key="k", repr="r", fn=fn, compile=compile, is_manual_warmup=False,
                         already_compiled=False) == "theirs"
    assert capsys.readouterr().err == ("kforge record: not recorded (tk.scale.scale_kernel): tk.scale.scale_kernel: "
                                       "a tuple argument's element is specialized ((0, 1)); kforge records plain "
                                       "arguments\n")
    assert not (tmp_path / "app.jsonl").exists()


@pytest.mark.parametrize("inner, key, chosen, said", [
    ("tuner", 7, {"BLOCK": 64}, "tuned: an autotuner wrapping SimpleNamespace is not recorded"),
    ("jit", (1, 2), {"BLOCK": 64}, "autotuning key [(1, 2)] holds a value that is not a number or a string"),
    ("jit", 7, {"BLOCK": [64]}, "config {'BLOCK': [64]} holds a value that is not a number or a string"),
])
def test_an_autotuned_launch_kforge_cannot_record_is_one_warning_and_the_launch_goes_on(tmp_path, capsys, monkeypatch,
                                                                                        inner, key, chosen, said):
    """record.py 113-118 (an autotuner around another, a key or config value that is no number or string):
    reachable from a library's autotuner, never run in the whole suite's coverage. Triton's own run is stubbed:
    no GPU."""
    from triton.runtime.autotuner import Autotuner
    config = types.SimpleNamespace(all_kwargs=lambda: chosen)
    tuner = types.SimpleNamespace(configs=[config, config], base_fn=types.SimpleNamespace(__name__="tuned"),
                                  best_config=config, arg_names=["n"], keys=["n"],
                                  fn=scale_kernel if inner == "jit" else types.SimpleNamespace())
    stub = lambda tuner, *args, **kwargs: "ran"   # Triton's own run, as the recorder finds and restores it
    monkeypatch.setattr(Autotuner, "run", stub)
    with record.recording(str(tmp_path / "app.jsonl")):
        assert Autotuner.run(tuner, key) == "ran"
    assert Autotuner.run is stub
    assert capsys.readouterr().err == f"kforge record: autotuned tuned not recorded: {said}\n"
    assert not (tmp_path / "app.jsonl").exists()


def test_a_record_file_that_is_a_folder_is_one_warning_naming_it(tmp_path, capsys):
    """record.py 262 (an open error other than a link or a missing folder): KFORGE_RECORD naming a folder."""
    (tmp_path / "app.jsonl").mkdir()
    with pytest.raises(record.Unwritable, match=r"^cannot open it \(Is a directory\)$"):
        record.append_once(str(tmp_path / "app.jsonl"), '{"a": 1}')
    recorder = record.Recorder(str(tmp_path / "app.jsonl"), arch="sm_90a")
    recorder.write({"a": 1})
    recorder.write({"a": 2})
    assert capsys.readouterr().err == (f"kforge record: {tmp_path / 'app.jsonl'}: cannot open it (Is a directory); "
                                       f"nothing is recorded in this process. Record into a file "
                                       f"(KFORGE_RECORD=specs/app.jsonl)\n")
