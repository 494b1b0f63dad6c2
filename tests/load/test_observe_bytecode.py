"""rules/load/observe.py: what a recording process runs is what it read, and the bytecode it compiles from that is
kept in the user's cache by content. Each case runs fresh interpreters (a process installs its recorder for good) with a
library folder on sys.path and a project folder as the root; the builtin compile's audit event counts the
modules compiled."""
import json
import os
import subprocess
import shutil
import sys
import textwrap
from pathlib import Path

SCRIPT = '''
import json, os, sys
sys.path.insert(0, {lib!r})
from kforge.load import observe
recorder = observe.Recorder.install({root!r})
compiled, writes = [], []

def watch(event, args):
    if event == "compile" and isinstance(args[1], str) and args[1].startswith({lib!r}):
        compiled.append(os.path.relpath(args[1], {lib!r}))
    elif event == "open" and isinstance(args[0], str) and (
            any(c in args[1] or "" for c in "wax+") or args[1] is None and args[2] & (os.O_WRONLY | os.O_RDWR)):
        writes.append(args[0])
    elif event in ("os.rename", "os.mkdir", "os.remove"):
        writes.append(args[1] if event == "os.rename" else args[0])
sys.addaudithook(watch)
recorder.start()
import pkg.mod
print(json.dumps({{"compiled": sorted(compiled), "writes": writes, "x": pkg.mod.X,
                   "co_filename": pkg.mod.f.__code__.co_filename, "files": sorted(recorder.files()),
                   "written": sorted(recorder.written), "folders": sorted(recorder.folders())}}))
'''


def _library(tmp_path: Path, x: int = 1) -> tuple[Path, Path]:
    lib, root = tmp_path / "lib", tmp_path / "project"
    (lib / "pkg").mkdir(parents=True, exist_ok=True)
    root.mkdir(exist_ok=True)
    (lib / "pkg" / "__init__.py").write_text("")
    (lib / "pkg" / "mod.py").write_text(f"X = {x}\n\ndef f():\n    return X\n")
    return lib, root


def _import(lib: Path, root: Path, user_cache: Path | None = None) -> dict:
    """What a recording process that imports pkg.mod from `lib` (as given: a link stays a link) compiled, wrote
    and recorded, and what it ran; the user's key for kept bytecode in `user_cache` (default: beside root)."""
    script = SCRIPT.format(lib=str(lib), root=str(root))
    # Python's default (the dev machines set PYTHONDONTWRITEBYTECODE): it would write __pycache__ beside the library
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["XDG_CACHE_HOME"] = str(user_cache or root.parent / "user-cache")
    proc = subprocess.run([sys.executable, "-c", script], cwd=root, capture_output=True, text=True, timeout=120,
                          env=env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


def _store(root: Path, user_cache: Path | None = None) -> Path:
    return (user_cache or root.parent / "user-cache") / "kforge" / "bytecode" / sys.implementation.cache_tag


def _kept(root: Path, user_cache: Path | None = None) -> list[Path]:
    """The files kept in the store of _import's user cache (default: beside root)."""
    return sorted(p for p in _store(root, user_cache).rglob("*") if p.is_file())


def test_bytecode_is_compiled_once_kept_in_the_users_cache_and_taken_by_the_next_process_of_any_project(tmp_path):
    lib, root = _library(tmp_path)
    first = _import(lib, root)
    assert first["compiled"] == ["pkg/__init__.py", "pkg/mod.py"] and first["x"] == 1
    store = str(_store(root)) + os.sep
    writes = first["writes"]   # what the process wrote anywhere: the store (made), and in it
    assert writes and all((os.path.realpath(w) + os.sep).startswith(store) or w == str(_store(root).parent)
                          for w in writes), writes
    assert not list(lib.rglob("__pycache__")) and len(_kept(root)) == 2 and not (root / "out").exists()
    assert _store(root).stat().st_mode & 0o777 == 0o700
    again = _import(lib, root)
    assert again["compiled"] == [] and again["x"] == 1 and again["writes"] == []
    assert again["co_filename"] == first["co_filename"] == str(lib / "pkg" / "mod.py")
    other = tmp_path / "another-project"   # a library's bytecode serves every project of this user's
    other.mkdir()
    elsewhere = _import(lib, other)
    assert elsewhere["compiled"] == [] and elsewhere["x"] == 1 and elsewhere["writes"] == []
    # the record is the sources read, as before; kforge's own reads and writes of its bytecode are none of it
    for record in (first, again, elsewhere):
        assert record["files"] == [str(lib / "pkg" / "__init__.py"), str(lib / "pkg" / "mod.py")]
        assert record["written"] == []


def test_code_names_the_path_it_was_imported_from(tmp_path):
    lib, root = _library(tmp_path)
    _import(lib, root)
    alias = tmp_path / "alias"
    alias.symlink_to(lib)   # the same bytes through another path: the code names that path, as Python's would
    through = _import(alias, root)
    assert through["co_filename"] == str(alias / "pkg" / "mod.py") and through["compiled"] == ["pkg/__init__.py",
                                                                                                "pkg/mod.py"]


def test_an_edit_of_the_same_size_and_mtime_runs_the_new_code(tmp_path):
    lib, root = _library(tmp_path, x=1)
    assert _import(lib, root)["x"] == 1
    source = lib / "pkg" / "mod.py"
    before = os.stat(source)
    source.write_text(source.read_text().replace("X = 1", "X = 2"))
    os.utime(source, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert os.stat(source).st_size == before.st_size
    edited = _import(lib, root)
    assert edited["x"] == 2 and edited["compiled"] == ["pkg/mod.py"]


def test_a_damaged_kept_file_is_compiled_again_and_replaced_never_run(tmp_path):
    lib, root = _library(tmp_path)
    _import(lib, root)
    whole = {path: path.read_bytes() for path in _kept(root)}
    damages = {"truncated": lambda b: b[:len(b) // 2], "garbage": lambda b: bytes(range(256)) * (len(b) // 256 + 1),
               "another interpreter's": lambda b: b"\0\0\r\n" + b[4:], "empty": lambda b: b""}
    for damage, make in damages.items():
        for path, content in whole.items():
            path.write_bytes(make(content))
        found = _import(lib, root)
        assert found["x"] == 1 and found["compiled"] == ["pkg/__init__.py", "pkg/mod.py"], damage
        assert {p: p.read_bytes() for p in _kept(root)} == whole, damage   # written again, whole
    assert _import(lib, root)["compiled"] == []


def test_bytecode_another_user_or_machine_kept_is_compiled_again_never_run(tmp_path):
    """A cache folder restored or copied from elsewhere (a CI cache, an archive) holds bytecode written under another
    key, or crafted: a file that holds together but for this user's key runs nothing of its own."""
    import hashlib
    import importlib.util
    import marshal
    import shutil
    lib, root = _library(tmp_path)
    assert _import(lib, root, tmp_path / "theirs")["x"] == 1   # kept under another user's key
    assert _import(lib, root, tmp_path / "ours")["x"] == 1   # our key made; then their files in our store
    shutil.rmtree(_store(root, tmp_path / "ours"))
    shutil.copytree(_store(root, tmp_path / "theirs"), _store(root, tmp_path / "ours"))
    assert len(_kept(root, tmp_path / "ours")) == 2
    ours = _import(lib, root, tmp_path / "ours")
    assert ours["compiled"] == ["pkg/__init__.py", "pkg/mod.py"] and ours["x"] == 1
    # crafted: the code of `X = 666` in a file of the right name and head, its digest a plain sha256 of the code
    source = (lib / "pkg" / "mod.py").read_bytes()
    evil = marshal.dumps(compile(source.replace(b"X = 1", b"X = 666"), str(lib / "pkg" / "mod.py"), "exec"))
    for path in _kept(root, tmp_path / "ours"):
        head = importlib.util.MAGIC_NUMBER + bytes.fromhex(path.name)
        path.write_bytes(head + hashlib.sha256(evil).digest() + evil)
    found = _import(lib, root, tmp_path / "ours")
    assert found["x"] == 1 and found["compiled"] == ["pkg/__init__.py", "pkg/mod.py"]
    key = tmp_path / "ours" / "kforge" / "bytecode-key"
    assert key.stat().st_mode & 0o777 == 0o600 and len(key.read_bytes()) == 32


def test_a_store_that_is_a_link_or_others_can_write_to_keeps_nothing_there(tmp_path):
    """The store's place taken by a link (a restored archive's, a planted one) would have the process write, and
    its bound remove files, wherever it leads; a folder others can write to lets them swap files under a reader:
    nothing is read, written or removed there, and every module compiles from its source."""
    lib, root = _library(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "theirs").write_text("a user's file")
    _store(root).parent.mkdir(parents=True)
    _store(root).symlink_to(elsewhere)
    first, again = _import(lib, root), _import(lib, root)
    assert first["x"] == again["x"] == 1 and again["compiled"] == ["pkg/__init__.py", "pkg/mod.py"]
    assert sorted(p.name for p in elsewhere.rglob("*")) == ["theirs"]
    assert all(not w.startswith(str(elsewhere)) and "bytecode" not in w for w in first["writes"] + again["writes"])
    _store(root).unlink()
    _store(root).mkdir()
    _store(root).chmod(0o777)
    first, again = _import(lib, root), _import(lib, root)
    assert again["compiled"] == ["pkg/__init__.py", "pkg/mod.py"] and _kept(root) == []


def test_a_key_others_can_write_keeps_nothing(tmp_path):
    lib, root = _library(tmp_path)
    key = tmp_path / "user-cache" / "kforge" / "bytecode-key"
    key.parent.mkdir(parents=True)
    key.write_bytes(bytes(32))
    key.chmod(0o666)
    first, again = _import(lib, root), _import(lib, root)
    assert again["compiled"] == first["compiled"] == ["pkg/__init__.py", "pkg/mod.py"] and _kept(root) == []


def test_the_toolchain_keeps_its_pyc_files_and_a_link_is_decided_by_the_file_it_leads_to(tmp_path):
    """_from_source decides by the resolved file (each folder resolved once): a module in the toolchain's folders
    is Python's to cache, beside it; one outside is kept in the store only, a link to a toolchain file is the
    toolchain's."""
    lib, root = _library(tmp_path)
    (lib / "tool").mkdir()
    (lib / "tool" / "__init__.py").write_text("")
    (lib / "tool" / "t.py").write_text("T = 1\n")
    (lib / "pkg" / "linked.py").symlink_to(lib / "tool" / "t.py")
    store = root / "out" / "kept"
    script = textwrap.dedent(f'''
        import sys
        sys.path.insert(0, {str(lib)!r})
        from kforge.load import observe
        observe._from_source(({str(lib / "tool")!r} + "/",), {str(store)!r})
        import tool.t, pkg.mod, pkg.linked
    ''')
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    proc = subprocess.run([sys.executable, "-c", script], cwd=root, capture_output=True, text=True, timeout=120,
                          env=env)
    assert proc.returncode == 0, proc.stderr
    cached = lambda folder: sorted(p.name.split(".")[0] for p in (folder / "__pycache__").glob("*.pyc"))
    assert cached(lib / "tool") == ["__init__", "t"] and cached(lib / "pkg") == ["linked"]
    assert len(list(store.iterdir())) == 2   # pkg/__init__.py, pkg/mod.py


def test_beyond_its_limit_the_oldest_kept_files_go_when_a_process_writes_one(tmp_path):
    lib, root = _library(tmp_path)
    folder = _store(root)
    folder.mkdir(parents=True)
    for n in range(6):   # files of sources since edited, the oldest first; a file beside a killed process left
        (folder / f"old{n}").write_bytes(b"x")
        os.utime(folder / f"old{n}", ns=(n * 10**9, n * 10**9))
    script = textwrap.dedent(f'''
        import sys
        sys.path.insert(0, {str(lib)!r})
        from kforge.load import observe
        observe._KeptBytecode.LIMIT = 4
        observe.Recorder.install({str(root)!r}).start()
        import pkg.mod
    ''')
    proc = subprocess.run([sys.executable, "-c", script], cwd=root, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "XDG_CACHE_HOME": str(tmp_path / "user-cache")})   # _import's key
    assert proc.returncode == 0, proc.stderr
    kept = sorted(p.name for p in folder.iterdir())
    # 6 > 4 at the first file written: down to 3, the newest; then the 2 modules' own
    assert [n for n in kept if n.startswith("old")] == ["old3", "old4", "old5"] and len(kept) == 5
    assert _import(lib, root)["compiled"] == []   # what it wrote is taken


def test_no_home_directory_keeps_nothing_and_makes_nothing_where_it_runs(tmp_path):
    """A user with no home directory to be found: `~` left unexpanded (Python 3.11), or RuntimeError (3.12+)."""
    lib, root = _library(tmp_path)
    for home in ('lambda: "~/.cache/kforge"', 'lambda: (_ for _ in ()).throw(RuntimeError("no home"))'):
        patch = f"import kforge.base.settings as s; s.user_cache_dir = {home}\n"
        script = patch + SCRIPT.format(lib=str(lib), root=str(root))
        proc = subprocess.run([sys.executable, "-c", script], cwd=root, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout.splitlines()[-1])["x"] == 1
    assert _kept(root) == [] and not (root / "~").exists() and not (root / "out").exists()


def test_a_package_precompiled_ahead_is_what_its_import_takes_and_nothing_is_compiled_twice(tmp_path):
    """The build's hub has a child compile a library's sources while it imports the toolchain (observe.precompile):
    the import then compiles none of them; a file edited after is compiled by the import, from what it read."""
    lib, root = _library(tmp_path)
    (lib / "pkg" / "sub").mkdir()
    (lib / "pkg" / "sub" / "__init__.py").write_text("")
    (lib / "pkg" / "broken.py").write_text("def (:\n")   # not Python: left for an import to report
    (lib / "pkg" / "deep.py").write_text("X = " + "-" * 3000 + "1\n")   # compile() recursed too deep: the same
    code = ("import os, sys; sys.path.insert(0, sys.argv[1]); from kforge.load import observe; "
            "print(observe.precompile('pkg'), observe.precompile('pkg'))")
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "user-cache")}
    done = subprocess.run([sys.executable, "-c", code, str(lib)], capture_output=True, text=True,
                          env=env, check=True).stdout.split()
    assert done == ["3", "0"] and len(_kept(root)) == 3   # the second pass finds every file kept
    first = _import(lib, root)
    assert first["compiled"] == [] and first["x"] == 1
    (lib / "pkg" / "mod.py").write_text("X = 7\n\ndef f():\n    return X\n")
    edited = _import(lib, root)
    assert edited["compiled"] == ["pkg/mod.py"] and edited["x"] == 7


def _distribution(site: Path, name: str, requires: list[str], modules: dict[str, str]) -> None:
    """An installed distribution in `site`: its files and the metadata importlib.metadata reads."""
    for path, text in modules.items():
        (site / path).parent.mkdir(parents=True, exist_ok=True)
        (site / path).write_text(text)
    info = site / f"{name}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n"
                                   + "".join(f"Requires-Dist: {r}\n" for r in requires))
    (info / "top_level.txt").write_text(name + "\n")
    (info / "RECORD").write_text("".join(f"{p},,\n" for p in modules))


def test_precompile_takes_the_distributions_a_library_requires_shallow_files_first_and_stops_when_told(tmp_path):
    """A library's import runs the modules of what it requires too (flag_gems: sqlalchemy's 133): precompile
    compiles those, not an extra's, at the paths the import opens (the site folder reached through a link); the
    shallow files of all of them before any deep one; `stop` ends it."""
    site = tmp_path / "site-through-a-link"
    (tmp_path / "site").mkdir()
    site.symlink_to(tmp_path / "site")
    _distribution(site, "lib", ["dep>=1", "extra_only ; extra == 'test'"],
                  {"lib/__init__.py": "import dep\n", "lib/deep/er/__init__.py": "", "lib/deep/er/x.py": "X = 1\n"})
    _distribution(site, "dep", [], {"dep/__init__.py": "from dep import core\n", "dep/core.py": "C = 1\n"})
    _distribution(site, "extra_only", [], {"extra_only/__init__.py": ""})
    code = ("import json, os, sys; sys.path.insert(0, sys.argv[1]); from kforge.load import observe; "
            "order = [os.path.relpath(p, sys.argv[1]) for p in observe._package_files("
            "[os.path.join(sys.argv[1], 'lib'), os.path.join(sys.argv[1], 'dep')])]; "
            "print(json.dumps([observe.precompile('lib', stop=lambda: True), observe.precompile('lib'), order]))")
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "user-cache")}
    stopped, done, order = json.loads(subprocess.run([sys.executable, "-c", code, str(site)], capture_output=True,
                                                     text=True, env=env, check=True).stdout)
    assert stopped == 0 and done == 5   # lib's three, dep's two; not extra_only's
    assert order == ["lib/__init__.py", "dep/__init__.py", "dep/core.py", "lib/deep/er/__init__.py",
                     "lib/deep/er/x.py"]   # a walk would take lib's deep files before dep's
    script = SCRIPT.replace("import pkg.mod", "import lib").replace("pkg.mod.X", "1").replace(
        "pkg.mod.f.__code__.co_filename", "''")
    proc = subprocess.run([sys.executable, "-c", script.format(lib=str(site), root=str(tmp_path))],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.splitlines()[-1])["compiled"] == []   # lib and dep: all taken


def test_a_distributions_metadata_never_leads_precompile_out_of_its_folder(tmp_path):
    """A library's metadata is untrusted: a top_level.txt naming `..`, an absolute path or a path through the
    folder, and a Requires-Dist with no name, take precompile nowhere but the package's own files."""
    site, outside = tmp_path / "site", tmp_path / "outside"
    outside.mkdir()
    (outside / "victim.py").write_text("V = 1\n")
    _distribution(site, "lib", ["; python_version > '3'", "dep"], {"lib/__init__.py": ""})
    _distribution(site, "dep", [], {"dep/__init__.py": ""})
    (site / "dep-1.0.dist-info" / "top_level.txt").write_text(f"..\n{outside}\n../outside\ndep\n")
    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); from kforge.load import observe; "
            "print(json.dumps(sorted(observe.required_folders(['lib']))))")
    folders = json.loads(subprocess.run([sys.executable, "-c", code, str(site)], capture_output=True, text=True,
                                        check=True).stdout)
    assert all(f.startswith(str(site) + os.sep) for f in folders), folders
    assert str(site / "dep") in folders and str(site / "lib") in folders


def test_a_link_at_any_level_from_the_users_kforge_folder_down_keeps_nothing_where_it_leads(tmp_path):
    """The store's own folder checked alone let a link above it lead the writes away ($XDG_CACHE_HOME/kforge/bytecode
    linked elsewhere: makedirs made <elsewhere>/<cache tag> and the files went there): every folder from the user's
    kforge folder down to the store must be a real folder of this user's that no one else can write to."""
    lib, root = _library(tmp_path)
    user = tmp_path / "user-cache" / "kforge"
    for level in (user, user / "bytecode", _store(root)):
        elsewhere = tmp_path / f"elsewhere-{level.name}"
        elsewhere.mkdir()
        (elsewhere / "theirs").write_text("a user's file")
        level.parent.mkdir(parents=True, exist_ok=True)
        level.symlink_to(elsewhere)
        first, again = _import(lib, root), _import(lib, root)
        assert first["x"] == again["x"] == 1 and again["compiled"] == ["pkg/__init__.py", "pkg/mod.py"], level
        assert sorted(p.name for p in elsewhere.rglob("*")) == ["theirs"], level
        assert all(not os.path.realpath(w).startswith(str(elsewhere)) for w in first["writes"] + again["writes"])
        level.unlink()
        shutil.rmtree(user, ignore_errors=True)
    user.mkdir(mode=0o700)
    (user / "bytecode").mkdir(mode=0o777)
    (user / "bytecode").chmod(0o777)   # others can write to a folder above the store: they could swap it
    first, again = _import(lib, root), _import(lib, root)
    assert again["compiled"] == ["pkg/__init__.py", "pkg/mod.py"] and _kept(root) == []


def test_kforges_own_cache_is_never_an_input_even_under_a_folder_on_sys_path(tmp_path):
    # PYTHONPATH=$HOME holds ~/.cache: the kept bytecode's folder, listed to bound it, and this user's key for it
    # were inputs, and every build after one that kept new bytecode rebuilt its targets
    lib, root = _library(tmp_path)
    cache = lib / "user-cache"
    first = _import(lib, root, user_cache=cache)
    assert first["compiled"] == ["pkg/__init__.py", "pkg/mod.py"] and _kept(root, cache)
    for record in (first, _import(lib, root, user_cache=cache)):
        assert record["files"] == [str(lib / "pkg" / "__init__.py"), str(lib / "pkg" / "mod.py")]
        assert record["folders"] == []
