"""The project's [tool.kforge] table in pyproject.toml, and what doit's own settings reader would fail on where
doit starts (asked by kforge's start-up line before doit reads anything: this module imports only SpecError)."""
from __future__ import annotations

import os
import re
import stat
from pathlib import Path

from kforge.base.errors import SpecError

PYPROJECT = "pyproject.toml"
SIZE_LIMIT = 16 << 20   # bytes: far past any project's pyproject.toml, and never a whole disk image read into memory
# every key kforge reads from [tool.kforge]: any other is a typo (`catalogue`) that would be ignored without a word
KEYS = ("catalog", "record_archs", "setup")


def not_a_file(mode: int) -> str:
    """What a user's file that is no regular file is, for a message (the runtime's wording, imported only here)."""
    from kforge_runtime.bundle import file_kind
    return file_kind(mode)


def read_user_file(path: Path, limit: int, what: str, fix: str, where: str | None = None,
                   missing_ok: bool = False) -> bytes | None:
    """The bytes of a file the user gives kforge (pyproject.toml, a spec, a record); a FIFO (it blocked every
    command), a device, a folder or a file over `limit` is a SpecError naming the file and the fix."""
    where = where or str(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)   # a FIFO's open never blocks
    except FileNotFoundError:
        if missing_ok:
            return None
        raise SpecError(f"{where}: no such file; {fix}") from None
    except OSError as e:
        raise SpecError(f"{where}: cannot read it ({e}); fix the file") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise SpecError(f"{where}: not a file ({not_a_file(mode)}); {fix}, or remove it")
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read(limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise SpecError(f"{where}: too large for {what} (over {limit >> 20} MiB); {fix}")
    return data


def kforge_table(root: Path):
    """pyproject.toml's [tool.kforge] table ({} when there is none)."""
    import tomllib
    data = read_user_file(root / PYPROJECT, SIZE_LIMIT, "a pyproject.toml", "put the project's pyproject.toml in "
                          "its place", missing_ok=True)
    if data is None:
        return {}
    try:
        tool = tomllib.loads(data.decode("utf-8")).get("tool", {})
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise SpecError(f"{root / PYPROJECT}: cannot read it ({e}); fix the file") from None
    except ValueError as e:   # tomllib reads a decimal integer with Python's int(), which stops at 4,300 digits
        raise SpecError(f"{root / PYPROJECT}: cannot read it ({str(e).split(';')[0]}); fix the file") from None
    except RecursionError:   # `q = [[[[...]]]]` some hundreds deep: tomllib recurses once per level
        raise SpecError(f"{root / PYPROJECT}: cannot read it (arrays or tables nested too deeply); fix the "
                        f"file") from None
    table = tool.get("kforge", {}) if isinstance(tool, dict) else None
    if not isinstance(table, dict):
        raise SpecError(f"{root / PYPROJECT}: {'tool.kforge' if table is not None else 'tool'} is "
                        f"{type(table if table is not None else tool).__name__}, not a table; write it as "
                        f"[tool.kforge] (docs/spec_format.md)")
    for key in table:
        if key not in KEYS:
            import difflib
            near = difflib.get_close_matches(key, KEYS, 1)
            raise SpecError(f"{PYPROJECT}: [tool.kforge] {repr(key)[:60]}: unknown key"
                            f"{f' (did you mean {near[0]}?)' if near else ''}; allowed: {', '.join(KEYS)}")
    return table


def project_setup(root: Path) -> tuple[str, ...]:
    """`[tool.kforge] setup`: a hook ("module:function") every family's importing processes run first."""
    hook = kforge_table(root).get("setup")
    if hook is None:
        return ()
    from kforge.base.target import FUNCTION_REF   # here: the start-up line imports this module (doit_settings_problem)
    if not isinstance(hook, str) or not re.fullmatch(FUNCTION_REF, hook):
        raise SpecError(f"{PYPROJECT}: [tool.kforge] setup: expected a function as 'module:function', e.g. "
                        f"'mylib_kforge:setup', got {repr(hook)[:100]}")
    return (hook,)


# doit reads these where it starts, before any plugin or dodo.py: only kforge's start-up line comes first
DOIT_FILES = ("pyproject.toml", "doit.cfg")
DOIT_PLUGIN_KINDS = ("command", "loader", "backend", "reporter")   # DoitConfig.PLUGIN_TYPES: any other, an assert
DEPTH_LIMIT = 100   # levels of arrays and tables: far past any settings file, far short of where tomllib's
                    # recursion ends (about 500 levels from a shallow stack: a RecursionError in doit's own reader)


def doit_settings_problem(folder: str = ".") -> str | None:
    """What doit's settings reader would fail on (a traceback) in the folder's pyproject.toml or doit.cfg, as one
    line naming the file, the key and the fix: also a file that cannot be opened (doit's open() raised), no regular
    file or too large (start_problem says those two first)."""
    for name in DOIT_FILES:
        path = os.path.join(folder, name)
        try:
            data = read_user_file(Path(path), SIZE_LIMIT, "a settings file", f"doit reads its settings there before "
                                  f"anything else: put the project's {name} in its place", os.path.abspath(path),
                                  missing_ok=True)
        except SpecError as e:
            return f"kforge: {e}"
        if data is not None:
            problem = (_toml_problem if name.endswith(".toml") else _ini_problem)(data)
            if problem is not None:
                return f"kforge: {os.path.abspath(path)}: {problem}"
    return None


def _toml_problem(data: bytes) -> str | None:
    """Why doit cannot take its settings from this pyproject.toml, or None."""
    import tomllib
    fix = "doit reads its settings there before anything else: fix the file"
    try:
        raw = tomllib.loads(_as_text_mode(data.decode("utf-8")))
    except UnicodeDecodeError as e:
        return f"not UTF-8 text (byte {e.start}: {e.reason}); doit reads it as UTF-8 before anything else: save it so"
    except tomllib.TOMLDecodeError as e:
        return f"not valid TOML ({e}); {fix}"
    except ValueError as e:   # an integer of over 4,300 digits: Python's int() stops there
        return f"not valid TOML ({str(e).split(';')[0]}; allowed: TOML's 64-bit integers); {fix}"
    except RecursionError:
        return f"arrays or tables nested too deeply to read (allowed: {DEPTH_LIMIT} levels); {fix}"
    if _depth(raw) > DEPTH_LIMIT:
        return f"arrays or tables nested over {DEPTH_LIMIT} levels deep (doit's reader stops at a few hundred); {fix}"
    tool = raw.get("tool", {})
    if not isinstance(tool, dict):
        return f"tool is {type(tool).__name__}, not a table; write it as [tool.<name>] tables"
    doit = tool.get("doit", {})
    if not isinstance(doit, dict):
        return f"[tool] doit: is {type(doit).__name__}, not a table; write it as a [tool.doit] table"
    for section in ("plugins", "commands", "tasks"):
        body = doit.get(section, {})
        if not isinstance(body, dict):
            return (f"[tool.doit] {section}: is {type(body).__name__}, not a table; write it as a "
                    f"[tool.doit.{section}] table")
        for key, value in body.items():
            if section == "plugins" and key not in DOIT_PLUGIN_KINDS:
                return (f"[tool.doit.plugins] {repr(key)[:60]}: not a kind of doit plugin; allowed: "
                        f"{', '.join(DOIT_PLUGIN_KINDS)}")
            if not isinstance(value, dict):
                return (f"[tool.doit.{section}] {repr(key)[:60]}: is {type(value).__name__}, not a table; write it "
                        f"as a [tool.doit.{section}.<name>] table")
    return None


def _depth(value) -> int:
    """How deeply arrays and tables nest in a parsed TOML document (without recursing)."""
    deepest, todo = 0, [(value, 0)]
    while todo:
        v, depth = todo.pop()
        deepest = max(deepest, depth)
        if isinstance(v, dict):
            todo += [(x, depth + 1) for x in v.values()]
        elif isinstance(v, list):
            todo += [(x, depth + 1) for x in v]
    return deepest


def _as_text_mode(text: str) -> str:
    """The text as a file opened in text mode reads it, as doit opens these: "\r\n" and a lone "\r" are line ends."""
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _ini_problem(data: bytes) -> str | None:
    """Why doit cannot take its settings from this doit.cfg (read by configparser as doit reads it), or None."""
    import configparser
    import locale
    try:
        text = _as_text_mode(data.decode(locale.getpreferredencoding(False)))   # what open() without an encoding reads
    except (UnicodeDecodeError, LookupError) as e:
        return f"not text doit can read ({e}); save it as {locale.getpreferredencoding(False)}"
    parser = configparser.ConfigParser(allow_no_value=True, delimiters=("=",))
    parser.optionxform = str   # as doit reads it: option names keep their case
    try:
        parser.read_string(text, "doit.cfg")
        for section in parser.sections():   # doit reads every value: a lone % fails there
            dict(parser[section].items())
    except configparser.Error as e:
        return f"not an INI file doit can read ({str(e).splitlines()[0][:200]}); fix the file, or remove it"
    return None
