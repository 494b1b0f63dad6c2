"""The build's settings: `doit name=value` on the command line, else its KFORGE_* twin, else a default.

Each is declared once; get(name) is the one way kforge reads one (tests/base/test_settings.py holds this). Each
run parses them all first (edge/config.py's check_settings): a malformed value is a ValueError naming where it
came from and what is allowed, one line and exit code 2 before the catalog loads.
"""
from __future__ import annotations

import math
import os
import stat
import sys
from collections import namedtuple
from pathlib import Path
from typing import Callable, NamedTuple

from doit import get_var

from kforge.base import cpus
from kforge.base.archs import parse_arch_list


class Setting(NamedTuple):   # NamedTuples here, not dataclasses: imported by every run, a no-op included
    name: str                            # `doit name=value`
    env: str | None                      # its environment twin
    parse: Callable[[str, str], object]  # (text, where) -> value, or ValueError naming `where`
    default: Callable[[], object]
    help: str
    secret: bool = False                 # its value is never shown (source() hides it; parse never quotes it)
    command_line: bool = True            # False: the environment alone (a value every process, Dask's too, sees)


WEEK_S = 7 * 24 * 3600   # the most any time setting may be: more is no limit anyone means, and inf overflowed poll()


def _digits(text: str) -> int | None:
    """int(text) for plain ASCII digits, else None. str.isdigit() passes '²', which int() refuses with a message
    naming no setting; int() also refuses more than 4,300 digits (30 are past every maximum here)."""
    return int(text) if text.isascii() and text.isdigit() and len(text) <= 30 else None


def _whole(minimum: int, maximum: int, unit: str = ""):
    def parse(text: str, where: str) -> int:
        value = _digits(text)
        if value is None or not minimum <= value <= maximum:
            raise ValueError(f"{where}: got {text!r}; expected a whole number from {minimum} to {maximum}{unit}")
        return value
    return parse


def _seconds(text: str, where: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value <= WEEK_S:   # nan fails it too
        raise ValueError(f"{where}: got {text!r}; expected a number of seconds > 0 and at most {WEEK_S} (a week), "
                         f"e.g. 120")
    return value


DASK = "dask://"   # executor=dask://HOST:PORT: rules/share/dask_executor.py connects to tcp://HOST:PORT


def _executor(text: str, where: str) -> str:
    if not text.startswith(DASK) or ":" not in text[len(DASK):]:
        raise ValueError(f"{where}: got {text!r}; expected {DASK}HOST:PORT (a Dask scheduler)")
    url = _split_url(text, where)
    if url.port is None or url.path or url.query or url.fragment:
        raise ValueError(f"{where}: got {text!r}; expected {DASK}HOST:PORT (a Dask scheduler), nothing after the port")
    return text


def _flag(text: str, where: str) -> bool:
    lowered = text.lower()
    if lowered not in FLAGS:
        raise ValueError(f"{where}: got {text!r}; expected one of {', '.join(sorted(FLAGS))}")
    return FLAGS[lowered]


FLAGS = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False, "off": False}


def _url(text: str, where: str) -> str:
    """The remote cache's URL, checked once here: an unusable one made every target fail, a newline split every
    warning naming it, a password showed in each."""
    if not text.startswith(("http://", "https://")):
        raise ValueError(f"{where}: got {text!r}; the remote cache must be an http:// or https:// URL")
    _split_url(text, where)
    return text.rstrip("/")


def _split_url(text: str, where: str):
    """urllib's parts of a URL kforge connects to, or ValueError naming what it cannot use."""
    import urllib.parse
    if any(not c.isprintable() or c.isspace() for c in text):
        raise ValueError(f"{where}: got {text!r}; it holds a space or a control character: give the URL alone")
    try:
        url = urllib.parse.urlsplit(text)
        port = url.port
    except ValueError as e:
        shown = text if "@" not in text else text.split("://", 1)[0] + "://..."
        why = "its port is not a number from 1 to 65535" if "port" in str(e).lower() else f"not a URL ({e})"
        raise ValueError(f"{where}: got {shown!r}; {why}") from None
    if url.username is not None or url.password is not None:
        raise ValueError(f"{where}: the URL given: it holds a user or password, and kforge sends no credentials "
                         f"(they would show in every warning naming it): give the URL without them")
    if not url.hostname:
        raise ValueError(f"{where}: got {text!r}; it names no host")
    if port == 0:
        raise ValueError(f"{where}: got {text!r}; its port is not a number from 1 to 65535")
    return url


def _local_cache(text: str, where: str) -> str | None:
    """A directory for the local cache (absolute: every worker and checkout must name the same one), a flag's
    off (None) or on (the default directory)."""
    flag = FLAGS.get(text.lower())
    if flag is not None:
        return _default_local_cache() if flag else None
    if not text:   # Path("") is the folder the build runs in
        raise ValueError(f"{where}: got ''; expected a directory (it is created if missing) or off")
    try:
        path = Path(text).expanduser()
    except (RuntimeError, KeyError):   # ~nouser, or ~ with no HOME and no passwd entry
        raise ValueError(f"{where}: got {text!r}; its ~ names no home directory here (no such user, or no HOME): "
                         f"give the directory's absolute path, or off") from None
    try:
        if path.exists() and not path.is_dir():
            raise ValueError(f"{where}: got {text!r}, which is not a directory; give a directory (it is created if "
                             f"missing) or off")
        return str(path.absolute())
    except OSError as e:   # exists() raises all but a missing file: a name too long, a folder not searchable
        raise ValueError(f"{where}: got {text!r}; cannot use it ({e.strerror}): give a directory (it is created if "
                         f"missing) or off") from None


def _default_keep_hub() -> int:
    """A kept hub outlives the build: by default only at a terminal, where a developer builds again and again (a
    script, CI or a test harness waiting for every process the build left gets none unless it asks)."""
    try:
        at_terminal = sys.stderr.isatty()
    except (AttributeError, ValueError):   # no stderr (None), or one closed
        at_terminal = False
    return 600 if at_terminal and not os.environ.get("CI") else 0


def _default_local_cache() -> str | None:
    """user_cache_dir(), or None (the local cache off, said once) where no home directory can be found."""
    try:
        return user_cache_dir()
    except (RuntimeError, KeyError) as e:   # Path.home(): a container's user with no HOME and no passwd entry
        if not _NO_HOME:
            _NO_HOME.append(e)
            sys.stderr.write("kforge: the local cache is off: no home directory to keep it in (set XDG_CACHE_HOME "
                             "or local_cache=DIR)\n")
        return None


_NO_HOME: list = []   # said once per process


def user_cache_dir() -> str:
    """$XDG_CACHE_HOME/kforge (the XDG spec ignores a relative one), else ~/.cache/kforge: the local cache's
    default place, and where this user's key for kept bytecode lies (rules/load/observe.py)."""
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    return str(Path(xdg if os.path.isabs(xdg) else Path.home() / ".cache") / "kforge")


SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
MAX_SIZE = 1 << 50   # 1024T: past any disk or memory, and below setrlimit's 2**63 (catalog_memory)


def _size(minimum: int = 0):
    """Bytes: a whole number, with K, M, G or T (powers of 1,024; a trailing B or iB is allowed)."""
    def parse(text: str, where: str) -> int:
        number = text.strip().upper().removesuffix("IB").removesuffix("B")
        unit = number[-1:] if number[-1:] in SIZE_UNITS else ""
        digits = _digits(number[:len(number) - len(unit)])
        if digits is None or not minimum <= digits * SIZE_UNITS[unit] <= MAX_SIZE:
            least = f"at least {minimum >> 20}M and " if minimum else ""
            raise ValueError(f"{where}: got {text!r}; expected a size in bytes of {least}at most {MAX_SIZE >> 40}T, "
                             f"e.g. 2G, 500M or 1048576")
        return digits * SIZE_UNITS[unit]
    return parse


MIN_KEY_CHARS = 16
MAX_KEY_FILE = 4096   # bytes: a key is a line (`openssl rand -hex 32` is 65 bytes); @/dev/zero read until OOM


def _key(text: str, where: str) -> str:
    """A shared secret, or `@PATH` of a file holding it (one line). Never quoted back: a message may be logged."""
    if text.startswith("@"):
        shown = text[1:] if text[1:].isprintable() else repr(text[1:])   # as messages show it: one line
        text = _key_file(text[1:], where, shown)
        where = f"{where}: the key file {shown}"
    if len(text) < MIN_KEY_CHARS:
        raise ValueError(f"{where}: the key must be at least {MIN_KEY_CHARS} characters (not shown here); "
                         f"make one with `openssl rand -hex 32`")
    return text


def _key_file(path: str, where: str, shown: str) -> str:
    """The key in a regular file of at most MAX_KEY_FILE bytes: read on every run (every setting is parsed), a
    FIFO hung `doit list` and /dev/zero filled memory."""
    give = "give a readable file holding the key alone (e.g. `openssl rand -hex 32 > FILE`)"
    not_regular = f"{where}: the key file {shown} is not a regular file (a FIFO, a device or a folder); {give}"
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):   # stat, not open: opening a FIFO waits for a writer
            raise ValueError(not_regular)
        # O_NONBLOCK: were it swapped for a FIFO since the stat, open would wait; the fstat refuses it then
        with os.fdopen(os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC), "rb") as file:
            if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
                raise ValueError(not_regular)
            data = file.read(MAX_KEY_FILE + 1)
    except OSError as e:
        raise ValueError(f"{where}: cannot read the key file {shown} ({e.strerror or e}); {give}") from None
    if len(data) > MAX_KEY_FILE:
        raise ValueError(f"{where}: the key file {shown} is larger than {MAX_KEY_FILE} bytes, too large for a key; "
                         f"{give}")
    try:
        return data.decode().strip()   # the newline `openssl rand -hex 32 > FILE` leaves is not key
    except UnicodeDecodeError:   # its message quotes a byte of the secret
        raise ValueError(f"{where}: the key file {shown} is not UTF-8 text; {give}") from None


SETTINGS = {s.name: s for s in (
    Setting("archs", None, parse_arch_list, lambda: None, "only these archs, e.g. sm_90a,gfx942"),
    Setting("timeout", "KFORGE_COMPILE_TIMEOUT", _seconds, lambda: 600.0, "per-compile time limit, seconds"),
    # the maxima of whole numbers: past any machine's CPUs, any catalog's tasks, any sweep kforge could hold
    Setting("max_compiles", cpus.ENV, _whole(1, 4096), cpus.available, "most compiles at once (default: the CPUs)"),
    Setting("prefetch", None, _whole(0, 1_000_000), lambda: None, "tasks queued beyond the running ones"),
    Setting("executor", "KFORGE_EXECUTOR", _executor, lambda: None, f"compile on a Dask cluster: {DASK}HOST:PORT"),
    Setting("cache", "KFORGE_CACHE", _url, lambda: None, "remote cache URL (Bazel's HTTP cache protocol)"),
    Setting("cache_readonly", "KFORGE_CACHE_READONLY", _flag, lambda: False, "never upload to the remote cache"),
    Setting("cache_timeout", "KFORGE_CACHE_TIMEOUT", _seconds, lambda: 10.0, "seconds per remote cache request"),
    Setting("cache_budget", "KFORGE_CACHE_BUDGET", _seconds, lambda: 300.0,
            "seconds a run may wait on the remote cache in all, then it is off for the rest of the run"),
    Setting("cache_key", "KFORGE_CACHE_KEY", _key, lambda: None,
            "sign and check remote cache entries with this secret (or @FILE holding it)", secret=True),
    Setting("local_cache", "KFORGE_LOCAL_CACHE", _local_cache, _default_local_cache,
            "the local cache directory every checkout of this user shares, or off"),
    Setting("local_cache_limit", "KFORGE_LOCAL_CACHE_LIMIT", _size(), lambda: 2 << 30,
            "most bytes the local cache keeps (least recently used entries go first), e.g. 2G"),
    Setting("keep_hub", "KFORGE_KEEP_HUB", _whole(0, WEEK_S, " (seconds: a week)"), _default_keep_hub,
            "seconds a build's toolchain process is kept for the project's next build (0: never; by default 600 "
            "for a build run at a terminal, else 0)"),
    Setting("max_configs", "KFORGE_MAX_CONFIGS", _whole(1, 10_000_000), lambda: 50_000,
            "most configs one family may sweep"),
    Setting("catalog_timeout", "KFORGE_CATALOG_TIMEOUT", _seconds, lambda: 300.0,
            "seconds one Python catalog file, or one import of a family's module to probe it, may run"),
    Setting("catalog_memory", "KFORGE_CATALOG_MEMORY", _size(2**20), lambda: 8 * 2**30,
            "memory a Python catalog file, or the probe importing a family's module, may allocate, e.g. 8G"),
    # read where FlyDSL links (a compile server, maybe on a Dask worker) and in the key: the environment alone
    Setting("ld_lld", "KFORGE_LD_LLD", lambda text, where: text, lambda: None,
            "FlyDSL's linker for AMD code objects: a path to ld.lld (>= 17), or triton (the LLD inside Triton)",
            command_line=False),
)}


# Every setting's value for one run, as attributes named as the settings are (`options().timeout`).
Options = namedtuple("Options", list(SETTINGS))


def options() -> Options:
    """Every setting, parsed: a malformed one stops the run even when this run would not use it."""
    return Options(**{name: get(name) for name in SETTINGS})


def get(name: str):
    """The setting's value: the command line's, else the environment's, else the default."""
    given = _given(name)
    return SETTINGS[name].default() if given is None else SETTINGS[name].parse(given[2], given[1])


def source(name: str) -> str | None:
    """`name=TEXT` or `ENV=TEXT`, as the user set it, or None when the default holds."""
    given = _given(name)
    if given is None:
        return None
    return f"{given[0]}=(hidden)" if SETTINGS[name].secret else f"{given[0]}={given[2]}"


def _given(name: str) -> tuple[str, str, str] | None:
    """(variable, where, text) of the value the user gave, the command line first; None if neither gave one."""
    env = SETTINGS[name].env
    # `archs=` given empty (a script's unset variable) is a value its parse refuses, never the default in silence;
    # an empty variable in the environment is as unset
    if SETTINGS[name].command_line and get_var(name, None) is not None:
        return name, f"{name}= on the command line", get_var(name)
    if env and os.environ.get(env):
        return env, f"{env} in the environment", os.environ[env]
    return None
