"""rules/store/guard.py: the one guard of every write and delete under out/ (never through a link leading outside),
what kforge may delete, a file kforge wrote under out/ read back as untrusted data, and scratch folders."""
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from kforge.base.layout import Layout
from kforge.store import guard
from kforge.store.files import write_inside
from kforge.store.guard import NotAFile, printable, read_bytes
from kforge_runtime.bundle import file_kind


@pytest.fixture
def out(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "elsewhere").mkdir()
    return tmp_path / "out"


def test_a_path_under_a_link_leading_outside_out_is_refused_naming_the_link(out, tmp_path):
    (out / "dist").symlink_to(tmp_path / "elsewhere")
    for path in (out / "dist" / "x.whl", out / "dist" / "deeper" / "x.json"):
        with pytest.raises(guard.OutsideOut) as refused:
            guard.guard(out, path)
        message = str(refused.value)
        assert message.startswith(f"{out / 'dist'} (a symbolic link) leads outside out/") and "\n" not in message
        assert "remove the link" in message


@pytest.mark.parametrize("looped", ["sm_90a/k", ".kforge", "."])
def test_a_path_through_a_symbolic_link_loop_is_refused_in_one_line_not_a_traceback(out, looped):
    """Python's resolve() raises RuntimeError on a loop of links: a loop under out/ (or out/ itself linked to
    itself) was a traceback from every command (a hostile-input review)."""
    loop = out / looped if looped != "." else out
    if looped == ".":
        out.rmdir()
    else:
        loop.parent.mkdir(parents=True, exist_ok=True)
    loop.symlink_to(loop.name)
    with pytest.raises(guard.OutsideOut) as refused:
        guard.guard(out, loop / "a" / "meta.json")
    assert "symbolic links on the way to it form a loop" in str(refused.value) and "\n" not in str(refused.value)
    if looped != ".":
        with pytest.raises(guard.OutsideOut):
            guard.remove_artifact_dir(out, loop / "a")


def test_paths_inside_out_pass_links_included(out, tmp_path):
    (out / "real").mkdir()
    (out / "alias").symlink_to(out / "real")   # a link that stays inside out/
    (out / "build-report.json").symlink_to(tmp_path / "elsewhere" / "r.json")   # the entry itself: replaced, never followed
    for path in (out / "x.json", out / "alias" / "y.json", out / ".kforge" / "tmp" / "z", out / "build-report.json"):
        assert guard.guard(out, path) == path
    linked = tmp_path / "linked-out"
    linked.symlink_to(out)   # out/ itself a link (onto a bigger disk, say): the user's choice
    assert guard.guard(linked, linked / "dist" / "x.whl")


def test_write_inside_and_remove_file_never_touch_what_a_link_leads_to(out, tmp_path):
    (out / ".kforge").symlink_to(tmp_path / "elsewhere")
    (tmp_path / "elsewhere" / "keep.json").write_text("mine")
    with pytest.raises(guard.OutsideOut):
        write_inside(out, out / ".kforge" / "new.json", b"{}")
    with pytest.raises(guard.OutsideOut):
        guard.remove_file(out, out / ".kforge" / "keep.json")
    assert [p.name for p in (tmp_path / "elsewhere").iterdir()] == ["keep.json"]
    write_inside(out, out / "tune" / "gfx942" / "k.json", b"{}")   # inside: written, its folders made
    assert (out / "tune" / "gfx942" / "k.json").read_bytes() == b"{}"


# --- what clean, prune and forget may delete: only what kforge wrote (guard.kforge_files) ---------------------------

KEY = "ab" * 32   # a target's action key: a sha256


def kforge_artifact(directory, binary="k.cubin"):
    """An artifact folder as kforge writes it: a sealed meta.json and the binary it names."""
    from kforge.store import artifact
    directory.mkdir(parents=True)
    (directory / "meta.json").write_bytes(artifact.meta_bytes({"key": "K", "binary": binary, "sha256": "0"}))
    (directory / binary).write_bytes(b"\x7fELF binary")
    return directory


def test_a_users_folder_holding_its_own_meta_json_or_error_txt_is_not_kforges(out):
    arch_dir = out / "sm_90a" / "k"
    mine = {"profile": {"meta.json": '{"run": 3, "key": "K", "binary": "k.cubin"}', "k.cubin": "\x7fELF mine"},
            "notes": {"error.txt": "the run of Tuesday failed\nkey: K\n"},
            "keyed": {"error.txt": "key: mine\nnot kforge's\n"},   # no action key (a sha256) on its first line
            "edited": {"meta.json": '{"key": "K", "binary": "k.cubin", "seal": "0000"}'},
            "one-line": {"error.txt": f"key: {KEY}"}}   # no line end: not as write_error writes it
    for name, files in mine.items():
        (arch_dir / name).mkdir(parents=True)
        for file, text in files.items():
            (arch_dir / name / file).write_text(text)
        assert not guard.written_by_kforge(arch_dir / name), name
    kforge_artifact(arch_dir / "built")
    (arch_dir / "failed").mkdir()
    (arch_dir / "failed" / "error.txt").write_text(f"key: {KEY}\nk failed\n")
    for name in ("built", "failed"):
        assert guard.written_by_kforge(arch_dir / name), name


def test_removing_an_artifact_deletes_only_kforges_files_and_keeps_a_folder_holding_a_users(out, capsys):
    kept = kforge_artifact(out / "sm_90a" / "k" / "c1")
    (kept / "profile.ncu-rep").write_text("mine")
    (kept / ".meta.json.123.0a1b2c3d.tmp").write_text("a write that was killed")
    gone = kforge_artifact(out / "sm_90a" / "k" / "c2")
    assert guard.remove_artifact_dir(out, kept) and guard.remove_artifact_dir(out, gone)
    assert sorted(p.name for p in kept.iterdir()) == ["profile.ncu-rep"]
    assert not gone.exists() and (out / "sm_90a" / "k").is_dir()
    said = capsys.readouterr().err.splitlines()
    assert len(said) == 1 and said[0].startswith(f"kforge: kept {kept}: it holds files kforge did not write "
                                                 f"(profile.ncu-rep)"), said


def test_a_failure_after_a_build_leaves_only_error_txt_which_forget_deletes_with_its_folder(out):
    from types import SimpleNamespace
    from kforge.store import artifact
    directory = kforge_artifact(out / "sm_90a" / "k" / "c1")
    target = SimpleNamespace(layout=SimpleNamespace(out=out), out_dir=str(directory), key=KEY)
    artifact.write_error(target, "k failed")
    assert [p.name for p in directory.iterdir()] == ["error.txt"]   # the binary no meta.json names is gone too
    legacy = kforge_artifact(out / "sm_90a" / "k" / "c2")   # a kforge before kept the binary beside error.txt
    (legacy / "meta.json").unlink()
    (legacy / "error.txt").write_text(f"key: {KEY}\nk failed\n")
    for folder in (directory, legacy):
        assert guard.written_by_kforge(folder) and guard.remove_artifact_dir(out, folder) and not folder.exists()


def refusing(monkeypatch, *paths):
    """Unlinking or removing `paths` fails as `chattr +i` (or another owner's folder, for a non-root user) makes it
    fail; monkeypatched: chattr needs root and a file system that has it."""
    def refuse(real):
        def call(path, *args, **kwargs):
            if Path(path) in paths:
                raise PermissionError(1, "Operation not permitted", str(path))
            return real(path, *args, **kwargs)
        return call
    monkeypatch.setattr(os, "unlink", refuse(os.unlink))
    monkeypatch.setattr(os, "rmdir", refuse(os.rmdir))
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode, **kwargs: (   # what access(2) says of an immutable entry
        not (mode & os.W_OK and Path(path) in paths) and real_access(path, mode, **kwargs)))


def test_an_artifact_folder_that_cannot_be_written_is_one_line_naming_it_and_the_fix_and_loses_nothing(out, monkeypatch):
    """An immutable folder (or a root-owned out/ that Docker left) made forget, clean and prune a 20-line
    traceback ending in PermissionError; its meta.json is deleted last, so a folder half deleted stays kforge's."""
    folder = kforge_artifact(out / "sm_90a" / "k" / "c1")
    refusing(monkeypatch, folder, folder / "meta.json", folder / "k.cubin")   # the folder immutable
    with pytest.raises(guard.NotRemoved) as refused:
        guard.remove_artifact_dir(out, folder)
    said = str(refused.value)
    assert said.startswith(f"cannot delete {folder}/k.cubin (Operation not permitted): make {folder} writable "
                           f"(`chattr -i` it, or `chown` it to you") and said.endswith("run again"), said
    assert "\n" not in said and isinstance(refused.value, OSError)   # a compile's OSError handler says it too
    assert sorted(p.name for p in folder.iterdir()) == ["k.cubin", "meta.json"]
    monkeypatch.undo()
    refusing(monkeypatch, folder / "meta.json")   # meta.json alone immutable: it stays, and says the folder is kforge's
    with pytest.raises(guard.NotRemoved):
        guard.remove_artifact_dir(out, folder)
    assert [p.name for p in folder.iterdir()] == ["meta.json"] and guard.written_by_kforge(folder)
    monkeypatch.undo()
    other = kforge_artifact(out / "sm_90a" / "k" / "c2")
    refusing(monkeypatch, other.parent, other)   # its parent immutable: the folder could be emptied, not removed
    with pytest.raises(guard.NotRemoved) as refused:
        guard.remove_artifact_dir(out, other)
    said = str(refused.value)
    assert said.startswith(f"cannot delete {other}: the folder it is in cannot be written, so nothing in it was "
                           f"deleted: make {other.parent} writable (`chattr -i` it") and "\n" not in said, said
    # nothing deleted: not an empty folder that the next clean or prune would call a user's
    assert sorted(p.name for p in other.iterdir()) == ["k.cubin", "meta.json"] and guard.written_by_kforge(other)


def test_an_immutable_file_in_a_writable_artifact_folder_is_named_itself_not_its_folder(out, monkeypatch):
    """`chattr +i` on the binary alone: `chattr -i` of the folder would not help; the line names the file."""
    folder = kforge_artifact(out / "sm_90a" / "k" / "c1")
    refusing(monkeypatch, folder / "k.cubin")
    with pytest.raises(guard.NotRemoved) as refused:
        guard.remove_artifact_dir(out, folder)
    said = str(refused.value)
    assert said.startswith(f"cannot delete {folder / 'k.cubin'} (Operation not permitted): the file itself refuses "
                           f"it, though its folder can be written: `chattr -i` it"), said
    assert f"make {folder} writable" not in said and "\n" not in said
    assert sorted(p.name for p in folder.iterdir()) == ["k.cubin", "meta.json"]   # meta.json kept: still kforge's


def test_a_file_kforge_would_delete_that_cannot_be_is_one_line(out, monkeypatch):
    """remove_file (`doit clean` of a package's wheel, a tuning table): NotRemoved, not a bare PermissionError."""
    (out / "dist").mkdir()
    (out / "dist" / "k.whl").write_bytes(b"wheel")
    refusing(monkeypatch, out / "dist", out / "dist" / "k.whl")   # out/dist immutable
    with pytest.raises(guard.NotRemoved, match=f"make {out / 'dist'} writable"):
        guard.remove_file(out, out / "dist" / "k.whl")
    assert (out / "dist" / "k.whl").exists()


# --- a file kforge wrote, read back as untrusted data ---------------------------------------------------------

@pytest.mark.parametrize("kind", ["fifo", "folder", "device"])
def test_what_is_no_file_is_one_line_in_the_runtimes_words(tmp_path, kind):
    """A FIFO, a folder or a device at a state file's place is refused without a read, and named as the loader
    names it (out/'s reader said "a device" where the loader said "a terminal or character device")."""
    path = Path(os.devnull) if kind == "device" else tmp_path / "built-keys.json"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
    with pytest.raises(NotAFile) as error:
        read_bytes(path)
    said = str(error.value)
    assert f"is {file_kind(os.stat(path).st_mode)}, not a file kforge wrote" in said, said
    assert str(path) in said and "\n" not in said


def test_text_from_out_reaches_a_terminal_without_its_control_characters():
    """The one wording of untrusted text shown (the guard's names, error.txt, doit info): each control character
    but those kept is U+FFFD; a text with none is returned as it is."""
    assert printable("a\x1b[2Jb\n") == "a\ufffd[2Jb\ufffd"
    assert printable("a\x1b\tb\n", keep="\n\t") == "a\ufffd\tb\n"
    assert printable("plain", keep="\n") == "plain"


# --- scratch: under out/.kforge/tmp, named after their run, gone with it

def test_a_folder_is_made_under_out_kforge_tmp_named_after_the_run(tmp_path):
    folder = guard.scratch_folder(Layout(tmp_path), "sm_90a-scale")
    assert os.path.dirname(folder) == str(Layout(tmp_path).scratch)
    assert os.path.basename(folder).startswith(f"{os.getpid()}-sm_90a-scale-")


def test_a_sweep_removes_what_dead_runs_left_and_keeps_live_ones(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    root = Layout(tmp_path).scratch
    for name in (f"{dead.stdout.strip()}-gfx942-k-abc", f"{os.getpid()}-gfx942-k-def", "gfx942-k-from-an-old-kforge"):
        (root / name).mkdir(parents=True)
        (root / name / "tmp1234.ptx").write_text("left by a killed compile")
    (root / f"{dead.stdout.strip()}-x.log").write_text("a file, too")
    guard.sweep_scratch(Layout(tmp_path))
    assert [p.name for p in root.iterdir()] == [f"{os.getpid()}-gfx942-k-def"]
    guard.sweep_scratch(Layout(tmp_path), os.getpid())   # this run's own, at its end
    assert list(root.iterdir()) == []


def test_as_tmpdir_points_python_and_the_tools_it_starts_there_for_the_block_only(tmp_path):
    before = (os.environ.get("TMPDIR"), tempfile.gettempdir())
    with guard.as_tmpdir(str(tmp_path)):
        assert tempfile.gettempdir() == str(tmp_path)
        assert subprocess.run([sys.executable, "-c", "import tempfile; print(tempfile.gettempdir())"],
                              capture_output=True, text=True).stdout.strip() == str(tmp_path)
    assert (os.environ.get("TMPDIR"), tempfile.gettempdir()) == before


def test_a_file_where_an_artifact_folder_belongs_is_removed_as_an_entry_with_the_parents_it_leaves_empty(tmp_path):
    """guard.py 195 (`doit clean`/`prune`, a remote cache's refused entry, over a file in an artifact folder's place):
    never run in the whole suite's coverage. A link there goes as a link: what it leads to is kept."""
    out = tmp_path / "out"
    (out / "sm_90a" / "scale").mkdir(parents=True)
    (out / "sm_90a" / "keep").mkdir()
    (out / "sm_90a" / "scale" / "c").write_text("not a folder")
    assert guard.remove_artifact_dir(out, out / "sm_90a" / "scale" / "c") is True
    assert sorted(p.name for p in out.rglob("*")) == ["keep", "sm_90a"]
    mine = tmp_path / "mine"
    mine.mkdir()
    (out / "sm_90a" / "scale").mkdir()
    (out / "sm_90a" / "scale" / "c").symlink_to(mine)
    assert guard.remove_artifact_dir(out, out / "sm_90a" / "scale" / "c") is True
    assert mine.is_dir() and not (out / "sm_90a" / "scale").exists()
