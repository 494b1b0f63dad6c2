"""The local cache (rules/share/local_cache.py): entries by action key outside the checkout, shared by every checkout of
the user. A revert and a second checkout at another path compile nothing; a corrupt or foreign entry is refused
with one line and rebuilt; two writers at once leave whole entries; the cache is trimmed to its limit, least
recently used first; local_cache=off neither reads nor writes it."""
import json
import multiprocessing
import os
import shutil
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

from kforge.base.layout import Layout
from kforge.store import artifact
from kforge.share import local_cache
from kforge.base import settings
from kforge.share.local_cache import LocalCache
from tests.support import REPO, doit, kernel_text, make_project, spec_text

SPEC = spec_text(archs=("sm_90a", "gfx942"), dtypes=("fp16",))   # two targets: one NVIDIA, one AMD
FP16_SM90 = "scale:fp16-b256-w4@sm_90a"


def project(path: Path, factor: str = "3") -> Path:
    return make_project(path, specs={"scale": SPEC}, kernels={"scale": kernel_text(factor=factor)})


def build(root: Path, cache: Path | str, *args: str) -> tuple[str, dict]:
    """doit in root with this local cache: (stdout, build-report.json)."""
    out = doit(root, *args, env={"KFORGE_LOCAL_CACHE": str(cache)}).stdout
    return out, json.loads((root / "out" / "build-report.json").read_text())


def origins(report: dict) -> dict[str, str]:
    return {t["name"]: t.get("origin", t["status"]) for t in report["tasks"]}


def entries(cache: Path) -> list[Path]:
    return sorted(p for p in cache.glob("??/*") if not p.name.startswith("."))


@pytest.fixture(scope="module")
def seeded(tmp_path_factory):
    """(a checkout built once, the local cache that build filled): tests copy the cache, never change it."""
    base = tmp_path_factory.mktemp("seeded")
    root, cache = project(base / "first"), base / "cache"
    out, report = build(root, cache)
    assert set(origins(report).values()) == {"compiled"} and len(entries(cache)) == 2, out
    return root, cache


def test_a_second_checkout_at_another_path_compiles_nothing(seeded, tmp_path):
    first, seed = seeded
    cache = shutil.copytree(seed, tmp_path / "cache")
    second = project(tmp_path / "elsewhere" / "second")
    out, report = build(second, cache)
    assert set(origins(report).values()) == {"local cache"}, out
    assert report["origins"] == {"compiled": 0, "local cache": 2, "remote cache": 0, "unchanged": 0}
    assert f"local  {FP16_SM90}" in out and "built 2 (2 from the local cache), up to date 0" in out
    binaries = lambda root: {p.relative_to(root): p.read_bytes() for p in (root / "out").glob("*/scale/*/*")}
    assert binaries(second) == binaries(first)   # meta.json and binary, byte for byte
    out, report = build(second, cache)   # a no-op: out/ is current, the cache is not even looked at
    assert set(origins(report).values()) == {"up-to-date"}


def test_a_revert_compiles_nothing(seeded, tmp_path):
    cache = shutil.copytree(seeded[1], tmp_path / "cache")
    root = project(tmp_path / "p")
    kernel = root / "tk" / "scale.py"
    original = kernel.read_text()
    kernel.write_text(original + "# an edit\n")
    out, report = build(root, cache)
    assert set(origins(report).values()) == {"compiled"}, out   # a new key: compiled, and kept
    edited = wheels(root)
    kernel.write_text(original)   # the revert
    out, report = build(root, cache)
    assert set(origins(report).values()) == {"local cache"}, out
    assert wheels(root).keys().isdisjoint(edited)
    kernel.write_text(original + "# an edit\n")   # and forward again
    assert set(origins(build(root, cache)[1]).values()) == {"local cache"}
    assert len(entries(cache)) == 4
    assert wheels(root) == edited   # the very files the edit's build wrote (kept, renamed back): not zipped again


def wheels(root: Path) -> dict[str, tuple[int, bytes]]:
    """out/dist's wheels: name -> (inode, bytes)."""
    return {w.name: (w.stat().st_ino, w.read_bytes()) for w in (root / "out" / "dist").glob("*.whl")}


def test_a_corrupt_or_foreign_entry_is_refused_in_one_line_and_rebuilt(seeded, tmp_path):
    cache = shutil.copytree(seeded[1], tmp_path / "cache")
    root = project(tmp_path / "p")
    keys = {json.loads(m.read_text())["arch"]: json.loads(m.read_text())["key"]
            for m in (seeded[0] / "out").glob("*/scale/*/meta.json")}
    nvidia, amd = (local_cache.entry_path(LocalCache(str(cache), 0), keys[a]) for a in ("sm_90a", "gfx942"))
    damaged = bytearray(nvidia.read_bytes())
    damaged[-200] ^= 0xFF   # inside the binary
    nvidia.write_bytes(bytes(damaged))
    # foreign: the NVIDIA target's files under the AMD target's key, its header made to say so
    amd.write_bytes(local_cache.pack(keys["gfx942"], local_cache.unpack(bytes(damaged), keys["sm_90a"])))
    out, report = build(root, cache)
    assert set(origins(report).values()) == {"compiled"}
    warnings = [line for line in out.splitlines() if line.startswith("kforge: warning: local cache entry")]
    assert len(warnings) == 2, out   # one line each, naming the entry and the target
    assert any(str(nvidia) in w and FP16_SM90 in w and "sha256" in w for w in warnings), warnings
    assert any(str(amd) in w and "its meta.json says target" in w for w in warnings), warnings
    # each rebuilt target's entry replaced the refused one: the next checkout hits both
    assert set(origins(build(project(tmp_path / "q"), cache)[1]).values()) == {"local cache"}


def test_an_entry_whose_inputs_are_not_names_is_compiled_over_without_a_traceback(seeded, tmp_path):
    """meta.json's "inputs" from a hand-edited or hostile entry ([[5, null]]): never looked up as file names."""
    cache = shutil.copytree(seeded[1], tmp_path / "cache")
    for path in entries(cache):
        key = path.name[:64]
        files = local_cache.unpack(path.read_bytes(), key)
        meta = json.loads(files["meta.json"])
        meta.pop("seal", None)
        meta["inputs"] = [[5, None]]
        files["meta.json"] = json.dumps(meta).encode()
        path.write_bytes(local_cache.pack(key, files))
    root = project(tmp_path / "p")
    proc = doit(root, check=False, env={"KFORGE_LOCAL_CACHE": str(cache)})
    assert proc.returncode == 0 and "Traceback" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    assert set(origins(json.loads((root / "out" / "build-report.json").read_text())).values()) == {"compiled"}


def test_an_entry_of_another_key_or_cut_short_is_refused_before_any_check():
    key, other = "a" * 64, "b" * 64
    whole = local_cache.pack(key, {"meta.json": b"{}", "k.cubin": b"\x7fELF" + b"\0" * 60})
    assert local_cache.unpack(whole, key) == {"meta.json": b"{}", "k.cubin": b"\x7fELF" + b"\0" * 60}
    with pytest.raises(ValueError, match="made for key bbbb"):
        local_cache.unpack(local_cache.pack(other, {"meta.json": b"{}"}), key)
    with pytest.raises(ValueError, match="truncated or altered"):
        local_cache.unpack(whole[:-1], key)
    with pytest.raises(ValueError, match="no kforge-local-1 header"):
        local_cache.unpack(b"\0" * 100, key)


def _writer(root: str, key: str, size: int, rounds: int) -> None:
    """Store the same key `rounds` times, each time an artifact of `size` bytes (fake files: store checks nothing)."""
    out_dir = Path(root) / f"out-{size}"
    out_dir.mkdir()
    (out_dir / "meta.json").write_text(json.dumps({"binary": "k.bin"}))
    (out_dir / "k.bin").write_bytes(bytes([size % 251]) * size)
    target = types.SimpleNamespace(key=key, out_dir=str(out_dir))
    for _ in range(rounds):
        assert local_cache.store(LocalCache(str(Path(root) / "cache"), 1 << 30), target) == []


def test_two_writers_at_once_leave_only_whole_entries(tmp_path):
    key = "c" * 64
    path = local_cache.entry_path(LocalCache(str(tmp_path / "cache"), 0), key)
    ctx = multiprocessing.get_context("fork")
    writers = [ctx.Process(target=_writer, args=(str(tmp_path), key, size, 200)) for size in (100_000, 300_000)]
    for w in writers:
        w.start()
    seen = set()
    while any(w.is_alive() for w in writers):
        try:
            files = local_cache.unpack(path.read_bytes(), key)   # never a torn entry: whole, or not there yet
        except FileNotFoundError:
            continue
        seen.add(len(files["k.bin"]))
    assert all(w.join() or w.exitcode == 0 for w in writers)
    assert seen <= {100_000, 300_000} and seen
    assert [p.name for p in path.parent.iterdir()] == [key]   # no temp file left behind


def test_two_builds_at_once_share_one_cache(tmp_path):
    cache = tmp_path / "cache"
    roots = [project(tmp_path / name, factor="11") for name in ("a", "b")]
    env = dict(os.environ, KFORGE_LOCAL_CACHE=str(cache),
               PYTHONPATH=os.pathsep.join(filter(None, (str(REPO), os.environ.get("PYTHONPATH")))))
    procs = [subprocess.Popen([sys.executable, "-m", "doit", "-n", "1"], cwd=root, env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for root in roots]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert len(entries(cache)) == 2 and not list(cache.glob("??/.*"))
    out, report = build(project(tmp_path / "c", factor="11"), cache)
    assert set(origins(report).values()) == {"local cache"}, out


def test_the_cache_is_trimmed_to_its_limit_least_recently_used_first(tmp_path):
    cache = LocalCache(str(tmp_path / "cache"), 3000)
    now = time.time()
    paths = []
    for i in range(5):
        path = local_cache.entry_path(cache, f"{i:x}" * 64)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x" * 1000)
        os.utime(path, (now - 100 + i, now - 100 + i))   # entry 0 used longest ago
        paths.append(path)
    os.utime(paths[0], (now, now))   # a hit makes it the most recently used
    stale = paths[1].parent / f".{'1' * 64}.123.abcd.tmp"   # a killed writer's temp file, two hours old
    stale.write_bytes(b"half")
    os.utime(stale, (now - 7200, now - 7200))
    mine = tmp_path / "cache" / "11" / "notes.txt"   # not a cache entry's name: never deleted
    mine.write_text("keep")
    assert local_cache.usage(cache) == (5, 5000, 0, 0)
    left = local_cache.trim(cache)
    assert (left.entries, left.size, left.evicted, left.evicted_size) == (3, 3000, 2, 2000)
    assert [p.exists() for p in paths] == [True, False, False, True, True]
    assert not stale.exists() and mine.exists()


def test_a_build_over_the_limit_evicts_and_says_so_and_doit_cache_shows_and_trims(seeded, tmp_path):
    cache = shutil.copytree(seeded[1], tmp_path / "cache")
    size = sum(p.stat().st_size for p in entries(cache))
    root = project(tmp_path / "p", factor="13")   # two new keys
    out, report = build(root, cache, f"local_cache_limit={size}")
    assert "kforge: local cache: evicted the 2 entries least recently used" in out, out
    assert len(entries(cache)) == 2 and sum(p.stat().st_size for p in entries(cache)) <= size
    shown = doit(root, "cache", env={"KFORGE_LOCAL_CACHE": str(cache)}).stdout
    assert shown.startswith(f"kforge: local cache {cache}: 2 entries, ") and "of local_cache_limit=2.0 GiB" in shown
    trimmed = doit(root, "cache", "--trim", "local_cache_limit=1", env={"KFORGE_LOCAL_CACHE": str(cache)}).stdout
    assert "0 entries, 0 B of local_cache_limit=1 B; evicted 2" in trimmed and entries(cache) == []


READS_A_CONFIG = kernel_text(factor="FACTOR", imports=(
    "import json, os\nFACTOR = tl.constexpr(json.load(open(os.path.join(os.path.dirname(__file__), 'cfg.json')))"
    "['factor'])"))


def test_a_revert_of_a_file_only_the_compile_read_installs_from_the_cache(tmp_path):
    """tk/cfg.json is read at import: not in the key, only in the entry's recorded inputs. Its edit compiles and
    stores a second entry of the same key; the revert takes the first one back instead of compiling."""
    cache = tmp_path / "cache"
    root = make_project(tmp_path / "p", specs={"scale": spec_text()}, kernels={"scale": READS_A_CONFIG})
    config = root / "tk" / "cfg.json"
    config.write_text('{"factor": 3}')
    built = {}
    for factor, origin in ((3, "compiled"), (5, "compiled"), (3, "local cache"), (5, "local cache")):
        config.write_text(f'{{"factor": {factor}}}')
        out, report = build(root, cache)
        assert origins(report) == {FP16_SM90: origin}, (factor, out)
        binary = next((root / "out" / "sm_90a" / "scale").glob("*/*.cubin")).read_bytes()
        assert built.setdefault(factor, binary) == binary   # the entry for these contents, not the other one
    assert built[3] != built[5]
    key = json.loads(next((root / "out" / "sm_90a" / "scale").glob("*/meta.json")).read_text())["key"]
    assert sorted(p.name[:64] for p in entries(cache)) == [key, key] and len({p.name for p in entries(cache)}) == 2


def test_a_record_family_that_gains_a_line_takes_its_renamed_config_from_the_cache(tmp_path):
    """A record family's configs are named by what tells its lines apart: one line is `r`; with a second line
    (another BLOCK) they are named by BLOCK. The first line's binary is the same under its new name and key: it
    comes from the cache relabelled (meta.json says the new target), only the new line compiles."""
    cache = tmp_path / "cache"
    record = {"format": "kforge-record-1", "kernel": "tk.scale:scale_kernel", "arch": "sm_90a",
              "signature": [["x_ptr", "*fp16"], ["y_ptr", "*fp16"], ["n", "i32"], ["BLOCK", "constexpr"]],
              "divisible_by_16": ["x_ptr", "y_ptr"], "options": {"num_warps": 4, "num_stages": 3}}
    line = lambda block: json.dumps({**record, "constexprs": {"BLOCK": block}}) + "\n"
    first = make_project(tmp_path / "first", specs={})
    (first / "specs" / "app.jsonl").write_text(line(128))
    out, report = build(first, cache)
    assert list(origins(report).values()) == ["compiled"], out
    second = make_project(tmp_path / "second", specs={})
    (second / "specs" / "app.jsonl").write_text(line(128) + line(256))
    out, report = build(second, cache)
    by_block = {json.loads((second / "out" / "sm_90a" / t.split("@")[0].replace(":", "/") / "meta.json")
                           .read_text())["constexprs"]["BLOCK"]: (t, o) for t, o in origins(report).items()}
    assert {b: o for b, (_, o) in by_block.items()} == {128: "local cache", 256: "compiled"}, out
    assert "refused" not in out, out
    name, _ = by_block[128]
    meta = json.loads((second / "out" / "sm_90a" / name.split("@")[0].replace(":", "/") / "meta.json").read_text())
    assert meta["target"] == name and meta["seal"] == artifact.seal(meta)
    assert set(origins(build(second, cache)[1]).values()) == {"up-to-date"}   # installed as this target's own


def test_a_file_where_the_default_cache_folder_belongs_is_one_warning_and_doit_cache_names_it(tmp_path):
    """$XDG_CACHE_HOME/kforge a file (local_cache= given as a file is refused before the run: rules/base/settings.py):
    not one refusal per target (a catalog of 1,000 would print 1,000) but one line naming the file and the fix;
    every target still builds."""
    (tmp_path / "xdg").mkdir()
    cache = tmp_path / "xdg" / "kforge"
    cache.write_text("a file")
    root = project(tmp_path / "p")
    env = {"KFORGE_LOCAL_CACHE": "", "XDG_CACHE_HOME": str(tmp_path / "xdg")}
    out = doit(root, env=env).stdout
    report = json.loads((root / "out" / "build-report.json").read_text())
    assert set(origins(report).values()) == {"compiled"}, out
    assert "kforge: 1 warning: " in out, out   # the run's summary counts it once
    warnings = [line for line in out.splitlines() if line.startswith("kforge: warning: local cache")]
    assert len(warnings) == 1 and warnings[0].startswith(f"kforge: warning: local cache {cache} not writable"), out
    assert warnings[0].endswith(f"({cache} is a file, not a folder: remove it or point local_cache= elsewhere (or set "
                                f"local_cache=off))"), out
    shown = doit(root, "cache", env=env, check=False)
    assert shown.returncode == 2 and f"{cache} is a file, not a folder" in shown.stdout, shown.stdout


def test_local_cache_off_neither_reads_nor_writes_it(seeded, tmp_path):
    cache = shutil.copytree(seeded[1], tmp_path / "cache")
    before = {p: p.stat().st_mtime_ns for p in entries(cache)}
    root = project(tmp_path / "p")
    out = doit(root, "local_cache=off", env={"KFORGE_LOCAL_CACHE": str(cache)}).stdout
    assert set(origins(json.loads((root / "out" / "build-report.json").read_text())).values()) == {"compiled"}, out
    assert {p: p.stat().st_mtime_ns for p in entries(cache)} == before
    assert doit(root, "cache", "local_cache=off").stdout == "kforge: the local cache is off (local_cache=off)\n"


def test_the_cache_directory_defaults_to_the_users_cache_and_sizes_read_as_people_write_them(monkeypatch):
    monkeypatch.delenv("KFORGE_LOCAL_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", "/somewhere/cache")
    assert settings.get("local_cache") == "/somewhere/cache/kforge"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative")   # the XDG spec ignores a relative one
    assert settings.get("local_cache") == str(Path.home() / ".cache" / "kforge")
    monkeypatch.setenv("KFORGE_LOCAL_CACHE", "off")
    assert settings.get("local_cache") is None
    assert [settings._size()(t, "x") for t in ("2G", "500M", "64KiB", "1048576", "1tb")] == \
        [2 << 30, 500 << 20, 64 << 10, 1 << 20, 1 << 40]
    assert settings.get("local_cache_limit") == 2 << 30


def test_a_link_or_fifo_in_place_of_an_entry_is_refused_without_reading_through_it(tmp_path):
    cache = LocalCache(str(tmp_path / "cache"), 1 << 30)
    target = types.SimpleNamespace(key="d" * 64, name="k:x@sm_90a", out_dir=str(tmp_path / "out"))
    fetch = lambda: artifact.arrive(target, local_cache.Source(cache))
    path = local_cache.entry_path(cache, target.key)
    path.parent.mkdir(parents=True)
    path.symlink_to("/dev/zero")
    assert fetch()[1] == [
        f"local cache entry {path} for k:x@sm_90a refused (is a symbolic link, not a file kforge wrote); "
        f"compiling it here (its build replaces the entry)"]
    assert not os.path.lexists(path)   # deleted: the build stores a real entry there
    os.mkfifo(path)   # a read would block forever
    assert "refused (is a FIFO or pipe, not a file kforge wrote)" in fetch()[1][0]
    os.mkfifo(path)   # storing over it reads the header of what is there (to keep another inputs' entry): never this
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "meta.json").write_text(json.dumps({"binary": "k.bin", "inputs": []}))
    (tmp_path / "out" / "k.bin").write_bytes(b"\x7fELF")
    import threading
    storing = threading.Thread(target=local_cache.store, args=(cache, target), daemon=True)
    storing.start()
    storing.join(10)
    assert not storing.is_alive() and path.is_file()


def built_artifact(out: Path) -> Path:
    out.mkdir()
    (out / "meta.json").write_text(json.dumps({"binary": "k.bin"}))
    (out / "k.bin").write_bytes(b"\x7fELF")
    return out


@pytest.mark.parametrize("what", ["file", "link"])
def test_a_file_or_link_where_a_folder_of_entries_belongs_is_left_as_it_is_with_one_warning(tmp_path, what):
    """local_cache=~/my_documents holding a note named 79 (a key's first two hex digits): the build deleted it to
    make the cache's folder of entries there, silently; a link there was unlinked the same way. What the cache did
    not write is never removed nor followed: the entries of that prefix are not stored, said once, with the fix."""
    cache = LocalCache(str(tmp_path / "my_documents"), 1 << 30)
    target = types.SimpleNamespace(key="e" * 64, name="k:x@sm_90a", out_dir=str(built_artifact(tmp_path / "out")))
    folder = local_cache.entry_path(cache, target.key).parent
    folder.parent.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    folder.write_text("my notes") if what == "file" else folder.symlink_to(elsewhere)
    said = local_cache.store(cache, target)
    kind = "a file, not a folder" if what == "file" else "a symbolic link"
    assert said == [f"local cache {folder} is {kind}, which kforge did not write: it is left as it is, and every "
                    f"entry whose key starts with ee is not stored there; point local_cache= at a folder of its own "
                    f"(or set local_cache=off)"]
    assert local_cache.store(cache, target) == []   # once, not per target
    if what == "file":
        assert folder.read_text() == "my notes"
    else:
        assert folder.is_symlink() and list(elsewhere.iterdir()) == []
        # nothing read, nor deleted, through it either: an entry-shaped file there is not the cache's
        (elsewhere / target.key).write_bytes(b"not an entry")
        assert artifact.arrive(target, local_cache.Source(cache)) == (None, [])
        assert (elsewhere / target.key).read_bytes() == b"not an entry"
    assert local_cache.trim(LocalCache(cache.root, 0)).evicted == 0 and folder.is_symlink() == (what == "link")


def test_the_cache_removes_and_replaces_only_what_it_wrote(tmp_path):
    """Siblings of the note named 79: a folder at an entry's place (files.atomic_write removes a folder where it
    writes) and a user's file named after a key (`<key>-notes`, taken for another inputs' entry, refused and
    deleted) are left as they are."""
    cache = LocalCache(str(tmp_path / "cache"), 1 << 30)
    target = types.SimpleNamespace(key="f" * 64, name="k:x@sm_90a", arch="sm_90a",
                                   out_dir=str(built_artifact(tmp_path / "out")), layout=Layout(tmp_path / "p"))
    entry = local_cache.entry_path(cache, target.key)
    (entry / "inside").mkdir(parents=True)
    assert local_cache.store(cache, target) == [
        f"local cache {entry} is a folder, which kforge did not write: it is left as it is, and this key's entry is "
        f"not stored there; point local_cache= at a folder of its own (or set local_cache=off)"]
    assert (entry / "inside").is_dir()
    shutil.rmtree(entry)
    notes = entry.with_name(f"{target.key}-notes")
    notes.write_text("my notes")
    assert artifact.arrive(target, local_cache.Source(cache)) == (None, [])   # a miss: no entry of this key
    assert notes.read_text() == "my notes"


def test_two_targets_of_one_key_say_so_plainly_not_as_a_refused_entry_and_keep_the_others_entry(tmp_path):
    """A family copied under another name builds the same kernel under one action key (the key holds no family name):
    each target's build stores over the other's entry. The other's entry, whole and sealed, is named for what it is
    (two targets, one key; not corruption) and left in place, not deleted as damage; a tampered one still is."""
    cache = tmp_path / "cache"
    specs = {"scale": spec_text(), "copy": spec_text(name="copy")}
    out, report = build(make_project(tmp_path / "p", specs=specs, kernels={"scale": kernel_text()}), cache)
    (entry,) = entries(cache)   # both targets, one key: one entry, the last one stored
    owner = json.loads(local_cache.unpack(entry.read_bytes(), entry.name)["meta.json"])["target"]
    other = next(t for t in origins(report) if t != owner)
    warning = lambda out: [line for line in out.splitlines() if line.startswith("kforge: warning: local cache entry")]
    kept = entry.read_bytes()
    out, report = build(make_project(tmp_path / "q", specs=specs, kernels={"scale": kernel_text()}), cache, other)
    assert origins(report) == {other: "compiled"}, out
    (said,) = warning(out)
    assert "refused" not in said and f"holds {owner}'s artifact, not {other}'s" in said, said
    assert "share one action key" in said and "not corruption" in said, said
    files = local_cache.unpack(kept, entry.name)   # the owner's entry again, its binary tampered with
    name = json.loads(files["meta.json"])["binary"]
    files[name] = files[name][:-1] + bytes([files[name][-1] ^ 0xFF])
    entry.write_bytes(local_cache.pack(entry.name, files))
    out, _ = build(make_project(tmp_path / "r", specs=specs, kernels={"scale": kernel_text()}), cache, other)
    (said,) = warning(out)
    assert f"for {other} refused" in said and "not corruption" not in said, said
    assert entry.read_bytes() != kept   # deleted as damage; the build stored its own


def test_the_cache_folder_kforge_makes_is_the_users_alone_under_any_umask(tmp_path):
    """Under umask 002 (many distributions' default for their users) the folder was group-writable, and the kept
    bytecode beside the entries, which takes only a folder no one else can write to, then kept nothing."""
    cache = LocalCache(str(tmp_path / "cache"), 1 << 30)
    target = types.SimpleNamespace(key="e" * 64, out_dir=str(tmp_path / "out"))
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "meta.json").write_text(json.dumps({"binary": "k.bin"}))
    (tmp_path / "out" / "k.bin").write_bytes(b"\x7fELF")
    old = os.umask(0o002)
    try:
        assert local_cache.store(cache, target) == []
    finally:
        os.umask(old)
    assert (tmp_path / "cache").stat().st_mode & 0o777 == 0o700


@pytest.mark.parametrize("header, said", [
    (b'[1]', "its header is unreadable (list indices must be integers or slices, not str)"),
    (b'{"files": [["a"]]}', "its header is unreadable (not enough values to unpack (expected 2, got 1))"),
    (b'{"files": []}', "its header is unreadable ('key')"),
    (b'{"files": [[1, 2]], "key": "KEY", "format": "kforge-local-1"}',
     "its header's file list is not [name, size] pairs"),
    (b'[' * 50_000, "its header is unreadable (JSON nested too deeply to read)"),
])
def test_an_entry_whose_header_is_damaged_is_refused_in_one_line_and_deleted(tmp_path, header, said):
    """local_cache.py 228-235 (a header line that is JSON but not the header's shape): reachable from a damaged or
    hostile entry, never run in the whole suite's coverage. One nested 50,000 deep raised RecursionError past
    arrive()'s ValueError: a traceback out of the compile task."""
    key = "ab" * 32
    cache = LocalCache(str(tmp_path / "cache"), 1 << 30)
    entry = local_cache.entry_path(cache, key)
    entry.parent.mkdir(parents=True)
    entry.write_bytes(header.replace(b"KEY", key.encode()) + b"\n")
    with pytest.raises(ValueError) as e:
        local_cache.unpack(entry.read_bytes(), key)
    assert str(e.value) == said
    target = types.SimpleNamespace(key=key, name="scale:fp16@sm_90a", arch="sm_90a")
    assert artifact.arrive(target, local_cache.Source(cache)) == (None, [
        f"local cache entry {entry} for scale:fp16@sm_90a refused ({said}); compiling it here (its build replaces "
        f"the entry)"])
    assert not entry.exists()


def test_an_entry_whose_meta_json_is_nested_too_deeply_is_refused_in_one_line_and_deleted(tmp_path):
    """Its header whole, its meta.json JSON nested 100,000 deep: the check of what its compile read raised
    RecursionError out of the compile task."""
    key = "ab" * 32
    cache = LocalCache(str(tmp_path / "cache"), 1 << 30)
    entry = local_cache.entry_path(cache, key)
    entry.parent.mkdir(parents=True)
    deep = b'{"inputs": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    entry.write_bytes(local_cache.pack(key, {"meta.json": deep, "k.cubin": b"x"}, inputs="0" * 16))
    target = types.SimpleNamespace(key=key, name="scale:fp16@sm_90a", arch="sm_90a",
                                   layout=Layout(tmp_path / "p"))
    assert artifact.arrive(target, local_cache.Source(cache)) == (None, [
        f"local cache entry {entry} for scale:fp16@sm_90a refused (its meta.json is unreadable (JSON nested too "
        f"deeply to read)); compiling it here (its build replaces the entry)"])
    assert not entry.exists()
