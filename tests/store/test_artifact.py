"""rules/store/artifact.py: the artifact made (meta.json, sealed), checked and installed by the one installer every
source's candidate passes (each cache's lookups: tests/share/test_local_cache.py, tests/share/test_remote_cache.py),
read back (sha256 and ELF verified on load; meta.json is written last, so a kill never leaves a 'built' half), the
one CompileResult from the compile to the report, and a failure's error.txt."""
import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from kforge.store import artifact
from kforge.store.guard import OutsideOut
from kforge.store.artifact import Candidate, CompileResult, install
from kforge.store.inputs import listed_inputs
from kforge.base.layout import Layout
from kforge.report import reporter as report
from tests.support import REPO


@pytest.fixture
def art(built, tmp_path):
    d = tmp_path / "a" / "out" / "sm_90a" / "scale" / "fp16-b256-w4"
    shutil.copytree(built / "out" / "sm_90a" / "scale" / "fp16-b256-w4", d)
    return d


def target_at(directory, meta=None, **fields):
    """The Target fields the artifact module reads (rules/base/target.py), for the target `meta` names, with its
    artifact directory at `directory` (<root>/out/<arch>/<kernel>/<config_id>, as rules/base/layout.py puts it)."""
    layout, (arch, kernel, config_id) = Layout(directory.parents[3]), directory.parts[-3:]
    assert Path(layout.artifact_path(arch, kernel, config_id)) == directory
    named = {} if meta is None else dict(name=meta["target"], kernel=meta["kernel"], config_id=meta["config_id"],
                                         arch=meta["arch"], key=meta["key"], config=tuple(meta["config"].items()))
    return SimpleNamespace(**{"recorded_code": (), **named, **fields}, layout=layout,
                           out_dir=layout.artifact_path(arch, kernel, config_id),
                           meta_path=layout.meta_path(arch, kernel, config_id),
                           error_path=layout.error_path(arch, kernel, config_id))


def test_meta_has_what_a_loader_needs(art):
    meta, data = artifact.load(art)
    assert meta["target"] == "scale:fp16-b256-w4@sm_90a" and meta["arch"] == "sm_90a"
    assert meta["binary"] == "scale_kernel.cubin" and meta["symbol"] == "scale_kernel"
    assert meta["sha256"] == artifact.sha256(data) and meta["num_warps"] == 4
    assert [a["name"] for a in meta["signature"]] == ["x_ptr", "y_ptr", "n"]
    assert meta["signature"][0]["type"] == "*fp16" and meta["constexprs"] == {"BLOCK": 256}
    assert meta["config"] == {"dtype": "fp16", "BLOCK": 256, "num_warps": 4}
    assert set(meta["toolchain_versions"]) == {"triton", "ptxas"} and "shared" in meta
    assert list(meta["source"]["digests"]) == ["tk/__init__.py", "tk/scale.py"]   # what importing it runs


def test_tampered_binary_is_refused(art):
    b = art / "scale_kernel.cubin"
    data = bytearray(b.read_bytes())
    data[-1] ^= 0xFF
    b.write_bytes(bytes(data))
    with pytest.raises(artifact.ArtifactError, match="sha256 .* does not match"):
        artifact.load(art)


def test_binary_for_wrong_arch_behind_a_matching_sha_is_refused(art, built):
    other = built / "out" / "sm_80" / "scale" / "fp16-b256-w4" / "scale_kernel.cubin"
    shutil.copy(other, art / "scale_kernel.cubin")
    meta = json.loads((art / "meta.json").read_text())
    meta["sha256"] = artifact.sha256(other.read_bytes())
    meta["seal"] = artifact.seal(meta)   # a consistent meta.json: only the ELF checks can tell
    (art / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(artifact.ArtifactError, match="sm_80, expected sm_90a"):
        artifact.load(art)


def test_kill_before_meta_leaves_target_unbuilt(art, monkeypatch):
    meta = json.loads((art / "meta.json").read_text())
    assert artifact.is_current(str(art / "meta.json"), meta["key"])
    real = artifact.atomic_write

    def killed_at_meta(path, data):
        if path.name == artifact.META:
            raise KeyboardInterrupt   # the process dies between the binary and meta.json
        real(path, data)
    monkeypatch.setattr(artifact, "atomic_write", killed_at_meta)
    with pytest.raises(KeyboardInterrupt):
        install(target_at(art, meta), Candidate(artifact.files_of(art)))
    assert not (art / "meta.json").exists()
    assert not artifact.is_current(str(art / "meta.json"), meta["key"])


@pytest.mark.parametrize("content", [b"{not json", b'{"key": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"],
                         ids=["cut-short", "nested-too-deep"])
def test_corrupt_meta_is_not_current(art, content):
    """JSON nested deeper than Python's parser recurses raised RecursionError past every reader's ValueError: a
    traceback from every doit command, `doit info` and `doit clean` included."""
    (art / "meta.json").write_bytes(content)
    meta_path = str(art / "meta.json")
    assert not artifact.is_current(meta_path, "anything") and artifact.current_meta(meta_path, "anything") is None
    assert listed_inputs(meta_path) is None
    with pytest.raises(artifact.ArtifactError, match="unreadable artifact"):
        artifact.load(art)
    with pytest.raises(ValueError):
        artifact.files_of(art)


def test_key_index_remembers_keys_and_notices_a_replaced_meta(art, tmp_path):
    meta_path = str(art / "meta.json")
    key = json.loads((art / "meta.json").read_text())["key"]
    index = artifact.KeyIndex(tmp_path / "keys.json")
    assert index.is_current(meta_path, key) and not index.is_current(meta_path, "other")
    index.save()
    reloaded = artifact.KeyIndex(tmp_path / "keys.json")
    assert reloaded.entries == index.entries and reloaded.is_current(meta_path, key)
    meta = json.loads((art / "meta.json").read_text())
    rebuilt = {**meta, "key": "rebuilt"}
    artifact.atomic_write(art / "meta.json", json.dumps({**rebuilt, "seal": artifact.seal(rebuilt)}).encode())
    assert reloaded.is_current(meta_path, "rebuilt") and not reloaded.is_current(meta_path, key)
    (art / "meta.json").unlink()
    assert not reloaded.is_current(meta_path, "rebuilt")


def test_an_unchanged_artifact_is_current_from_the_saved_index_without_reading_it(art, tmp_path, monkeypatch):
    """What makes a no-op run cheap: meta.json and the binary are only stat'ed, neither read nor hashed."""
    meta_path = str(art / "meta.json")
    key = json.loads((art / "meta.json").read_text())["key"]
    index = artifact.KeyIndex(tmp_path / "keys.json")
    assert index.is_current(meta_path, key)
    index.save()

    def no_reading(path):
        raise AssertionError(f"read {path}")
    monkeypatch.setattr(artifact, "_read_artifact", no_reading)
    assert artifact.KeyIndex(tmp_path / "keys.json").is_current(meta_path, key)


def test_a_garbage_key_index_is_ignored(art, tmp_path):
    (tmp_path / "keys.json").write_text('["not", "a dict"]')
    key = json.loads((art / "meta.json").read_text())["key"]
    assert artifact.KeyIndex(tmp_path / "keys.json").is_current(str(art / "meta.json"), key)


@pytest.mark.parametrize("name", ["../../../../escaped.cubin", "/tmp/kforge-absolute-escape.cubin", "a/b.cubin",
                                  ".hidden", "..", "nul\x00.cubin"])
def test_an_artifact_from_outside_naming_a_path_writes_nothing(art, tmp_path, name):
    """A remote cache entry or Dask result is untrusted: a file name that is not a plain name is refused before
    anything is written, wherever it points."""
    files = artifact.files_of(art)
    meta = json.loads(files[artifact.META])
    binary = files.pop(meta["binary"])
    meta["binary"] = name
    files[name] = binary
    files[artifact.META] = json.dumps(meta).encode()
    target = tmp_path / "out" / "sm_90a" / "scale" / "fp16-b256-w4"
    before = set(tmp_path.rglob("*"))
    with pytest.raises(artifact.ArtifactError, match="not a plain file name"):
        install(target_at(target, meta), Candidate(files))
    assert set(tmp_path.rglob("*")) == before and not target.exists()
    assert not __import__("os").path.exists("/tmp/kforge-absolute-escape.cubin")


def test_a_bad_artifact_from_outside_is_checked_before_anything_is_written(art, tmp_path):
    files = artifact.files_of(art)
    meta = json.loads(files[artifact.META])
    damaged = bytearray(files[meta["binary"]])
    damaged[-1] ^= 0xFF
    files[meta["binary"]] = bytes(damaged)
    target = tmp_path / "out" / "sm_90a" / "scale" / "fp16-b256-w4"
    with pytest.raises(artifact.ArtifactError, match="sha256"):
        install(target_at(target, meta), Candidate(files))
    assert not target.exists()
    install(target_at(target, meta), Candidate(artifact.files_of(art)))   # the genuine one installs
    assert artifact.load(target)[0]["key"] == meta["key"]


def test_a_meta_json_edited_after_its_build_is_not_current_nor_shipped(art, tmp_path):
    """Its seal (a digest of its other fields) no longer matches: rebuilt, never packaged or loaded as it is."""
    meta_path = str(art / "meta.json")
    meta = json.loads((art / "meta.json").read_text())
    assert meta["seal"] == artifact.seal(meta) and artifact.current_meta(meta_path, meta["key"]) is not None
    assert "seal" not in artifact.current_meta(meta_path, meta["key"])   # not a field bundles carry
    (art / "meta.json").write_text(json.dumps({**meta, "threads_per_block": 256}))
    assert not artifact.is_current(meta_path, meta["key"])
    assert not artifact.KeyIndex(tmp_path / "keys.json").is_current(meta_path, meta["key"])
    assert artifact.current_meta(meta_path, meta["key"]) is None
    with pytest.raises(artifact.ArtifactError, match="edited or damaged since it was built"):
        artifact.load(art)


def test_a_link_under_out_never_carries_a_write_outside_it(art, tmp_path):
    out = tmp_path / "out"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (out / "sm_90a").mkdir(parents=True)
    (out / "sm_90a" / "scale").symlink_to(elsewhere)
    target = out / "sm_90a" / "scale" / "fp16-b256-w4"
    files = artifact.files_of(art)
    meta = json.loads(files[artifact.META])
    with pytest.raises(OutsideOut, match=r"out/sm_90a/scale \(a symbolic link\) leads outside out/"):
        install(target_at(target, meta), Candidate(files))
    artifact.write_error(target_at(target, meta), "boom")
    assert list(elsewhere.iterdir()) == []
    # nor is a failure read from there: an error.txt planted behind the link is no failure of this build's (it would
    # be replayed as the target's, and doit info would show it)
    (elsewhere / "fp16-b256-w4").mkdir()
    (elsewhere / "fp16-b256-w4" / "error.txt").write_text(f"key: {meta['key']}\ninputs: []\nplanted\n")
    assert artifact.read_error(target_at(target, meta)) is None
    assert artifact.saved_failure(target_at(target, meta)) is None


def test_a_directory_where_meta_json_belongs_is_replaced_by_the_build(art):
    meta = json.loads((art / "meta.json").read_text())
    binary = (art / meta["binary"]).read_bytes()
    (art / "meta.json").unlink()
    (art / "meta.json").mkdir()
    assert not artifact.is_current(str(art / "meta.json"), meta["key"])
    install(target_at(art, meta), Candidate(artifact.files(meta["binary"], binary, meta)))
    assert artifact.load(art)[0]["key"] == meta["key"]


# An artifact from outside (a remote cache entry, a Dask worker's result) is bound to the target it is for.

def other_arch(built, tmp_path, arch="gfx950", real="gfx942"):
    """(the `arch` target, the `real` target's genuine files with meta.json's key set to the `arch` target's and
    its seal recomputed): what a cache entry served for the `arch` target holding another arch's build looks like."""
    real_dir = built / "out" / real / "scale" / "fp16-b256-w4"
    wanted = json.loads((built / "out" / arch / "scale" / "fp16-b256-w4" / "meta.json").read_text())
    target = target_at(tmp_path / "out" / arch / "scale" / "fp16-b256-w4", wanted)
    files = artifact.files_of(real_dir)
    meta = json.loads(files[artifact.META])
    meta["key"] = target.key
    meta["seal"] = artifact.seal(meta)
    files[artifact.META] = json.dumps(meta).encode()
    return target, files, meta


def test_another_archs_build_under_this_targets_key_is_refused_and_writes_nothing(built, tmp_path):
    target, files, _ = other_arch(built, tmp_path)
    with pytest.raises(artifact.ArtifactError, match="says target 'scale:fp16-b256-w4@gfx942', the target's is "
                                                     "'scale:fp16-b256-w4@gfx950'"):
        install(target, Candidate(files))
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("arch, real, expected", [("gfx950", "gfx942", "gfx942, expected gfx950"),
                                                    ("sm_90a", "gfx942", "gfx942, expected sm_90a")])
def test_a_meta_json_rewritten_for_the_target_still_fails_the_elf_check_for_the_targets_arch(built, tmp_path,
                                                                                          arch, real, expected):
    """meta.json's target and arch rewritten too: the binary is checked for the TARGET's arch, and the refusal
    names what is wrong with the binary, not a file in out/ that was never written."""
    target, files, meta = other_arch(built, tmp_path, arch, real)
    for field in ("target", "arch"):
        meta[field] = getattr(target, "name" if field == "target" else field)
    meta["seal"] = artifact.seal(meta)
    files[artifact.META] = json.dumps(meta).encode()
    with pytest.raises(artifact.ArtifactError) as refused:
        install(target, Candidate(files))
    assert str(refused.value).startswith("its binary is refused: ") and expected in str(refused.value)
    assert "out/" not in str(refused.value) and "doit forget" not in str(refused.value)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("field, value", [("kernel", "other"), ("arch", "sm_80"), ("key", "0" * 64)])
def test_a_meta_json_for_another_kernel_arch_or_key_is_refused(art, tmp_path, field, value):
    files = artifact.files_of(art)
    meta = json.loads(files[artifact.META])
    target = target_at(tmp_path / "out" / "sm_90a" / "scale" / "fp16-b256-w4", meta)
    files[artifact.META] = json.dumps({**meta, field: value, "seal": artifact.seal({**meta, field: value})}).encode()
    with pytest.raises(artifact.ArtifactError, match=field):
        install(target, Candidate(files))
    assert artifact.accept(target, artifact.files_of(art))[0]["target"] == meta["target"]   # the genuine one is


@pytest.mark.parametrize("field, value", [("target", "scale:bf16-b256-w4@sm_90a"), ("config_id", "bf16-b256-w4"),
                                          ("config", {"dtype": "bf16", "BLOCK": 256, "num_warps": 4})])
def test_a_meta_json_of_this_kernel_arch_and_key_under_another_name_is_installed_as_the_targets(art, tmp_path,
                                                                                               field, value):
    """The key holds all that decides the bytes: made under another name (a record family's config renamed when
    the record gained a line), the artifact is this target's, its meta.json relabelled and sealed anew. With its
    seal not matching its fields, it is refused as any edited meta.json is."""
    files = artifact.files_of(art)
    meta = json.loads(files[artifact.META])
    target = target_at(tmp_path / "out" / "sm_90a" / "scale" / "fp16-b256-w4", meta)
    renamed = {**meta, field: value}
    files[artifact.META] = json.dumps({**renamed, "seal": artifact.seal(renamed)}).encode()
    installed = install(target, Candidate(files))
    written = json.loads((tmp_path / "out" / "sm_90a" / "scale" / "fp16-b256-w4" / artifact.META).read_text())
    assert installed[field] == written[field] == meta[field] and written["seal"] == artifact.seal(written)
    files[artifact.META] = json.dumps({**renamed, "seal": meta["seal"]}).encode()
    with pytest.raises(artifact.ArtifactError, match=field):
        install(target, Candidate(files))


def test_a_record_lines_target_takes_no_artifact_built_from_other_code_than_its_lines_were_recorded_from(art,
                                                                                                      tmp_path):
    """A record line whose code is not the code here fails its compile (triton_backend.py); a cache's artifact of
    the same key, built from the code here, was installed ("built", a hostile-input review): the verdict hung on
    the cache. A key no other process makes (source_key_unstable) is not compared, as the compile does not."""
    from kforge_runtime.source_key import tagged
    files = artifact.files_of(art)
    meta = json.loads(files[artifact.META])
    at = tmp_path / "out" / "sm_90a" / "scale" / "fp16-b256-w4"
    recorded = target_at(at, meta, recorded_code=(tagged("0" * 64),))
    with pytest.raises(artifact.ArtifactError, match="built from other code .* than its record lines were recorded"):
        artifact.accept(recorded, files)
    same = target_at(at, meta, recorded_code=(tagged("0" * 64), tagged(meta["triton_source_key"])))
    assert artifact.accept(same, files)[0]["key"] == meta["key"]
    older = target_at(at, meta, recorded_code=("v2:" + "0" * 64,))   # made another way: not compared
    assert artifact.accept(older, files)[0]["key"] == meta["key"]
    unstable = {**meta, "source_key_unstable": True}
    unstable.pop("seal")
    files[artifact.META] = json.dumps({**unstable, "seal": artifact.seal(unstable)}).encode()
    assert artifact.accept(recorded, files)[0]["key"] == meta["key"]


def test_a_deterministic_failure_stands_while_its_key_and_every_input_its_compile_read_do(tmp_path, monkeypatch):
    """error.txt with the inputs of the failed compile (rules/compile/action.py) is reported again instead of compiling;
    another key, a changed input, or a failure kept without inputs (a crash, a timeout) compiles again."""
    import hashlib

    from kforge.store.files import JsonState
    root = tmp_path / "p"
    (root / "kernels").mkdir(parents=True)
    source = root / "kernels" / "k.py"
    source.write_text("x = 1\n")
    directory = root / "out" / "sm_90a" / "k" / "b512"
    target = target_at(directory, key="K1")
    message = "k:b512@sm_90a failed\n  error: CompilationError: BLOCK too large\n  retry alone: doit k:b512@sm_90a"
    inputs = [["kernels/k.py", hashlib.sha256(source.read_bytes()).hexdigest()]]

    def saved(key="K1"):
        monkeypatch.setattr(JsonState, "_open", {})   # a new run: digests are taken afresh
        return artifact.saved_failure(SimpleNamespace(**{**vars(target), "key": key}))

    artifact.write_error(target, message + artifact.TRACEBACK + "Traceback (most recent call last): ...", inputs)
    assert saved() == message   # the traceback stays in error.txt only
    assert saved("K2") is None
    artifact.write_error(target, message)   # a crash or a timeout: no inputs kept
    assert saved() is None
    artifact.write_error(target, message, inputs)
    source.write_text("x = 2\n")
    assert saved() is None


def test_a_built_meta_json_has_every_field_the_schema_defines_with_its_type(art):
    """schema.ARTIFACT_FIELDS is the one definition (the loader checks ENTRY_FIELDS, a subset, by it)."""
    from kforge_runtime import schema
    meta, _ = artifact.load(art)
    assert schema.wrong_field(meta, schema.ARTIFACT_FIELDS) is None and schema.is_signature(meta["signature"])
    assert set(schema.ENTRY_FIELDS) <= set(schema.ARTIFACT_FIELDS)
    assert schema.wrong_field({**meta, "shared": "0"}, schema.ARTIFACT_FIELDS) == "shared"


def test_error_txt_is_read_back_as_it_was_written(tmp_path):
    """error.txt's format is written and read in store/artifact.py alone (compile/action.py, ship/package.py and
    doit info read it through read_error)."""
    target = target_at(tmp_path / "out" / "sm_90a" / "k" / "b512", key="K1")
    assert artifact.read_error(target) is None
    artifact.write_error(target, "k failed\n  error: boom" + artifact.TRACEBACK + "Traceback ...", [["k.py", "ab"]])
    failure = artifact.read_error(target)
    assert failure == artifact.Failure("K1", [["k.py", "ab"]], "k failed\n  error: boom" + artifact.TRACEBACK
                                       + "Traceback ...\n")
    assert failure.without_traceback == "k failed\n  error: boom"
    artifact.write_error(target, "k failed\n  error: timed out")   # no inputs: not a deterministic failure
    assert artifact.read_error(target) == artifact.Failure("K1", None, "k failed\n  error: timed out\n")


def test_a_restored_error_txt_never_reaches_a_terminal_with_its_control_characters(tmp_path):
    """error.txt comes back from out/, which may be a restored archive: its message is replayed in the build's
    summary (compile/action.py) and shown by doit info, so an escape sequence or a carriage return in it is shown
    as U+FFFD; its lines stay lines."""
    target = target_at(tmp_path / "out" / "sm_90a" / "k" / "b512", key="K1")
    Path(target.error_path).parent.mkdir(parents=True, exist_ok=True)
    Path(target.error_path).write_bytes(b"key: K1\ninputs: []\nk failed\x1b[2J\n  error: boom\rX\tY\n")
    failure = artifact.read_error(target)
    assert failure.message == "k failed\ufffd[2J\n  error: boom\ufffdX\tY\n"
    assert failure.without_traceback == "k failed\ufffd[2J\n  error: boom\ufffdX\tY"


def test_a_huge_error_txt_is_read_back_by_its_head_and_once(tmp_path, monkeypatch):
    """A restored or damaged error.txt of any size: doit info and the build read its key, its inputs and at most
    about 1 MiB of its message (a 200 MB one cost doit info 44 s and 2.4 GB), which says it was cut; a deterministic
    failure is still one, and saved_failure takes the error.txt the caller already read instead of reading it again."""
    import hashlib
    root = tmp_path / "p"
    (root / "k.py").parent.mkdir(parents=True)
    (root / "k.py").write_text("x = 1\n")
    target = target_at(root / "out" / "sm_90a" / "k" / "b512", key="K1")
    inputs = [["k.py", hashlib.sha256(b"x = 1\n").hexdigest()]]
    artifact.write_error(target, "k failed\n  error: boom" + artifact.TRACEBACK + "x" * (6 << 20), inputs)
    failure = artifact.read_error(target)
    assert failure.key == "K1" and failure.inputs == inputs and failure.without_traceback == "k failed\n  error: boom"
    assert len(failure.message) < (1 << 20) + 1000 and f"{target.error_path} holds" in failure.message.splitlines()[-1]
    reads = []
    monkeypatch.setattr(artifact, "Failure", lambda *args: reads.append(args) or failure)
    assert artifact.read_error(target) == failure and artifact.saved_failure(target) == "k failed\n  error: boom"
    assert reads == []   # doit info's state line, then saved_failure: the file is read once
    monkeypatch.setattr(artifact, "read_error", lambda target: pytest.fail("error.txt read a second time"))
    assert artifact.saved_failure(target, failure) == "k failed\n  error: boom"
    artifact.write_error(target, "k failed again")   # replaced (by rename): read anew
    monkeypatch.undo()
    assert artifact.read_error(target).message == "k failed again\n"


# --- CompileResult.values -------------------------------------------------------------------------------------


def test_a_plain_compile_result_reports_only_the_fields_that_are_set():
    assert CompileResult(1.25, 0.5, "ab" * 32).values() == {
        "seconds": 1.25, "compile_seconds": 0.5, "sha256": "ab" * 32}


def test_a_cache_hit_reports_from_cache_and_its_warnings_as_a_list_and_no_compile_time():
    values = CompileResult(0.3, from_cache=True, cache_warnings=("cache down (GET x)", "slow")).values()
    assert values == {"seconds": 0.3, "from_cache": True, "cache_warnings": ["cache down (GET x)", "slow"]}


def test_a_cluster_compile_reports_where_it_ran():
    values = CompileResult(2.0, 1.5, "cd" * 32, compiled_on="tcp://10.0.0.7:4001").values()
    assert values["compiled_on"] == "tcp://10.0.0.7:4001"


def test_compile_result_values_are_plain_json_with_what_the_report_reads():
    values = CompileResult(2.0, 1.5, "cd" * 32, True, "tcp://w:1", ("w",)).values()
    assert json.loads(json.dumps(values)) == values
    assert set(report.REPORTED_VALUES) - {"from_local_cache"} | {"cache_warnings"} <= set(values)
    assert {k: v for k, v in values.items() if k in report.REPORTED_VALUES} == {
        "from_cache": True, "compiled_on": "tcp://w:1", "compile_seconds": 1.5}
    local = CompileResult(0.1, from_local_cache=True).values()   # one cache or the other
    assert local == {"seconds": 0.1, "from_local_cache": True} and CompileResult.of(local).origin == "local cache"


def test_a_zero_duration_is_a_set_field_and_is_reported():
    assert CompileResult(0.0, 0.0, "ab" * 32).values() == {
        "seconds": 0.0, "compile_seconds": 0.0, "sha256": "ab" * 32}


def test_a_result_read_back_from_its_values_is_the_same_result():
    result = CompileResult(2.0, 1.5, "cd" * 32, False, "tcp://w:1", ("w",), (("compile", 1.0, 2.0),), 7)
    assert CompileResult.of(json.loads(json.dumps(result.values()))) == result
    assert CompileResult.of({"name": "package:sm_90a", "seconds": 1.0}) == CompileResult(1.0)   # a package's values
    assert [CompileResult(1.0, from_cache=True).origin, CompileResult(1.0).origin] == ["remote cache", "compiled"]
    assert CompileResult(1.0, unchanged=True).origin == "unchanged"   # early cutoff
    assert set(report.ORIGINS) == {"compiled", "local cache", "remote cache", "unchanged"}


# --- arrive / install: one installer for every source ---------------------------------------------------------

class FakeSource:
    """A cache offering what it was given: the interface compile/action.py drives every cache through."""

    def __init__(self, offer=None, unreadable=None):
        self.offer, self.unreadable, self.calls = offer, unreadable, []

    def lookup(self, target):
        self.calls.append("lookup")
        if self.unreadable:
            raise ValueError(self.unreadable)
        return self.offer

    def refused(self, target, error):
        self.calls.append("refused")
        return [f"refused: {error}"]

    def took(self, target):
        self.calls.append("took")


def target_for(built, tmp_path, arch="sm_90a"):
    """The scale target of `built` for `arch`, with its artifact directory under tmp_path's out/."""
    meta = json.loads((built / "out" / arch / "scale" / "fp16-b256-w4" / "meta.json").read_text())
    layout = Layout(tmp_path)
    return SimpleNamespace(name=meta["target"], kernel="scale", config_id="fp16-b256-w4", arch=arch,
                           key=meta["key"], config=tuple(meta["config"].items()), layout=layout, recorded_code=(),
                           out_dir=layout.artifact_path(arch, "scale", "fp16-b256-w4"),
                           meta_path=layout.meta_path(arch, "scale", "fp16-b256-w4"))


def test_a_miss_is_quiet_and_writes_nothing(built, tmp_path):
    source = FakeSource()
    assert artifact.arrive(target_for(built, tmp_path), source) == (None, []) and source.calls == ["lookup"]
    assert not (tmp_path / "out").exists()


def test_an_offered_artifact_is_installed_as_a_build_writes_it(built, tmp_path):
    shutil.copytree(built / "tk", tmp_path / "tk")   # what its compile read, the same here
    target = target_for(built, tmp_path)
    built_dir = built / "out/sm_90a/scale/fp16-b256-w4"
    candidate = Candidate(artifact.files_of(built_dir), CompileResult(from_cache=True))
    source = FakeSource(candidate)
    assert artifact.arrive(target, source) == (candidate, []) and source.calls == ["lookup", "took"]
    assert artifact.is_current(target.meta_path, target.key)
    for name in ("meta.json", "scale_kernel.cubin"):   # byte for byte what the build wrote
        assert (Path(target.out_dir) / name).read_bytes() == (built_dir / name).read_bytes()


def test_an_entry_whose_compile_read_other_content_than_here_is_no_hit(built, tmp_path):
    """The key is what the catalog knows; a file the entry's compile read (its meta.json lists it) that has other
    content here makes it no hit: the next source is asked, and the target compiles in the end."""
    shutil.copytree(built / "tk", tmp_path / "tk")
    (tmp_path / "tk" / "__init__.py").write_text("# edited\n")
    source = FakeSource(Candidate(artifact.files_of(built / "out/sm_90a/scale/fp16-b256-w4")))
    assert artifact.arrive(target_for(built, tmp_path), source) == (None, [])


@pytest.mark.parametrize("real", ["gfx942", "sm_80"])
def test_another_archs_artifact_offered_for_this_target_is_refused_by_the_installer_whatever_the_source(
        built, tmp_path, real):
    """A cache entry holding another arch's build (its meta.json even rewritten for this target, sealed again)
    never passes as built: the installer checks the binary for the TARGET's arch."""
    target = target_for(built, tmp_path)
    files = artifact.files_of(built / "out" / real / "scale" / "fp16-b256-w4")
    meta = json.loads(files["meta.json"])
    meta.update(target=target.name, arch=target.arch, key=target.key)
    meta["seal"] = artifact.seal({k: v for k, v in meta.items() if k != "seal"})
    files["meta.json"] = json.dumps(meta).encode()
    source = FakeSource(Candidate(files))
    hit, [warning] = artifact.arrive(target, source)
    assert hit is None and source.calls == ["lookup", "refused"]
    assert warning.startswith("refused: its binary is refused: ") and f"{real}, expected sm_90a" in warning
    assert not (tmp_path / "out").exists()


def test_an_unreadable_entry_is_a_miss_with_the_sources_warning(built, tmp_path):
    source = FakeSource(unreadable="its header is unreadable")
    assert artifact.arrive(target_for(built, tmp_path), source) == (None, ["refused: its header is unreadable"])
    assert not (tmp_path / "out").exists()


def test_only_the_installer_writes_an_artifact():
    """Every source's artifact goes through artifact.install (the checks, then the files): no other module of
    kforge writes a file named META (meta.json)."""
    import ast
    rules = REPO / "rules"
    writers = set()
    for path in rules.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) in
                    ("atomic_write", "write_inside", "write_bytes", "write_text") and node.args
                    and any(isinstance(n, ast.Name) and n.id == "META" for n in ast.walk(node.args[0]))):
                writers.add(path.relative_to(rules).as_posix())
    assert writers == {"store/artifact.py"}


def test_an_artifact_from_outside_whose_meta_json_is_not_an_object_is_refused_in_one_line(tmp_path):
    target = target_at(tmp_path / "out" / "sm_90a" / "scale" / "fp16-b256-w4")
    with pytest.raises(artifact.ArtifactError, match=r"^its meta\.json is not a JSON object$"):
        artifact.accept(target, {artifact.META: b"[1]", "scale_kernel.cubin": b"\x7fELF"})


def bound_meta(target, **more) -> dict:
    """A meta.json bound to `target` (check_bound's fields), naming the binary k.cubin."""
    return {"target": target.name, "kernel": target.kernel, "config_id": target.config_id, "arch": target.arch,
            "key": target.key, "config": dict(target.config), "binary": "k.cubin", **more}


def test_an_artifact_from_outside_with_a_file_more_or_a_wrong_seal_is_refused_in_one_line(tmp_path):
    """artifact.py 248 and 251 (a cache entry holding a file besides meta.json and its binary; one whose seal does
    not match its fields): reachable from a remote or local cache entry, never run in the whole suite's coverage."""
    target = target_at(tmp_path / "out" / "sm_90a" / "scale" / "fp16-b256-w4", name="scale:fp16-b256-w4@sm_90a",
                       kernel="scale", config_id="fp16-b256-w4", arch="sm_90a", key="ab" * 32,
                       config=(("dtype", "fp16"),))
    meta = json.dumps(bound_meta(target)).encode()
    with pytest.raises(artifact.ArtifactError) as e:
        artifact.accept(target, {artifact.META: meta, "k.cubin": b"\x7fELF", "extra.txt": b""})
    assert str(e.value) == ("it holds ['extra.txt', 'k.cubin', 'meta.json'], not exactly meta.json and the binary it "
                            "names ('k.cubin')")
    meta = json.dumps(bound_meta(target, seal="0" * 64)).encode()
    with pytest.raises(artifact.ArtifactError, match=r"^its meta\.json's seal does not match its fields$"):
        artifact.accept(target, {artifact.META: meta, "k.cubin": b"\x7fELF"})
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("binary, said", [
    ("k.cubin", "unreadable artifact ([Errno 2] No such file or directory: "),
    ("../k.cubin", "unreadable artifact (file name '../k.cubin' is not a plain file name"),
    (None, "unreadable artifact ('binary'); delete the directory and build again"),
])
def test_an_artifact_whose_binary_is_gone_or_misnamed_is_one_line_naming_its_folder(tmp_path, binary, said):
    """artifact.py 444-445 (binary_of: the binary deleted since its compile, or meta.json naming no plain file):
    reachable from `doit package` over an out/ changed by hand, never run in the whole suite's coverage."""
    directory = tmp_path / "out" / "sm_90a" / "scale" / "fp16-b256-w4"
    directory.mkdir(parents=True)
    meta = {"arch": "sm_90a", **({"binary": binary} if binary else {})}
    with pytest.raises(artifact.ArtifactError) as e:
        artifact.binary_of(directory, meta)
    assert str(e.value).startswith(f"{directory}: {said}") and "\n" not in str(e.value), str(e.value)
    assert str(e.value).endswith("; delete the directory and build again")


def test_an_artifact_of_an_arch_kforge_does_not_know_is_one_line_naming_its_meta_json(tmp_path):
    """artifact.py 447: package checks meta.json bound to its target first (its arch is the target's, a known one):
    reached by artifact.load alone, which only the GPU benchmark calls."""
    directory = tmp_path / "out" / "sm_99" / "scale" / "c"
    directory.mkdir(parents=True)
    (directory / "k.cubin").write_bytes(b"\x7fELF")
    with pytest.raises(artifact.ArtifactError) as e:
        artifact.binary_of(directory, {"arch": "sm_99", "binary": "k.cubin"})
    assert str(e.value).startswith(f"{directory / 'meta.json'}: unknown arch 'sm_99' (kforge's: sm_80, ")
    assert str(e.value).endswith(f"); delete {directory} and build again")


def test_a_file_name_from_outside_is_cut_short_in_its_one_line():
    """A hostile entry's 60,000-character binary name was written whole into the build's warning."""
    with pytest.raises(artifact.ArtifactError) as e:
        artifact.plain_name("../" + "k" * 60_000)
    assert str(e.value).startswith("file name '../kkk") and "..." in str(e.value) and len(str(e.value)) < 250
