"""rules/load/observe.py: what a process's audit hook records. Each case runs in a fresh interpreter (a process has
one hook, installed for good), with a library folder on sys.path and a project folder as the root."""
import _json
import hashlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

from kforge.load import observe
from tests.support import redirected_package

SCRIPT = '''
import ctypes, glob, json, os, pathlib, pkgutil, sys
from kforge.load import observe
recorder = observe.Recorder.install({root!r})
recorder.start()
{body}
print(json.dumps({{"files": sorted(recorder.files()), "folders": recorder.folders()}}))
'''


def _record(tmp_path: Path, body: str) -> dict:
    """What a process that runs `body` (with lib/ on its path, project/ its root) recorded: files, folders."""
    lib, root = tmp_path / "lib", tmp_path / "project"
    for folder in (lib / "pkg" / "configs", lib / "pkg" / "more", root):
        folder.mkdir(parents=True, exist_ok=True)
    (lib / "pkg" / "__init__.py").write_text("")
    (lib / "pkg" / "mod.py").write_text("X = 1\n")
    for name in ("a.json", "b.json"):
        (lib / "pkg" / "configs" / name).write_text("{}")
    (lib / "pkg" / "more" / "c.json").write_text("{}")
    script = SCRIPT.format(root=str(root), body=textwrap.dedent(body))
    proc = subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {str(lib)!r})\n" + script],
                          cwd=root, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    found = json.loads(proc.stdout.splitlines()[-1])
    strip = lambda p: Path(p).relative_to(tmp_path.resolve()).as_posix()
    return {"files": {strip(f) for f in found["files"]}, "folders": {strip(f): d for f, d in found["folders"].items()}}


def test_every_way_python_lists_a_folder_is_recorded_with_its_names(tmp_path):
    found = _record(tmp_path, '''
        here = os.path.join(sys.path[0], "pkg")
        os.listdir(os.path.join(here, "configs"))
        list(os.scandir(os.path.join(here, "more")))
        ''')
    configs = tmp_path / "lib" / "pkg" / "configs"
    assert found["folders"] == {"lib/pkg/configs": observe.listing_digest(str(configs)),
                                "lib/pkg/more": observe.listing_digest(str(configs.parent / "more"))}
    for body in ('glob.glob(os.path.join(sys.path[0], "pkg", "configs", "*.json"))',
                 'list(pathlib.Path(sys.path[0], "pkg", "configs").iterdir())',
                 'list(pathlib.Path(sys.path[0], "pkg", "configs").glob("*.json"))',
                 'list(os.walk(os.path.join(sys.path[0], "pkg", "configs")))'):
        assert set(_record(tmp_path, body)["folders"]) == {"lib/pkg/configs"}, body
    # modules found by listing the package (a plugin loader): the listings (pkgutil lists each subfolder to
    # tell a package, __pycache__ too, which is no input: every import may change it), and the modules it imported
    (tmp_path / "lib" / "pkg" / "__pycache__").mkdir()
    found = _record(tmp_path, '''
        import importlib, pkg
        for m in pkgutil.iter_modules(pkg.__path__):
            importlib.import_module("pkg." + m.name)
        ''')
    assert set(found["folders"]) == {"lib/pkg", "lib/pkg/configs", "lib/pkg/more"}
    assert "lib/pkg/mod.py" in found["files"]


def test_a_listing_is_its_sorted_names_without_pycache(tmp_path):
    (tmp_path / "b").write_text("")
    (tmp_path / "a").mkdir()
    before = observe.listing_digest(str(tmp_path))
    (tmp_path / "__pycache__").mkdir()   # the interpreter's, whenever a module beside it is imported
    assert observe.listing_digest(str(tmp_path)) == before
    (tmp_path / "c.yaml").write_text("")
    assert observe.listing_digest(str(tmp_path)) != before
    names = observe.digests([], (observe.Base(str(tmp_path.parent)),), listed={str(tmp_path): before})
    assert names == [[tmp_path.name + "/", before]]


def test_the_import_systems_own_listings_are_not_recorded_nor_the_project_or_a_path_entry_itself(tmp_path):
    found = _record(tmp_path, '''
        import pkg.mod   # importlib lists lib/ and lib/pkg to find it
        os.listdir(sys.path[0])   # a module path entry itself: not named the same on every machine
        os.listdir(".")           # the project
        ''')
    assert found["folders"] == {} and "lib/pkg/mod.py" in found["files"]


def test_a_shared_library_loaded_by_path_is_recorded(tmp_path):
    """ctypes.CDLL by path raises "ctypes.dlopen" (what the library then opens with fopen is not seen)."""
    native = tmp_path / "lib" / "pkg" / "native.so"
    native.parent.mkdir(parents=True)
    shutil.copy(_json.__file__, native)   # a shared library to load; its init function is never called
    found = _record(tmp_path, '''
        ctypes.CDLL(os.path.join(sys.path[0], "pkg", "native.so"))
        ctypes.CDLL("libm.so.6")   # by name: the dynamic linker's search, not recorded
        ''')
    assert found["files"] == {"lib/pkg/native.so"}


def test_a_compiles_own_out_is_skipped_and_only_the_latest_one(tmp_path):
    """A Dask worker compiles each target with a private out/ of its own: what is read there is no input, and a
    long-lived server's filter stays one folder longer, not one per compile."""
    recorder = observe.Recorder(str(tmp_path / "project"))
    base = recorder.skip
    for i in range(3):
        recorder.skip_out(str(tmp_path / f"private{i}" / "out"))
        assert recorder.skip == (*base, str((tmp_path / f"private{i}" / "out").resolve()) + "/")
    recorder.skip_out(str(tmp_path / "project" / "out"))   # the project's own: already skipped
    assert recorder.skip == base


def test_a_link_in_the_project_that_leads_out_of_it_is_named_where_it_lies(tmp_path):
    """A config or module shared by a link (`project/kernels/cfg.json -> ../../shared/cfg.json`): an input under its
    name in the project, as every checkout that has the link names it, not skipped as outside the project nor named
    by an absolute path."""
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "cfg.json").write_text("{}")
    (shared / "helper.py").write_text("Y = 2\n")
    kernels = tmp_path / "project" / "kernels"
    kernels.mkdir(parents=True)
    for name in ("cfg.json", "helper.py"):
        (kernels / name).symlink_to(Path("..", "..", "shared", name))
    found = _record(tmp_path, '''
        sys.path.insert(0, os.getcwd())
        open(os.path.join("kernels", "cfg.json")).read()   # relative to the project, as a library may open it
        import kernels.helper
        ''')
    assert found["files"] == {"project/kernels/cfg.json", "project/kernels/helper.py"}
    root = str(tmp_path / "project")
    names = observe.digests([os.path.join(root, "kernels", n) for n in ("cfg.json", "helper.py")], observe.bases(root))
    assert [n for n, _ in names] == ["kernels/cfg.json", "kernels/helper.py"]


def test_a_package_an_import_finder_maps_is_named_by_its_package_and_found_again(tmp_path):
    """An editable install whose finder maps `edlib` to a folder on no path entry: what its import read is named
    edlib/..., and resolve() finds each name again through the finder; without the finder nothing is found."""
    package = tmp_path / "src" / "edlib"
    site = redirected_package(package, {"__init__.py": "", "data.json": '{"factor": 2}', "mod.py": (
        "import json, os\nDATA = json.load(open(os.path.join(os.path.dirname(__file__), 'data.json')))\n")})
    (tmp_path / "project").mkdir()
    script = SCRIPT.format(root=str(tmp_path / "project"), body="import edlib.mod").replace(
        "print(json.dumps(", "names = observe.digests(recorder.files(), observe.bases(os.getcwd()))\n"
        "found = [observe.resolve(n, observe.search_path(os.getcwd())) for n, _ in names]\nprint(json.dumps(")
    script = script.replace('"folders": recorder.folders()', '"names": [n for n, _ in names], "found": found')
    env = {**os.environ, "PYTHONPATH": str(site)}
    proc = subprocess.run([sys.executable, "-c", script], cwd=tmp_path / "project", capture_output=True, text=True,
                          timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    found = json.loads(proc.stdout.splitlines()[-1])
    assert found["names"] == ["edlib/__init__.py", "edlib/data.json", "edlib/mod.py"]
    assert found["found"] == [str(package / n) for n in ("__init__.py", "data.json", "mod.py")]
    assert observe.resolve("edlib/data.json", observe.search_path(str(tmp_path / "project"))) is None   # no finder here


def test_a_dotdot_after_a_link_is_named_by_the_file_it_reached_never_by_the_text(tmp_path):
    """`vendored/../cfg.json` with vendored a link out of the project reaches shared/cfg.json (the kernel takes `..`
    after the link), not the project's own cfg.json that the text suggests: never recorded under that name."""
    (tmp_path / "shared" / "lib").mkdir(parents=True)
    (tmp_path / "shared" / "cfg.json").write_text('{"f": 2}')
    project = tmp_path / "project"
    project.mkdir()
    (project / "vendored").symlink_to(tmp_path / "shared" / "lib")
    (project / "cfg.json").write_text('{"f": 2}')   # a decoy with the same bytes
    (project / "data.json").write_text("{}")
    found = _record(tmp_path, '''
        open(os.path.join(os.getcwd(), "vendored", "..", "cfg.json")).read()   # shared/cfg.json: outside
        open("./data.json").read()   # a `.` step crosses no link: named as opened
        ''')
    assert found["files"] == {"project/data.json"}


def test_a_listing_digest_is_unambiguous(tmp_path):
    (tmp_path / "two").mkdir()
    (tmp_path / "two" / "a").write_text("")
    (tmp_path / "two" / "b").write_text("")
    (tmp_path / "one").mkdir()
    (tmp_path / "one" / "a\nb").write_text("")   # one name holding the separator of the two names above
    assert observe.listing_digest(str(tmp_path / "one")) != observe.listing_digest(str(tmp_path / "two"))


def test_a_file_is_hashed_a_chunk_at_a_time(tmp_path, monkeypatch):
    import hashlib
    big = tmp_path / "big.bin"
    big.write_bytes(b"x" * (3 << 20))
    reads = []
    real_open = open

    class Counting:
        def __init__(self, f):
            self.f = f

        def __getattr__(self, name):
            return getattr(self.f, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def read(self, n=-1):
            reads.append(n)
            return self.f.read(n)

        def readinto(self, buffer):
            reads.append(len(buffer))
            return self.f.readinto(buffer)

    monkeypatch.setattr("builtins.open", lambda *a, **k: Counting(real_open(*a, **k)))
    found = observe.digests([str(big)], (observe.Base(str(tmp_path)),))
    assert found == [["big.bin", hashlib.sha256(b"x" * (3 << 20)).hexdigest()]]
    assert reads and -1 not in reads and max(reads) < (3 << 20)   # never the whole file at once


def test_an_environment_variable_the_librarys_code_reads_is_an_input_and_the_toolchains_and_sessions_are_not(
        tmp_path):
    """The terminal's variables (TERM, NO_COLOR) made every target of lmdeploy stale from another terminal: termcolor
    reads them at import."""
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "envmod.py").write_text('import os\nA = os.environ.get("OSX_A")\nB = os.getenv("OSX_B")\n'
                                   'C = "OSX_C" in os.environ\nD = os.environ.get("OSX_D", "1")\n'
                                   'os.environ["OSX_E"] = "set here"\nE = os.environ["OSX_E"]\n'
                                   'ALL = dict(os.environ)\nCOPY = os.environ.copy()\n'
                                   'SOME = {k: v for k, v in os.environ.items() if k.startswith("OSX")}\n'
                                   # how it prints: the terminal's
                                   'SESSION = [os.environ.get(v) for v in ("TERM", "NO_COLOR", "COLUMNS")]\n')
    script = f'''
import os, sys, json
sys.path.insert(0, {str(lib)!r})
from kforge.load import observe
recorder = observe.Recorder.install({str(tmp_path)!r})
recorder.start()
os.environ.get("OSX_NOT_THE_LIBRARYS")   # this script is no input: nor is what it reads
import json.decoder, envmod
print(json.dumps(sorted(recorder.variables)))
print(json.dumps(observe.digests([], observe.bases({str(tmp_path)!r}), variables=recorder.variables)))
'''
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, OSX_A="a", OSX_D=""))
    assert proc.returncode == 0, proc.stderr
    variables, inputs = map(json.loads, proc.stdout.splitlines()[-2:])
    assert variables == ["OSX_A", "OSX_B", "OSX_C", "OSX_D"]   # E: the library set it itself
    digests = dict(inputs)
    assert list(digests) == ["$OSX_A", "$OSX_B", "$OSX_C", "$OSX_D"]
    assert digests["$OSX_B"] == digests["$OSX_C"] != digests["$OSX_D"]   # unset is not the empty string


def test_a_file_named_like_a_variable_is_no_variable(tmp_path):
    (tmp_path / "$HOME").write_text("x")
    [[name, _]] = observe.digests([str(tmp_path / "$HOME")], observe.bases(str(tmp_path), []))
    assert name == "./$HOME"


ENV_READER = 'import os\nimport triton.language as _tl\nFACTOR = _tl.constexpr(int(os.environ.get("TK_FACTOR", "2")))\n'


def test_a_kernel_module_that_reads_a_variable_rebuilds_when_it_changes_and_a_family_env_is_no_observed_input(
        tmp_path):
    """The variable decides the binary (a constexpr global) but no key: the up-to-date check must see it. A
    variable the family's [env] sets is in the key, and the process checking has no such value: never an input
    (a build would be stale for ever)."""
    from tests.support import doit, kernel_text, make_project, spec_text, statuses
    root = make_project(tmp_path / "p", specs={"scale": spec_text()},
                        kernels={"scale": ENV_READER + kernel_text(factor="FACTOR")})
    meta = root / "out/sm_90a/scale/fp16-b256-w4/meta.json"
    target = {"scale:fp16-b256-w4@sm_90a"}
    binaries = []
    for env in ({"KFORGE_LOCAL_CACHE": "off"}, {"KFORGE_LOCAL_CACHE": "off", "TK_FACTOR": "3"}):   # unset, then 3
        for status in ("built", "up-to-date"):
            doit(root, "-n", "1", env=env)
            assert statuses(root, status) == target, (env, status)
        binaries.append(json.loads(meta.read_text())["sha256"])
        assert "$TK_FACTOR" in dict(json.loads(meta.read_text())["inputs"])
    assert binaries[0] != binaries[1]
    spec = root / "specs" / "scale.toml"
    spec.write_text(spec.read_text() + '\n[env]\nTK_FACTOR = "4"\n')
    for status in ("built", "up-to-date"):
        doit(root, "-n", "1", env={"KFORGE_LOCAL_CACHE": "off"})
        assert statuses(root, status) == target, status
    assert "$TK_FACTOR" not in dict(json.loads(meta.read_text())["inputs"])


# a library that sets a variable it reads (DeepSpeed's os.environ.setdefault) and reads one kforge sets in the
# compile server after the import (Triton's cache folder)
SETS_ITS_OWN = ('import os\nos.environ.setdefault("TK_SET_BY_LIB", "1")\n'
                'CACHE = os.environ.get("TRITON_CACHE_DIR", "~/.triton")\n')


def test_a_variable_is_an_input_as_first_read_not_as_the_library_or_kforge_set_it_after(tmp_path):
    """Recorded as the compile ended, the library's own value of a variable it set with setdefault, and kforge's
    scratch folder as Triton's cache, were inputs no build's environment holds: stale on every run, each target
    checked again (an outside review with DeepSpeed). As first read, the build's own value (here unset)."""
    from kforge.load.observe import VARIABLE
    from tests.support import doit, kernel_text, make_project, spec_text, statuses
    root = make_project(tmp_path / "p", specs={"scale": spec_text(blocks=(128, 256))},
                        kernels={"scale": SETS_ITS_OWN + kernel_text()})
    env = {"KFORGE_LOCAL_CACHE": "off", "TRITON_CACHE_DIR": ""}
    doit(root, "-n", "1", env=env)
    targets = {f"scale:fp16-b{b}-w4@sm_90a" for b in (128, 256)}
    assert statuses(root, "built") == targets
    inputs = dict(json.loads((root / "out/sm_90a/scale/fp16-b256-w4/meta.json").read_text())["inputs"])
    unset = hashlib.sha256(b"null").hexdigest()
    assert inputs[VARIABLE + "TK_SET_BY_LIB"] == unset and inputs[VARIABLE + "TRITON_CACHE_DIR"] == \
        hashlib.sha256(b'""').hexdigest()
    again = doit(root, "-n", "1", env=env)
    assert statuses(root, "up-to-date") == targets, again.stdout[-2000:]


def test_a_stale_pyc_never_runs_in_place_of_the_source_read(tmp_path):
    """Python takes a .pyc while the source's mtime (seconds) and size match: a same-size edit keeping the mtime
    (the same second, cp -p, a restored cache) ran the old module while its new content was recorded, and an
    early cutoff kept the old binary as up to date for ever."""
    import py_compile

    from tests.support import doit, kernel_text, make_project, spec_text, statuses
    head = 'import triton.language as _tl\nFACTOR = _tl.constexpr({})\n'
    root = make_project(tmp_path / "p", kernels={"scale": head.format(2) + kernel_text(factor="FACTOR")})
    fresh = make_project(tmp_path / "fresh", kernels={"scale": head.format(3) + kernel_text(factor="FACTOR")})
    sha = lambda project: json.loads((project / "out/sm_90a/scale/fp16-b256-w4/meta.json").read_text())["sha256"]
    for project in (root, fresh):
        doit(project, "-n", "1")
    source = root / "tk" / "scale.py"
    py_compile.compile(str(source))   # the user's own run of the module left its .pyc, of FACTOR 2
    before = os.stat(source)
    source.write_text(source.read_text().replace("constexpr(2)", "constexpr(3)"))
    os.utime(source, ns=(before.st_atime_ns, before.st_mtime_ns))   # the same size and mtime
    doit(root, "-n", "1")
    assert statuses(root, "built") == {"scale:fp16-b256-w4@sm_90a"} and sha(root) == sha(fresh) != ""
