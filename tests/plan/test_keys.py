"""keys: which environment counts, tool versions remembered by file identity, toolchain fingerprints, action keys."""
import json
import os

import pytest

from kforge.plan import keys
from kforge.base import stamps
from kforge_runtime import schema

PREFIXES = ("TRITON_", "MLIR_", "LLVM_", "AMDGCN_", "FLYDSL_")


def fake_tool(path, last_line="fake 1.2.3", exit_code=0, first_line="Fake Tool"):
    """A shell script standing in for `ptxas`/`ld.lld`: each run appends a line to <path>.runs."""
    lines = ["#!/bin/sh", f'echo run >> "{path}.runs"']
    lines += [f'echo "{line}"' for line in (first_line, last_line) if line]
    lines.append(f"exit {exit_code}")
    path.write_text("\n".join(lines) + "\n")
    path.chmod(0o755)
    return path


def runs(tool) -> int:
    counter = tool.parent / f"{tool.name}.runs"
    return len(counter.read_text().splitlines()) if counter.exists() else 0


@pytest.fixture
def clean_env(monkeypatch):
    """No compiler variables from the caller's environment: the test sets exactly those it means."""
    for name in list(os.environ):
        if name.startswith(PREFIXES) or name in schema.CODE_ENV_NAMES or name == "KFORGE_LD_LLD":
            monkeypatch.delenv(name)
    keys.toolchain_fingerprint.cache_clear()
    yield monkeypatch
    keys.toolchain_fingerprint.cache_clear()


# --- compiler_env ---------------------------------------------------------------------------------------------

def test_compiler_env_holds_the_variables_that_change_what_a_compiler_emits_sorted(clean_env):
    wanted = {"TRITON_F32_DEFAULT": "ieee", "MLIR_ENABLE_DUMP": "1", "LLVM_IR_ENABLE_DUMP": "0",
              "AMDGCN_ENABLE_DUMP": "1", "FLYDSL_DEBUG": "x",
              # Triton's knobs without a prefix: each changed the binaries of a build here
              "DISABLE_LLVM_OPT": "1", "DISABLE_MMA_V3": "1", "DISABLE_PTXAS_OPT": "1", "PTXAS_OPTIONS": "-O1",
              "USE_IR_LOC": "ttir"}
    for name, value in wanted.items():
        clean_env.setenv(name, value)
    clean_env.setenv("TRITONX", "no underscore after the prefix")
    clean_env.setenv("MY_TRITON_THING", "prefix not at the start")
    clean_env.setenv("triton_f32_default", "lower case")
    assert keys.compiler_env() == tuple(sorted(wanted.items()))


@pytest.mark.parametrize("name", ["TRITON_CACHE_DIR", "TRITON_HOME", "TRITON_DUMP_DIR", "TRITON_OVERRIDE_DIR",
                                  "TRITON_CACHE_MANAGER", "TRITON_PRINT_AUTOTUNING", "FLYDSL_RUNTIME_CACHE_DIR",
                                  "FLYDSL_RUNTIME_ENABLE_CACHE", "FLYDSL_DUMP_DIR", "FLYDSL_AUTOTUNE_CACHE_DIR",
                                  "FLYDSL_GPU_ARCH", "TRITON_ALWAYS_COMPILE", "TRITON_KERNEL_DUMP",
                                  "MLIR_ENABLE_TIMING", "TRITON_STORE_BINARY_ONLY", "TRITON_LIBCUDA_PATH"])
def test_cache_and_dump_locations_and_the_per_target_arch_are_not_part_of_the_compiler_env(clean_env, name):
    clean_env.setenv("TRITON_F32_DEFAULT", "ieee")
    before = keys.compiler_env()
    clean_env.setenv(name, "/somewhere/else")
    assert keys.compiler_env() == before == (("TRITON_F32_DEFAULT", "ieee"),)


def test_a_changed_value_of_a_counted_variable_changes_the_compiler_env(clean_env):
    clean_env.setenv("MLIR_ENABLE_DUMP", "0")
    before = keys.compiler_env()
    clean_env.setenv("MLIR_ENABLE_DUMP", "1")
    assert keys.compiler_env() != before


def test_with_kernel_override_on_the_override_folders_content_is_in_the_compiler_env(clean_env, tmp_path):
    """TRITON_KERNEL_OVERRIDE=1 compiles the IR files of TRITON_OVERRIDE_DIR (default $TRITON_HOME/.triton/override)
    instead: an edit there is a changed environment, the folder's path alone is not."""
    folder = tmp_path / "override" / "abc"
    folder.mkdir(parents=True)
    (folder / "k.ptx").write_text("fma.rn.f32")
    clean_env.setenv("TRITON_OVERRIDE_DIR", str(tmp_path / "override"))
    assert keys.compiler_env() == ()   # off: the folder is not read
    clean_env.setenv("TRITON_KERNEL_OVERRIDE", "1")
    first = dict(keys.compiler_env())
    assert set(first) == {"TRITON_KERNEL_OVERRIDE", "TRITON_OVERRIDE_DIR content"}
    (folder / "k.ptx").write_text("fma.rz.f32")
    assert dict(keys.compiler_env())["TRITON_OVERRIDE_DIR content"] != first["TRITON_OVERRIDE_DIR content"]
    clean_env.delenv("TRITON_OVERRIDE_DIR")
    clean_env.setenv("TRITON_HOME", str(tmp_path / "home"))
    (tmp_path / "home" / ".triton" / "override").mkdir(parents=True)
    (tmp_path / "home" / ".triton" / "override" / "k.ptx").write_text("fma.rn.f32")
    home = dict(keys.compiler_env())["TRITON_OVERRIDE_DIR content"]
    (tmp_path / "home" / ".triton" / "override" / "k.ptx").write_text("fma.rz.f32")
    assert dict(keys.compiler_env())["TRITON_OVERRIDE_DIR content"] != home


# --- ToolVersions ---------------------------------------------------------------------------------------------

def test_a_tool_is_run_once_and_its_last_output_line_is_its_version(tmp_path):
    tool = fake_tool(tmp_path / "ptxas")
    versions = keys.ToolVersions(tmp_path / "tools.json")
    assert versions(tool) == "fake 1.2.3"
    assert versions(tool) == "fake 1.2.3"
    assert runs(tool) == 1


def test_saved_versions_are_reused_by_the_next_run_without_running_the_tool(tmp_path):
    tool = fake_tool(tmp_path / "ptxas")
    cache = tmp_path / "state" / "tools.json"   # its folder is made on save
    first = keys.ToolVersions(cache)
    first(tool)
    first.save()
    assert cache.is_file()
    assert keys.ToolVersions(cache)(tool) == "fake 1.2.3"
    assert runs(tool) == 1


def test_an_edited_tool_is_run_again(tmp_path):
    tool = fake_tool(tmp_path / "ptxas")
    versions = keys.ToolVersions(tmp_path / "tools.json")
    assert versions(tool) == "fake 1.2.3"
    fake_tool(tool, last_line="fake 1.2.4")
    assert versions(tool) == "fake 1.2.4"
    assert runs(tool) == 2


def test_a_tool_replaced_with_one_of_the_same_size_is_run_again_through_its_new_mtime(tmp_path):
    tool = fake_tool(tmp_path / "ptxas", last_line="fake 1.2.3")
    versions = keys.ToolVersions(tmp_path / "tools.json")
    assert versions(tool) == "fake 1.2.3"
    size, mtime = tool.stat().st_size, tool.stat().st_mtime_ns
    fake_tool(tool, last_line="fake 9.9.9")
    os.utime(tool, ns=(mtime + 1_000_000, mtime + 1_000_000))
    assert tool.stat().st_size == size
    assert versions(tool) == "fake 9.9.9"


def test_save_writes_only_when_a_version_was_added(tmp_path):
    tool = fake_tool(tmp_path / "ptxas")
    cache = tmp_path / "tools.json"
    versions = keys.ToolVersions(cache)
    versions.save()
    assert not cache.exists()   # nothing learnt yet
    versions(tool)
    versions.save()
    written = stamps.identity(str(cache))
    assert written is not None
    versions.save()
    again = keys.ToolVersions(cache)
    again(tool)
    again.save()
    assert stamps.identity(str(cache)) == written   # never rewritten (a rewrite is a rename: a new inode)
    assert json.loads(cache.read_text()) == versions.entries


@pytest.mark.parametrize("garbage", [b"", b"not json", b'{"half": ', b"\xff\xfe\x00"])
def test_a_garbage_tools_json_is_ignored_and_replaced_on_save(tmp_path, garbage):
    tool = fake_tool(tmp_path / "ptxas")
    cache = tmp_path / "tools.json"
    cache.write_bytes(garbage)
    versions = keys.ToolVersions(cache)
    assert versions(tool) == "fake 1.2.3"
    versions.save()
    assert list(json.loads(cache.read_text()).values()) == ["fake 1.2.3"]


@pytest.mark.parametrize("not_an_object", [b"[]", b'"text"', b"3"])
def test_a_tools_json_holding_json_that_is_not_an_object_is_ignored(tmp_path, not_an_object):
    tool = fake_tool(tmp_path / "ptxas")
    cache = tmp_path / "tools.json"
    cache.write_bytes(not_an_object)
    assert keys.ToolVersions(cache)(tool) == "fake 1.2.3"


@pytest.mark.parametrize("exit_code,last_line,expected", [
    (0, None, "unusable (exit 0)"),          # prints nothing
    (3, "fake 1.2.3", "unusable (exit 3)"),  # prints a version but fails
    (1, None, "unusable (exit 1)"),
])
def test_a_tool_that_prints_nothing_or_fails_is_unusable_with_its_exit_code(tmp_path, exit_code, last_line, expected):
    tool = fake_tool(tmp_path / "ptxas", last_line=last_line, exit_code=exit_code, first_line=None)
    versions = keys.ToolVersions(tmp_path / "tools.json")
    assert versions(tool) == expected
    assert versions(tool) == expected and runs(tool) == 1   # remembered like any version


def test_no_tool_is_missing_and_runs_nothing(tmp_path):
    versions = keys.ToolVersions(tmp_path / "tools.json")
    assert versions(None) == "missing"
    assert not versions.changed


def test_tool_versions_of_a_file_is_one_shared_instance(tmp_path):
    assert keys.ToolVersions.of(tmp_path / "a.json") is keys.ToolVersions.of(tmp_path / "a.json")
    assert keys.ToolVersions.of(tmp_path / "a.json") is not keys.ToolVersions.of(tmp_path / "b.json")


# --- ptxas_path and toolchain_fingerprint ---------------------------------------------------------------------

def test_blackwell_uses_its_own_ptxas_override_and_older_archs_the_plain_one(tmp_path, clean_env):
    plain = fake_tool(tmp_path / "ptxas")
    blackwell = fake_tool(tmp_path / "ptxas-blackwell")
    clean_env.setenv("TRITON_PTXAS_PATH", str(plain))
    clean_env.setenv("TRITON_PTXAS_BLACKWELL_PATH", str(blackwell))
    assert keys.ptxas_path(90) == plain and keys.ptxas_path(80) == plain
    assert keys.ptxas_path(100) == blackwell and keys.ptxas_path(120) == blackwell


def test_an_override_naming_no_file_falls_back_to_tritons_own_ptxas(tmp_path, clean_env):
    default = keys.ptxas_path(90)
    clean_env.setenv("TRITON_PTXAS_PATH", str(tmp_path / "absent"))
    assert keys.ptxas_path(90) == default
    assert default is None or default.is_file()


def test_a_triton_nvidia_fingerprint_is_tritons_version_and_ptxas_version(tmp_path, clean_env):
    ptxas = fake_tool(tmp_path / "ptxas", last_line="Cuda compilation tools, release 12.8, V12.8.93")
    clean_env.setenv("TRITON_PTXAS_PATH", str(ptxas))
    cache = tmp_path / "out" / ".kforge" / "tools.json"
    assert keys.toolchain_fingerprint("triton", "nvidia", 90, cache) == (
        ("triton", keys.package_version("triton")), ("ptxas", "Cuda compilation tools, release 12.8, V12.8.93"))
    assert not cache.exists()   # computing it writes nothing


def test_a_triton_amd_fingerprint_runs_no_ptxas(tmp_path, clean_env):
    ptxas = fake_tool(tmp_path / "ptxas")
    clean_env.setenv("TRITON_PTXAS_PATH", str(ptxas))
    assert keys.toolchain_fingerprint("triton", "amd", 0, tmp_path / "tools.json") == (
        ("triton", keys.package_version("triton")),)
    assert runs(ptxas) == 0


def test_a_flydsl_fingerprint_holds_the_linkers_version_line(tmp_path, clean_env):
    lld = fake_tool(tmp_path / "ld.lld", last_line="Ubuntu LLD 19.1.7 (compatible with GNU linkers)", first_line=None)
    clean_env.setenv("KFORGE_LD_LLD", str(lld))
    cache = tmp_path / "tools.json"
    parts = keys.toolchain_fingerprint("flydsl", "amd", 0, cache)
    assert parts == (("flydsl", keys.package_version("flydsl")),
                     ("ld.lld", "Ubuntu LLD 19.1.7 (compatible with GNU linkers)"))
    assert list(keys.ToolVersions.of(cache).entries.values()) == [parts[1][1]]   # remembered like ptxas's
    assert not cache.exists()


def test_a_flydsl_fingerprint_notes_a_missing_linker(tmp_path, clean_env):
    clean_env.setenv("KFORGE_LD_LLD", str(tmp_path / "no-such-ld.lld"))
    assert dict(keys.toolchain_fingerprint("flydsl", "amd", 0, tmp_path / "tools.json"))["ld.lld"] == "missing"


def test_a_package_that_is_not_installed_has_a_version_that_says_so():
    assert keys.package_version("kforge-no-such-distribution") == "not-installed"
    assert keys.package_version("triton") not in ("", "not-installed")


# --- action_key -----------------------------------------------------------------------------------------------

def test_an_action_key_does_not_depend_on_dict_order():
    assert (keys.action_key({"arch": "sm_90a", "env": {"A": "1", "B": "2"}, "sources": [["a.py", "x"]]})
            == keys.action_key({"sources": [["a.py", "x"]], "env": {"B": "2", "A": "1"}, "arch": "sm_90a"}))


def test_an_action_key_changes_with_the_way_source_keys_are_made(monkeypatch):
    """meta.json holds the kernel's source key as the compile made it: when kforge makes it another way, every
    target builds again instead of keeping (or taking from a cache) a key serving no longer matches."""
    from kforge_runtime import source_key
    before = keys.action_key({"arch": "sm_90a"})
    monkeypatch.setattr(source_key, "KEY_VERSION", source_key.KEY_VERSION + 1)
    assert keys.action_key({"arch": "sm_90a"}) != before


def test_an_action_key_tells_value_types_apart():
    variants = [{"FLAG": True}, {"FLAG": 1}, {"FLAG": 1.0}, {"FLAG": "1"}, {"FLAG": [1]}]
    assert len({keys.action_key(p) for p in variants}) == len(variants)


def test_an_action_key_includes_the_artifact_schema_version(monkeypatch):
    payload = {"arch": "sm_90a"}
    before = keys.action_key(payload)
    assert before != stamps.digest(payload)
    monkeypatch.setattr(schema, "ARTIFACT_SCHEMA", schema.ARTIFACT_SCHEMA + 1)
    assert keys.action_key(payload) != before
    monkeypatch.undo()
    assert keys.action_key(payload) == before


def test_a_tool_that_cannot_run_is_unusable_in_the_key_not_a_traceback(tmp_path):
    """TRITON_PTXAS_PATH pointing at a file that is not executable: listing the targets still works, and the
    key says the tool is unusable (its targets then fail with the compiler's own message)."""
    tool = fake_tool(tmp_path / "ptxas")
    tool.chmod(0o644)
    assert keys.ToolVersions(tmp_path / "tools.json")(tool) == "unusable (PermissionError)"


def test_where_ptxas_lies_is_not_in_the_key_only_which_ptxas_it_is(monkeypatch):
    monkeypatch.setenv("TRITON_PTXAS_PATH", "/opt/a/ptxas")
    before = keys.compiler_env()
    monkeypatch.setenv("TRITON_PTXAS_PATH", "/opt/b/ptxas")
    assert keys.compiler_env() == before and not any(k == "TRITON_PTXAS_PATH" for k, _ in before)
