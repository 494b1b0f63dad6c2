"""pyproject.toml as kforge reads it: a file the user owns, read as one; anything else at its place is one line."""
import os
import threading

import pytest

from kforge.base.errors import SpecError
from kforge.base.project_config import kforge_table
from kforge_runtime.bundle import file_kind
from tests.support import spec_text


def test_table_read(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[tool.kforge]\ncatalog = ["specs"]\n')
    assert kforge_table(tmp_path) == {"catalog": ["specs"]}
    (tmp_path / "pyproject.toml").unlink()
    assert kforge_table(tmp_path) == {}


@pytest.mark.parametrize("text", ["tool = 5\n", "[tool]\nkforge = [1]\n"])
def test_table_of_another_type_is_one_line(tmp_path, text):
    """`tool` or `tool.kforge` that is no table was an AttributeError traceback."""
    (tmp_path / "pyproject.toml").write_text(text)
    with pytest.raises(SpecError, match="not a table"):
        kforge_table(tmp_path)


def _read_in_thread(root):
    """kforge_table(root) in a daemon thread: (what it returned or raised, or None while it still blocks)."""
    result = []

    def read():
        try:
            result.append(kforge_table(root))
        except SpecError as e:
            result.append(e)
    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    thread.join(5)
    return result[0] if result else None


@pytest.mark.parametrize("kind", ["fifo", "folder", "device"])
def test_not_a_file_is_one_line(tmp_path, kind):
    """A FIFO at pyproject.toml hung every command that read it (`doit -f PROJ/dodo.py` from another folder); a
    folder or a device is no file either: each is one SpecError naming the file and the fix."""
    path = tmp_path / "pyproject.toml"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
    else:
        path.symlink_to("/dev/null")   # a link to a device (/dev/zero read whole would never end)
    error = _read_in_thread(tmp_path)
    if kind == "fifo" and error is None:   # unblock the reader so that the test process can end
        with open(os.open(path, os.O_WRONLY | os.O_NONBLOCK), "w"):
            pass
    assert isinstance(error, SpecError), f"kforge_table on a {kind} returned {error!r} (None: still blocked)"
    assert str(path) in str(error) and "not a file" in str(error) and "\n" not in str(error)
    assert f"({file_kind(os.stat(path).st_mode)})" in str(error), "not in the runtime's words (file_kind)"


def test_huge_file_is_one_line(tmp_path):
    """A pyproject.toml far past any project's (a file written by mistake) is refused, not read whole."""
    path = tmp_path / "pyproject.toml"
    with open(path, "wb") as f:
        f.truncate(64 << 20)
    with pytest.raises(SpecError, match="too large"):
        kforge_table(tmp_path)


def test_an_unknown_key_is_one_line_naming_it_and_the_allowed_ones(tmp_path):
    """`catalogue = [...]` was ignored without a word: the project built from specs/ as if it were not there."""
    (tmp_path / "pyproject.toml").write_text('[tool.kforge]\ncatalogue = ["kernels"]\n')
    with pytest.raises(SpecError) as e:
        kforge_table(tmp_path)
    assert str(e.value) == ("pyproject.toml: [tool.kforge] 'catalogue': unknown key (did you mean catalog?); "
                            "allowed: catalog, record_archs, setup")


@pytest.mark.parametrize("value, said", [("[" * 600 + "]" * 600, "nested too deeply"),
                                         ("9" * 5000, "Exceeds the limit (4300 digits)")])
def test_a_value_tomllib_cannot_read_is_one_line(tmp_path, value, said):
    """A RecursionError (arrays 600 deep) or a ValueError (an integer of 5,000 digits) out of tomllib was a
    traceback."""
    (tmp_path / "pyproject.toml").write_text(f"[tool.kforge]\ncatalog = [\"specs\"]\nq = {value}\n")
    with pytest.raises(SpecError) as e:
        kforge_table(tmp_path)
    assert str(e.value).startswith(f"{tmp_path / 'pyproject.toml'}: cannot read it") and said in str(e.value)
    assert "\n" not in str(e.value)


# doit's own settings reader (DoitConfig) reads pyproject.toml's [tool.doit] and doit.cfg in the folder it starts in
# before any plugin or dodo.py: what it fails on was a traceback before any of kforge's checks ran.

DEEP = "a = " + "[" * 600 + "]" * 600 + "\n"


@pytest.mark.parametrize("name, text, said", [
    ("pyproject.toml", DEEP, "pyproject.toml: arrays or tables nested too deeply to read (allowed: 100 levels); "
                             "doit reads its settings there before anything else: fix the file"),
    ("pyproject.toml", "a = " + "{b = " * 600 + "1" + "}" * 600 + "\n", "nested too deeply to read"),
    ("pyproject.toml", "a = " + "[" * 150 + "]" * 150 + "\n", "arrays or tables nested over 100 levels deep"),
    ("pyproject.toml", "x = = 1\n", "pyproject.toml: not valid TOML (Invalid value (at line 1, column 5)); doit reads"),
    ("pyproject.toml", f"x = 1{'0' * 5000}\n", "not valid TOML (Exceeds the limit (4300 digits) for integer string "
                                                "conversion: value has 5001 digits; allowed: TOML's 64-bit integers)"),
    ("pyproject.toml", b"# caf\xe9\n", "pyproject.toml: not UTF-8 text (byte 5: invalid continuation byte)"),
    ("pyproject.toml", "tool = 1\n", "pyproject.toml: tool is int, not a table"),
    ("pyproject.toml", "[tool]\ndoit = 1\n", "pyproject.toml: [tool] doit: is int, not a table; write it as a "
                                             "[tool.doit] table"),
    ("pyproject.toml", "[tool.doit]\ncommands = 1\n", "[tool.doit] commands: is int, not a table"),
    ("pyproject.toml", "[tool.doit.tasks]\nx = 1\n", "[tool.doit.tasks] 'x': is int, not a table; write it as a "
                                                    "[tool.doit.tasks.<name>] table"),
    ("pyproject.toml", "[tool.doit.plugins.commands]\nx = 'm:C'\n", "[tool.doit.plugins] 'commands': not a kind of "
                                                                   "doit plugin; allowed: command, loader, backend, "
                                                                   "reporter"),
    ("doit.cfg", "x = 1\n", "doit.cfg: not an INI file doit can read (File contains no section headers.); fix the "
                            "file, or remove it"),
    ("doit.cfg", "[GLOBAL]\nx = 1\nx = 2\n", "doit.cfg: not an INI file doit can read (While reading from 'doit.cfg' "
                                             "[line  3]: option 'x' in section 'GLOBAL' already exists)"),
    ("doit.cfg", "[GLOBAL]\nx = 50%\n", "doit.cfg: not an INI file doit can read ('%' must be followed by"),
])
def test_a_settings_file_doits_reader_fails_on_is_one_line_naming_it(tmp_path, name, text, said):
    from kforge.base.project_config import doit_settings_problem
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    problem = doit_settings_problem(str(tmp_path))
    assert problem is not None and problem.startswith(f"kforge: {tmp_path}/") and said in problem, problem
    assert "\n" not in problem and len(problem) < 400


def test_the_settings_files_doit_reads_are_fine_as_kforge_writes_them(tmp_path):
    from kforge.base.project_config import doit_settings_problem
    from tests.support import REPO
    assert doit_settings_problem(str(REPO)) is None and doit_settings_problem(str(tmp_path)) is None
    (tmp_path / "doit.cfg").write_text("[GLOBAL]\nverbosity = 2\n\n[task:x]\nn = 1\n")
    (tmp_path / "pyproject.toml").write_text("a = " + "[" * 100 + "]" * 100 + "\n")   # deep, but within the limit
    assert doit_settings_problem(str(tmp_path)) is None
    # lines ended by a lone CR (an old Mac editor's): doit opens both in text mode, which reads them as lines
    (tmp_path / "pyproject.toml").write_bytes(b"[tool.doit]\rverbosity = 2\r")
    (tmp_path / "doit.cfg").write_bytes(b"[GLOBAL]\rverbosity = 2\r")
    assert doit_settings_problem(str(tmp_path)) is None


@pytest.mark.parametrize("name, text", [("pyproject.toml", DEEP), ("pyproject.toml", "[tool]\ndoit = 1\n"),
                                        ("doit.cfg", "x = 1\n")])
def test_doit_stops_in_one_line_on_a_settings_file_its_reader_fails_on(tmp_path, name, text):
    """The start-up line kforge's .pth runs in a doit process (rules/runtime/kforge-runtime-env.pth) refuses it
    before doit reads it: exit code 3 and one line, not doit's traceback (RecursionError, AttributeError, ...)."""
    import subprocess
    import sys
    from tests.support import REPO
    line = next(line for line in (REPO / "rules" / "runtime" / "kforge-runtime-env.pth").read_text().splitlines()
                if "refuse_at_start()" in line)
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(line + "\n")   # run as site-packages' .pth runs it
    (tmp_path / name).write_text(text)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), str(REPO)]))
    proc = subprocess.run([sys.executable, "-m", "doit", "list"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 3 and proc.stderr.count("\n") == 1, proc.stderr[-2000:]
    assert proc.stderr.startswith(f"kforge: {tmp_path / name}: ") and "Traceback" not in proc.stderr


def test_a_setup_hook_of_thousands_of_characters_is_one_short_line(tmp_path):
    from kforge.base.project_config import project_setup
    (tmp_path / "pyproject.toml").write_text(f'[tool.kforge]\nsetup = "{"x" * 100_000}"\n')
    with pytest.raises(SpecError) as e:
        project_setup(tmp_path)
    assert str(e.value).startswith("pyproject.toml: [tool.kforge] setup: expected a function as 'module:function'")
    assert len(str(e.value)) < 400


@pytest.mark.parametrize("data, said", [(b"[tool.kforge\n", "Expected ']'"), (b"\xff = 1\n", "can't decode byte 0xff")])
def test_a_pyproject_that_is_not_toml_or_not_utf8_is_one_line(tmp_path, data, said):
    (tmp_path / "pyproject.toml").write_bytes(data)
    with pytest.raises(SpecError) as e:
        kforge_table(tmp_path)
    assert str(e.value).startswith(f"{tmp_path / 'pyproject.toml'}: cannot read it (") and said in str(e.value)
    assert str(e.value).endswith("; fix the file") and "\n" not in str(e.value)


def test_a_user_file_that_is_gone_or_cannot_be_opened_is_one_line_naming_it(tmp_path):
    from kforge.base.project_config import read_user_file
    with pytest.raises(SpecError, match=r"^specs/x\.toml: no such file; put it back$"):
        read_user_file(tmp_path / "x.toml", 1024, "a spec", "put it back", "specs/x.toml")
    (tmp_path / "plain").write_text("")
    with pytest.raises(SpecError, match=r"/plain/x\.toml: cannot read it \(\[Errno 20\] Not a directory.*\); fix the "
                                         r"file$"):
        read_user_file(tmp_path / "plain" / "x.toml", 1024, "a spec", "")


@pytest.mark.parametrize("name", ["pyproject.toml", "doit.cfg"])
def test_a_settings_file_that_cannot_be_opened_is_one_line_naming_it(tmp_path, monkeypatch, name):
    """project_config.py 106-107: a pyproject.toml kforge could not open (another user's, mode 600) was passed by
    as if absent, and doit's own open() then raised PermissionError: a traceback before any command. Root opens
    any file: the open is refused by a stand-in."""
    import errno
    from kforge.base import project_config
    path = tmp_path / name
    path.write_text("[GLOBAL]\n" if name == "doit.cfg" else "[tool.doit]\n")
    real_open = os.open

    def refused(file, *args, **kwargs):
        if str(file).endswith(name):
            raise PermissionError(errno.EACCES, "Permission denied", str(file))
        return real_open(file, *args, **kwargs)
    monkeypatch.setattr(project_config.os, "open", refused)
    assert project_config.doit_settings_problem(str(tmp_path)) == (
        f"kforge: {path}: cannot read it ([Errno 13] Permission denied: '{path}'); fix the file")


@pytest.mark.parametrize("kind", ["fifo", "folder"])
def test_a_settings_file_that_is_a_fifo_or_folder_is_one_line_naming_it_and_the_fix(tmp_path, kind):
    """project_config.py 106-107 as called by start_problem's stat (which says it first; a FIFO made between the
    two is read without blocking)."""
    from kforge.base.project_config import doit_settings_problem
    path = tmp_path / "doit.cfg"
    os.mkfifo(path) if kind == "fifo" else path.mkdir()
    what = "a FIFO or pipe" if kind == "fifo" else "a folder"
    assert doit_settings_problem(str(tmp_path)) == (
        f"kforge: {path}: not a file ({what}); doit reads its settings there before anything else: put the "
        f"project's doit.cfg in its place, or remove it")


def test_a_doit_cfg_in_another_encoding_than_the_locales_is_one_line_naming_it(tmp_path):
    """project_config.py 176-177: doit reads doit.cfg with open()'s default encoding (a UnicodeDecodeError traceback
    on a Latin-1 file under a UTF-8 locale); never run in the whole suite's coverage."""
    import locale
    from kforge.base.project_config import doit_settings_problem
    encoding = locale.getpreferredencoding(False)
    data = "[GLOBAL]\n# café\n".encode("latin-1")
    try:
        data.decode(encoding)
        pytest.skip(f"the locale's encoding {encoding} reads Latin-1")
    except UnicodeDecodeError as e:
        why = str(e)
    (tmp_path / "doit.cfg").write_bytes(data)
    assert doit_settings_problem(str(tmp_path)) == (f"kforge: {tmp_path / 'doit.cfg'}: not text doit can read ({why}); "
                                                    f"save it as {encoding}")


@pytest.mark.parametrize("line, said", [
    ("setup = 3", "setup: expected a function as 'module:function', e.g. 'mylib_kforge:setup', got 3"),
    ('setup = ["a:b"]', "setup: expected a function as 'module:function'"),
    ("catalog = 3", "catalog: expected a non-empty list of folders (relative to the project) or installed packages"),
    ("catalog = []", "catalog: expected a non-empty list of folders"),
    ('record_archs = "gfx942"', "record_archs: expected a list of archs (sm_80, sm_90a, sm_100a, gfx90a, gfx942, "
                                "gfx950), got 'gfx942'"),
    ('record_archs = ["gfx942", "gfx942"]', "record_archs: got 'gfx942'; allowed: each arch once"),
], ids=["setup-int", "setup-list", "catalog-int", "catalog-empty", "record_archs-str", "record_archs-twice"])
def test_every_keys_value_of_another_type_is_one_line_when_the_table_is_read(tmp_path, line, said):
    """Every [tool.kforge] key checked alike, where the table is read: `setup = 3` passed the read and failed
    once per family that loaded (33 lines from `doit list` in this repository, exit code 1; each a failed target
    in a build), where a wrong catalog or record_archs was one line and exit code 2."""
    from tests.support import doit, make_project
    (tmp_path / "pyproject.toml").write_text(f"[tool.kforge]\n{line}\n")
    with pytest.raises(SpecError) as e:
        kforge_table(tmp_path)
    assert str(e.value).startswith(f"pyproject.toml: [tool.kforge] {said}") and "\n" not in str(e.value)
    root = make_project(tmp_path / "p", specs={"a": spec_text(name="a"), "b": spec_text(name="b")})
    with open(root / "pyproject.toml", "a") as f:
        f.write(f"\n[tool.kforge]\n{line}\n")
    for args in (("list",), ("-n", "1")):
        proc = doit(root, *args, check=False)
        assert proc.returncode == 2 and proc.stderr.startswith(f"kforge: pyproject.toml: [tool.kforge] {said}"), \
            proc.stderr
        assert proc.stderr.count("\n") == 1 and not (root / "out" / "sm_90a").exists()


def test_a_doit_setting_doit_takes_as_it_is_given_is_no_problem(tmp_path):
    from kforge.base import project_config
    """doit keeps a value that is no string as it is: `continue = 1` runs on, `failure_verbosity = true` is 1 (a
    review: both were refused as of another type)."""
    (tmp_path / "pyproject.toml").write_text("[tool.doit]\ncontinue = 1\nfailure_verbosity = true\nverbosity = 2\n")
    assert project_config.doit_settings_problem(str(tmp_path)) is None
    (tmp_path / "pyproject.toml").write_text("[tool.doit]\ncontinue = 1.5\n")
    assert "continue = 1.5: is a float" in project_config.doit_settings_problem(str(tmp_path))
