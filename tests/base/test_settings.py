"""The build's settings (`doit name=value` and their KFORGE_* twins): a bad value is one line naming it."""
import ast
import re
from pathlib import Path

import pytest

from kforge.base import settings
from tests.support import doit, make_project


@pytest.mark.parametrize("args, env, message", [
    (("timeout=abc",), {}, "timeout= on the command line: got 'abc'; expected a number of seconds > 0"),
    ((), {"KFORGE_COMPILE_TIMEOUT": "-5"}, "KFORGE_COMPILE_TIMEOUT in the environment: got '-5'"),
    (("prefetch=x",), {}, "prefetch= on the command line: got 'x'; expected a whole number from 0 to 1000000"),
    (("max_compiles=0",), {}, "max_compiles= on the command line: got '0'; expected a whole number from 1 to 4096"),
    (("executor=tcp://h:1",), {}, "executor= on the command line: got 'tcp://h:1'; expected dask://HOST:PORT"),
    (("archs=sm_91",), {}, "archs= on the command line: unknown arch sm_91"),
    (("archs=sm_90a,sm_90a",), {}, "archs= on the command line: sm_90a is listed twice; give each arch once"),
    (("cache=ftp://h/",), {}, "cache= on the command line: got 'ftp://h/'; the remote cache must be an http://"),
    (("cache=http://127.0.0.1:abc",), {}, "cache= on the command line: got 'http://127.0.0.1:abc'; its port is not a "
                                          "number from 1 to 65535"),
    (("cache=http://127.0.0.1:9", "cache_readonly=maybe"), {},
     "cache_readonly= on the command line: got 'maybe'; expected one of"),
    (("cache=http://127.0.0.1:9",), {"KFORGE_CACHE_TIMEOUT": "abc"}, "KFORGE_CACHE_TIMEOUT in the environment: got 'abc'"),
    (("cache=http://127.0.0.1:9", "cache_key=@/nonexistent/cache.key"), {},
     "cache_key= on the command line: cannot read the key file /nonexistent/cache.key"),
    (("local_cache_limit=2X",), {}, "local_cache_limit= on the command line: got '2X'; expected a size in bytes"),
    ((), {"KFORGE_LOCAL_CACHE": "/dev/null"}, "KFORGE_LOCAL_CACHE in the environment: got '/dev/null', which is "
                                              "not a directory"),
    (("catalog_memory=lots",), {}, "catalog_memory= on the command line: got 'lots'; expected a size in bytes of "
                                   "at least 1M and at most 1024T, e.g. 2G"),
    (("local_cache=~kforge-no-such-user/x",), {}, "local_cache= on the command line: got '~kforge-no-such-user/x'; "
                                                  "its ~ names no home directory here"),
    ((), {"KFORGE_COMPILE_TIMEOUT": "inf"}, "KFORGE_COMPILE_TIMEOUT in the environment: got 'inf'; expected a number "
                                            "of seconds > 0 and at most 604800 (a week)"),
    ((), {"KFORGE_MAX_COMPILES": "\u00b2"}, "KFORGE_MAX_COMPILES in the environment: got '\u00b2'; expected a whole "
                                             "number from 1 to 4096"),
    ((), {"KFORGE_KEEP_HUB": "99999999999999999999999"}, "KFORGE_KEEP_HUB in the environment: got "
                                                         "'99999999999999999999999'; expected a whole number from 0"),
    ((), {"KFORGE_CACHE_KEY": "@/dev/zero"}, "KFORGE_CACHE_KEY in the environment: the key file /dev/zero is not a "
                                             "regular file"),
], ids=["timeout", "timeout-env", "prefetch", "max_compiles", "executor", "archs", "archs-twice", "cache", "cache-port", "cache_readonly",
        "cache-timeout-env", "cache-key-file", "local-cache-limit", "local-cache-env", "catalog-memory",
        "local-cache-nouser", "timeout-inf", "max-compiles-superscript", "keep-hub-huge", "cache-key-device"])
def test_a_bad_setting_is_one_line_naming_it_and_exit_2(tmp_path, args, env, message):
    proc = doit(make_project(tmp_path / "p"), *args, env=env, check=False)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"kforge: {message}" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "p" / "out" / "sm_90a").exists()   # nothing was built


@pytest.mark.parametrize("url, why", [
    ("http://127.0.0.1:99999", "its port is not a number from 1 to 65535"),
    ("http://[::1", "not a URL"),
    ("http://", "it names no host"),
    ("http://h ost:8080", "it holds a space or a control character"),
    ("http://a\nb", "it holds a space or a control character"),
    ("http://user:secret@cache:8080", "it holds a user or password"),
])
def test_a_cache_url_kforge_cannot_use_is_refused_in_one_line(url, why):
    """Such a URL was accepted: every target then failed on it (a port that is no number, a bracket not closed),
    or a newline split every warning naming the cache, or a password showed in every one."""
    with pytest.raises(ValueError) as refused:
        settings._url(url, "cache=")
    assert why in str(refused.value) and "\n" not in str(refused.value) and "secret" not in str(refused.value)


@pytest.mark.parametrize("url", ["dask://h:abc", "dask://[::1", "dask://h :1", "dask://h:1\nx", "dask://u:p@h:1",
                                 "dask://h:99999", "dask://h:0", "dask://h:1/x"])
def test_an_executor_address_kforge_cannot_use_is_refused_in_one_line(url):
    """Taken as given, each failed every compile on the cluster's address (or showed a password)."""
    with pytest.raises(ValueError, match="^executor=: ") as refused:
        settings._executor(url, "executor=")
    assert "\n" not in str(refused.value) and "u:p" not in str(refused.value)
    assert settings._executor("dask://sched.example:8786", "executor=") == "dask://sched.example:8786"


def test_a_cache_url_with_a_path_and_a_port_is_kept():
    assert settings._url("https://cache.example:8443/kforge/", "cache=") == "https://cache.example:8443/kforge"


def test_the_command_line_wins_over_the_environment(tmp_path):
    proc = doit(make_project(tmp_path / "p"), "-n", "2", "max_compiles=1", env={"KFORGE_MAX_COMPILES": "x"})
    assert "more than max_compiles=1" in proc.stderr


@pytest.mark.parametrize("args, env, where", [
    (("cache_key=short-secret",), {}, "cache_key= on the command line"),
    ((), {"KFORGE_CACHE_KEY": "short-secret"}, "KFORGE_CACHE_KEY in the environment"),
    (("cache_key=@KEYFILE",), {}, "the key file"),
], ids=["command-line", "environment", "file"])
def test_a_short_cache_key_is_refused_without_showing_it(tmp_path, args, env, where):
    (tmp_path / "cache.key").write_text("short-secret\n")
    args = tuple(a.replace("KEYFILE", str(tmp_path / "cache.key")) for a in args)
    proc = doit(make_project(tmp_path / "p"), "cache=http://127.0.0.1:9", *args, env=env, check=False)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert where in proc.stderr and "at least 16 characters" in proc.stderr
    assert "short-secret" not in proc.stdout + proc.stderr


def test_where_a_secret_setting_came_from_is_shown_without_its_value(monkeypatch):
    monkeypatch.setenv("KFORGE_CACHE_KEY", "kforge-test-secret-7f3a9c51")
    assert settings.source("cache_key") == "KFORGE_CACHE_KEY=(hidden)"
    assert settings.get("cache_key") == "kforge-test-secret-7f3a9c51"


def test_every_setting_is_parsed_into_one_frozen_options_value(monkeypatch):
    import pytest

    from kforge.base import settings
    monkeypatch.setenv("KFORGE_COMPILE_TIMEOUT", "120")
    found = settings.options()
    assert found.timeout == 120.0 and found.cache is None and found.max_configs == 50_000
    assert set(found._fields) == set(settings.SETTINGS)
    with pytest.raises(AttributeError):
        found.timeout = 1.0
    monkeypatch.setenv("KFORGE_CACHE_READONLY", "maybe")   # a setting this run may not even use
    with pytest.raises(ValueError, match="KFORGE_CACHE_READONLY in the environment: got 'maybe'"):
        settings.options()


def test_the_linker_setting_is_read_from_the_environment_alone(monkeypatch):
    """KFORGE_LD_LLD is read where FlyDSL links, maybe on a Dask worker that never saw doit's command line, and
    in the key, on doit's master: only the environment gives both the same value."""
    from doit import doit_cmd
    monkeypatch.setattr(doit_cmd, "_CMDLINE_VARS", {"ld_lld": "/from/the/command/line"})
    monkeypatch.delenv("KFORGE_LD_LLD", raising=False)
    assert settings.get("ld_lld") is None and settings.source("ld_lld") is None
    monkeypatch.setenv("KFORGE_LD_LLD", "")   # set but empty: as unset
    assert settings.get("ld_lld") is None
    monkeypatch.setenv("KFORGE_LD_LLD", "triton")
    assert settings.get("ld_lld") == "triton" and settings.source("ld_lld") == "KFORGE_LD_LLD=triton"


# The runtime (rules/runtime/, installed as kforge_runtime) ships in wheels without kforge: it cannot read the
# table, and its switches are its own (rules/runtime/startup.py reads them; record.py and serve.py set them
# for the processes they start).
RUNTIME_VARIABLES = {"KFORGE_RECORD", "KFORGE_SERVE"}
ENV_READS = {"os.environ.get", "environ.get", "os.getenv", "getenv", "os.environ.setdefault", "environ.setdefault",
             "os.environ.pop", "environ.pop"}


def env_reads(source: str) -> list[tuple[int, str]]:
    """(line, variable) of each KFORGE_* variable the source reads or sets through os.environ in any form:
    .get/.setdefault/.pop, getenv, [...], `in`; named by a literal or by a module-level constant."""
    tree = ast.parse(source)
    constants = {t.id: n.value.value for n in tree.body if isinstance(n, ast.Assign)
                 and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str) for t in n.targets
                 if isinstance(t, ast.Name)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and ast.unparse(node.func) in ENV_READS:
            names = node.args[:1]
        elif isinstance(node, ast.Subscript) and ast.unparse(node.value) in ("os.environ", "environ"):
            names = [node.slice]
        elif isinstance(node, ast.Compare) and any(ast.unparse(c) in ("os.environ", "environ")
                                                   for c in node.comparators):
            names = [node.left]
        else:
            continue
        for name in names:
            value = name.value if isinstance(name, ast.Constant) else constants.get(getattr(name, "id", None))
            if isinstance(value, str) and value.startswith("KFORGE_"):
                found.append((node.lineno, value))
    return found


def test_the_environment_read_finder_sees_every_form():
    source = ("import os\nfrom os import environ, getenv\nNAME = 'KFORGE_D'\n"
              "a = os.environ.get('KFORGE_A')\nb = os.getenv('KFORGE_B')\nc = os.environ['KFORGE_C']\n"
              "d = environ.get(NAME)\ne = 'KFORGE_E' in os.environ\nf = getenv('KFORGE_F', '')\n"
              "os.environ.setdefault('KFORGE_G', '1')\nh = os.environ.get('HOME')\n")
    assert env_reads(source) == [(4, "KFORGE_A"), (5, "KFORGE_B"), (6, "KFORGE_C"), (7, "KFORGE_D"),
                                 (8, "KFORGE_E"), (9, "KFORGE_F"), (10, "KFORGE_G")]


def test_kforge_variables_are_read_from_the_environment_only_through_the_settings_table():
    """One read path: no module of rules/ but base/settings.py reads a KFORGE_* variable from os.environ, and every
    KFORGE_* name kforge's code or messages mention is a setting's (so the table lists them all); the runtime
    reads its own two, nothing else."""
    import kforge
    import kforge_runtime
    rules, runtime = Path(kforge.__file__).parent, Path(kforge_runtime.__file__).parent   # any sub-package too
    table = {s.env for s in settings.SETTINGS.values()} - {None}
    direct, unknown, runtime_reads = [], [], set()
    for path in sorted(rules.rglob("*.py")):
        in_runtime = runtime in path.parents
        allowed = RUNTIME_VARIABLES if in_runtime else table
        source = path.read_text()
        reads = [] if path == Path(settings.__file__) else env_reads(source)
        direct += [f"{path.relative_to(rules)}:{line} {name}" for line, name in reads if name not in allowed
                   or not in_runtime]
        runtime_reads |= {name for _, name in reads if in_runtime}
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                unknown += [f"{path.relative_to(rules)}:{node.lineno} {name}"
                            for name in re.findall(r"\bKFORGE_[A-Z][A-Z0-9_]*\b", node.value) if name not in allowed]
    assert direct == []
    assert unknown == []
    assert runtime_reads == RUNTIME_VARIABLES   # the runtime was read too, and reads both
    assert table >= {"KFORGE_LD_LLD", "KFORGE_EXECUTOR", "KFORGE_CACHE", "KFORGE_MAX_COMPILES"}
    assert not table & RUNTIME_VARIABLES


def test_no_home_directory_turns_the_local_cache_off_saying_so_once(monkeypatch, capsys):
    from pathlib import Path
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.delenv("KFORGE_LOCAL_CACHE", raising=False)
    monkeypatch.setattr(Path, "home", classmethod(lambda cls: (_ for _ in ()).throw(RuntimeError("no home"))))
    monkeypatch.setattr(settings, "_NO_HOME", [])
    assert settings.get("local_cache") is None and settings.get("local_cache") is None
    assert capsys.readouterr().err.splitlines() == [
        "kforge: the local cache is off: no home directory to keep it in (set XDG_CACHE_HOME or local_cache=DIR)"]


@pytest.mark.parametrize("tty, ci, kept", [(True, None, 600), (False, None, 0), (True, "true", 0)])
def test_a_hub_is_kept_by_default_only_for_a_build_at_a_terminal_outside_ci(monkeypatch, tty, ci, kept):
    """A keeper outlives the build (rules/load/kept_hub.py): a script or a harness that waits for, or counts, the
    processes a build left sees none unless it asks for one."""
    monkeypatch.delenv("KFORGE_KEEP_HUB", raising=False)
    monkeypatch.delenv("CI", raising=False)
    if ci:
        monkeypatch.setenv("CI", ci)
    monkeypatch.setattr(settings.sys.stderr, "isatty", lambda: tty, raising=False)
    assert settings.get("keep_hub") == kept
    monkeypatch.setenv("KFORGE_KEEP_HUB", "30")
    assert settings.get("keep_hub") == 30   # asked for: kept, wherever it runs


@pytest.mark.parametrize("stderr", ["none", "closed"])
def test_no_hub_is_kept_by_default_where_stderr_is_none_or_closed(monkeypatch, stderr):
    """settings.py 120-121 (pythonw, or a daemon that closed its stderr: isatty() cannot be asked): never run in the
    whole suite's coverage."""
    import io
    monkeypatch.delenv("KFORGE_KEEP_HUB", raising=False)
    monkeypatch.delenv("CI", raising=False)
    closed = io.StringIO()
    closed.close()
    monkeypatch.setattr(settings.sys, "stderr", None if stderr == "none" else closed)
    assert settings.get("keep_hub") == 0


@pytest.mark.parametrize("name", [n for n, s in settings.SETTINGS.items() if s.command_line])
def test_a_setting_given_empty_on_the_command_line_is_refused_naming_it_never_the_default(monkeypatch, tmp_path,
                                                                                          name):
    """`doit archs=` (a script's unset variable) built every arch, in silence, as if archs= were not there;
    `local_cache=` kept the cache in the folder the build ran in. An empty KFORGE_* variable stays as unset."""
    from doit import doit_cmd
    monkeypatch.setattr(doit_cmd, "_CMDLINE_VARS", {name: ""})
    with pytest.raises(ValueError) as refused:
        settings.get(name)
    assert str(refused.value).startswith(f"{name}= on the command line: ") and "\n" not in str(refused.value)
    env = settings.SETTINGS[name].env
    if env:
        monkeypatch.setattr(doit_cmd, "_CMDLINE_VARS", {})
        monkeypatch.setenv(env, "")
        assert settings.source(name) is None


def test_doit_archs_empty_is_one_line_naming_the_archs_and_exit_2(tmp_path):
    proc = doit(make_project(tmp_path / "p"), "-n", "1", "archs=", check=False)
    assert proc.returncode == 2 and proc.stderr == ("kforge: archs= on the command line: unknown arch ''; allowed: "
                                                    "sm_80, sm_90a, sm_100a, gfx90a, gfx942, gfx950\n")
    assert not (tmp_path / "p" / "out" / "sm_90a").exists()


def test_a_cache_key_file_that_is_a_fifo_is_refused_at_once_even_without_a_cache(tmp_path):
    """Every setting is parsed on every run: `KFORGE_CACHE_KEY=@FIFO doit list` waited for a writer for ever, and
    @/dev/zero read until the OOM killer came."""
    import os
    os.mkfifo(tmp_path / "key.fifo")
    proc = doit(make_project(tmp_path / "p"), "list", env={"KFORGE_CACHE_KEY": f"@{tmp_path / 'key.fifo'}"},
                check=False, timeout=60)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.splitlines() == [f"kforge: KFORGE_CACHE_KEY in the environment: the key file "
                                        f"{tmp_path / 'key.fifo'} is not a regular file (a FIFO, a device or a "
                                        f"folder); give a readable file holding the key alone (e.g. `openssl rand "
                                        f"-hex 32 > FILE`)"]


@pytest.mark.parametrize("content, refused", [
    (b"k" * 4097, "is larger than 4096 bytes"),
    (b"\xff" * 32, "is not UTF-8 text"),
    (None, "is not a regular file"),   # a folder
])
def test_a_key_file_kforge_cannot_use_is_refused_in_one_line_without_showing_it(tmp_path, content, refused):
    path = tmp_path / "key"
    path.mkdir() if content is None else path.write_bytes(content)
    with pytest.raises(ValueError) as error:
        settings._key(f"@{path}", "cache_key=")
    message = str(error.value)
    assert message.startswith(f"cache_key=: the key file {path} {refused}") and "\n" not in message
    assert "kkkk" not in message and "xff" not in message


def test_a_key_file_is_read_as_before_and_its_odd_name_shown_on_one_line(tmp_path):
    (tmp_path / "key").write_text("kforge-test-secret-7f3a9c51\n")
    assert settings._key(f"@{tmp_path / 'key'}", "cache_key=") == "kforge-test-secret-7f3a9c51"
    odd = tmp_path / "k\ney"
    odd.write_text("short\n")
    with pytest.raises(ValueError) as error:
        settings._key(f"@{odd}", "cache_key=")
    assert str(error.value).startswith(f"cache_key=: the key file {str(odd)!r}: the key must be at least 16 characters")


def test_a_home_directory_that_cannot_be_found_is_the_local_cache_settings_error(monkeypatch):
    """Path.expanduser raised RuntimeError: a 25-line traceback, exit code 3, for `~nouser` or `~` with no HOME
    and no passwd entry (a container's user)."""
    import pwd
    monkeypatch.delenv("HOME", raising=False)
    monkeypatch.setattr(pwd, "getpwuid", lambda uid: (_ for _ in ()).throw(KeyError(uid)))
    for text in ("~/x", "~", "~kforge-no-such-user"):
        with pytest.raises(ValueError, match=f"^local_cache=: got '{text}'; its ~ names no home directory here"):
            settings._local_cache(text, "local_cache=")


def test_a_local_cache_path_the_system_refuses_is_the_settings_error():
    with pytest.raises(ValueError, match=r"^local_cache=: got '/a+'; cannot use it \(File name too long\)"):
        settings._local_cache("/" + "a" * 300, "local_cache=")


@pytest.mark.parametrize("text", ["inf", "-inf", "nan", "1e300", "604801", "infinity", "0", "-1", "x", ""])
@pytest.mark.parametrize("name", [n for n, s in settings.SETTINGS.items() if s.parse is settings._seconds])
def test_a_time_setting_is_finite_and_at_most_a_week(name, text):
    """timeout=inf was taken, and every compile then failed (conn.poll(inf) overflows) with no error.txt."""
    with pytest.raises(ValueError, match=r"expected a number of seconds > 0 and at most 604800 \(a week\)"):
        settings.SETTINGS[name].parse(text, f"{name}=")


def test_every_time_setting_is_checked_by_the_same_parse():
    assert {n for n, s in settings.SETTINGS.items() if s.parse is settings._seconds} == {
        "timeout", "cache_timeout", "cache_budget", "catalog_timeout"}
    assert settings._seconds("604800", "timeout=") == 604800.0 and settings._seconds("0.5", "timeout=") == 0.5


WHOLE = {"max_compiles": (1, 4096), "prefetch": (0, 1_000_000), "keep_hub": (0, 604800), "max_configs": (1, 10_000_000)}


@pytest.mark.parametrize("name", WHOLE)
def test_a_whole_number_setting_takes_ascii_digits_in_its_range_alone(name):
    """str.isdigit() passed '²' (then int() refused it in a message naming no setting); a keep_hub of 10**22
    seconds kept a process running for good; int() refuses more than 4,300 digits, again naming nothing."""
    least, most = WHOLE[name]
    parse = settings.SETTINGS[name].parse
    assert parse(str(least), f"{name}=") == least and parse(str(most), f"{name}=") == most
    for text in ("\u00b2", "1\u00b2", "\u0663", str(most + 1), "9" * 5000, "99999999999999999999999", "+1", " 1"):
        with pytest.raises(ValueError) as refused:
            parse(text, f"{name}=")
        assert str(refused.value).startswith(f"{name}=: got ") and f"from {least} to {most}" in str(refused.value)


@pytest.mark.parametrize("name", ["local_cache_limit", "catalog_memory"])
def test_a_size_setting_takes_ascii_digits_up_to_1024t(name):
    parse = settings.SETTINGS[name].parse
    assert parse("1024T", f"{name}=") == 1 << 50 and parse("2G", f"{name}=") == 2 << 30
    for text in ("1\u00b2", "\u00b2G", "\u0663G", "1025T", "9" * 5000, "99999999999999999999T"):
        with pytest.raises(ValueError, match=f"^{name}=: got .*; expected a size in bytes of .*at most 1024T"):
            parse(text, f"{name}=")
