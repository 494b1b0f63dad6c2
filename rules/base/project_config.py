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
        _check(key, table[key])
    return table


def _check(key: str, value) -> None:
    """A [tool.kforge] value of another type is a SpecError when the table is read, every key alike: one line and
    exit code 2 (`setup = 3` was one failed family per spec). What a value names (folders, packages) is checked
    where it is used (rules/plan/catalog.py)."""
    # imported here: the start-up line imports this module (doit_settings_problem)
    from kforge.base.archs import ARCHS
    from kforge.base.target import FUNCTION_REF
    if key == "catalog" and not (isinstance(value, list) and value and all(isinstance(e, str) and e for e in value)):
        raise SpecError(f"{PYPROJECT}: [tool.kforge] catalog: expected a non-empty list of folders (relative to "
                        f"the project) or installed packages (by import name), got {repr(value)[:200]}")
    if key == "record_archs":
        if not isinstance(value, list) or not all(isinstance(a, str) and a in ARCHS for a in value):   # [..] in
            raise SpecError(f"{PYPROJECT}: [tool.kforge] record_archs: expected a list of archs "      # ARCHS: a
                            f"({', '.join(ARCHS)}), got {repr(value)[:200]}")                        # TypeError
        twice = next((a for i, a in enumerate(value) if a in value[:i]), None)
        if twice is not None:
            raise SpecError(f"{PYPROJECT}: [tool.kforge] record_archs: got {twice!r}; allowed: each arch once (this "
                            f"one is listed twice)")
    if key == "setup" and not (isinstance(value, str) and re.fullmatch(FUNCTION_REF, value)):
        raise SpecError(f"{PYPROJECT}: [tool.kforge] setup: expected a function as 'module:function', e.g. "
                        f"'mylib_kforge:setup', got {repr(value)[:100]}")


def project_setup(root: Path) -> tuple[str, ...]:
    """`[tool.kforge] setup`: a hook ("module:function") every family's importing processes run first."""
    hook = kforge_table(root).get("setup")
    return () if hook is None else (hook,)


# doit reads these where it starts, before any plugin or dodo.py: only kforge's start-up line comes first
DOIT_FILES = ("pyproject.toml", "doit.cfg")
DOIT_PLUGIN_KINDS = ("command", "loader", "backend", "reporter")   # DoitConfig.PLUGIN_TYPES: any other, an assert
DEPTH_LIMIT = 100   # levels of arrays and tables: far past any settings file, far short of where tomllib's
                    # recursion ends (about 500 levels from a shallow stack: a RecursionError in doit's own reader)


def doit_settings_problem(folder: str = ".") -> str | None:
    """What doit's settings reader would fail on (a traceback) in the folder's pyproject.toml or doit.cfg, as one
    line naming the file, the key and the fix: also a file that cannot be opened (doit's open() raised), no regular
    file or too large (start_problem says those two first), and a value doit's option parser or plugin lookup
    cannot take (_value_problem)."""
    settings = {}   # doit's config sections, as doit merges the two files: section -> key -> (value, file, heading)
    for name in DOIT_FILES:
        path = os.path.join(folder, name)
        try:
            data = read_user_file(Path(path), SIZE_LIMIT, "a settings file", f"doit reads its settings there before "
                                  f"anything else: put the project's {name} in its place", os.path.abspath(path),
                                  missing_ok=True)
        except SpecError as e:
            return f"kforge: {e}"
        if data is not None:
            toml = name.endswith(".toml")
            problem = (_toml_problem if toml else _ini_problem)(data)
            if problem is not None:
                return f"kforge: {os.path.abspath(path)}: {problem}"
            for section, (heading, values) in (_toml_sections if toml else _ini_sections)(data).items():
                settings.setdefault(section, {}).update((k, (v, os.path.abspath(path), heading))
                                                        for k, v in values.items())
    return _value_problem(settings)


# The options of doit 0.37's commands (DoitMain.DOIT_CMDS, with DoitCmdBase's and its dodo.py loader's) and of
# kforge's (rules/edge/commands.py: `trim`), by name (no two differ in type), each taken from [tool.doit] and
# [tool.doit.commands.<command>] (doit.cfg: [GLOBAL], [<command>]) by doit's option parser for the command that runs:
# a string through the option's type (int(); yes/no/on/off/true/false/1/0), any other value kept as it is, so a
# string int() cannot read was a CmdParseError traceback and a value of another type one further on.
# tests/edge/test_config.py checks this table against doit's code and kforge's commands.
DOIT_OPTIONS = {
    **dict.fromkeys(("verbosity", "num_process", "failure_verbosity"), int),
    **dict.fromkeys(("seek_file", "always", "continue", "pdb", "single", "auto_delayed_regex", "subtasks", "quiet",
                     "status", "private", "list_deps", "hide_status", "cleandep", "cleanall", "dryrun",
                     "cleanforget", "forget_sub", "forget_disable_default", "forget_all", "show_all", "keep_trace",
                     "hardcode_tasks", "trim"), bool),
    **dict.fromkeys(("dep_file", "backend", "codec_cls", "check_file_uptodate", "dodoFile", "cwdPath", "reporter",
                     "outfile", "par_type", "template", "sort", "shell"), str),
}
# the values doit takes for an option of a few (any other: an exception in doit's command, a KeyError for a loader);
# those of plugin kinds, with what [tool.doit.plugins.<kind>] and the `doit.<KIND>` entry points add
DOIT_CHOICES = {"par_type": ("process", "thread"), "sort": ("name", "definition"), "shell": ("bash", "zsh"),
                "check_file_uptodate": ("md5", "timestamp"), "codec_cls": ("json",)}
DOIT_PLUGIN_CHOICES = {"loader": ("LOADER", ()), "backend": ("BACKEND", ("dbm", "json", "sqlite3")),
                       "reporter": ("REPORTER", ("console", "executed-only", "json", "zero", "error-only"))}
BOOLEAN_WORDS = ("1", "yes", "true", "on", "0", "no", "false", "off")   # doit's CmdOption._boolean_states


def _value_problem(settings: dict) -> str | None:
    """The line for a value in doit's merged settings that doit cannot take, or None: a plugin named at a place
    that is no `module:attribute`, or an option's value of another type or no choice doit has."""
    for kind in ("COMMAND", "LOADER", "BACKEND", "REPORTER"):
        for name, (location, path, heading) in settings.get(kind, {}).items():
            if not (isinstance(location, str) and re.fullmatch(r"\w+(\.\w+)*:\w+", location)):
                return (f"kforge: {path}: {heading} {name} = {_shown(location)}: not where a plugin is; doit takes "
                        f"\"module:attribute\" there (kforge's loader: kforge = \"kforge.edge.config:Loader\"): fix "
                        f"the value, or remove the line")
    for section, values in settings.items():
        if section.isupper() and section != "GLOBAL" or section.startswith("task:"):   # plugins; a task's params
            continue
        for key, (value, path, heading) in values.items():
            if key not in DOIT_OPTIONS and not (key == "loader" and section == "GLOBAL"):   # doit reads no other
                continue
            why, takes = _option_problem(key, value, settings)
            if why is not None:
                return f"kforge: {path}: {heading} {key} = {_shown(value)}: {why}; doit's {key} takes {takes}: " \
                       f"fix the value, or remove the line"
    return None


def _option_problem(key: str, value, settings: dict) -> tuple[str | None, str | None]:
    """(why doit cannot take value for the option or plugin kind `key`, what it takes), or (None, None)."""
    kind = DOIT_OPTIONS.get(key, str)
    if kind is int:
        takes = "a whole number 0 or over (0: one task at a time)" if key == "num_process" else "a whole number"
        try:
            number = int(value) if isinstance(value, str) else value
        except ValueError:
            return "not a whole number", takes
        if not isinstance(number, int):   # a boolean is one (true: 1), as doit takes it
            return f"is {_kind(value)}", takes
        return ("below 0", takes) if key == "num_process" and number < 0 else (None, None)
    if kind is bool:
        takes = "true or false"
        if isinstance(value, int) or isinstance(value, str) and value.lower() in BOOLEAN_WORDS:   # 1: true, as doit
            return None, None
        return ("not true or false" if isinstance(value, str) else f"is {_kind(value)}"), takes
    choices = DOIT_CHOICES.get(key)
    if key in DOIT_PLUGIN_CHOICES:
        plugin_kind, builtin = DOIT_PLUGIN_CHOICES[key]
        choices = (*builtin, *settings.get(plugin_kind, {}))
        if value not in choices:   # installed plugins: scanned only then (every doit run names kforge's loader)
            choices += tuple(_entry_point_names(plugin_kind))
    takes = "a string" if choices is None else \
        "one of " + ", ".join(map(repr, dict.fromkeys(choices))) if choices else \
        f"the name of a loader under [tool.doit.plugins.loader] (there is none)"
    if not isinstance(value, str):
        return f"is {_kind(value)}", takes
    if choices is not None and value not in choices:
        return f"no {key} doit has", takes
    return None, None


def _entry_point_names(kind: str) -> list[str]:
    """The names installed packages register as doit plugins of a kind (doit looks them up the same way)."""
    from importlib.metadata import entry_points
    return [e.name for e in entry_points(group=f"doit.{kind}")]


def _kind(value) -> str:
    """What a settings value is, in TOML's words, for a message."""
    return {bool: "a boolean", int: "an integer", float: "a float", str: "a string", list: "an array",
            dict: "a table"}.get(type(value), f"a {type(value).__name__}")


def _shown(value) -> str:
    shown = repr(value)
    return shown if len(shown) <= 60 else shown[:57] + "..."


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


def _toml_sections(data: bytes) -> dict:
    """A pyproject.toml _toml_problem passed, as doit's DoitConfig reads it: {section: (its heading, {key: value})},
    [tool.doit]'s own keys in GLOBAL, plugins under their kind upper-cased, each command under its name."""
    import tomllib
    doit = tomllib.loads(_as_text_mode(data.decode("utf-8"))).get("tool", {}).get("doit", {})
    sections = {kind.upper(): (f"[tool.doit.plugins.{kind}]", plugins)
                for kind, plugins in doit.get("plugins", {}).items()}
    sections.update((command, (f"[tool.doit.commands.{command}]", values))
                    for command, values in doit.get("commands", {}).items())
    sections["GLOBAL"] = ("[tool.doit]", {k: v for k, v in doit.items() if k not in ("plugins", "commands", "tasks")})
    return sections


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


def _ini_sections(data: bytes) -> dict:
    """A doit.cfg _ini_problem passed, as doit reads it: {section: (its heading, {key: value})}."""
    parser = _ini_parser()
    parser.read_string(_ini_text(data), "doit.cfg")
    return {section: (f"[{section}]", dict(parser[section].items())) for section in parser.sections()}


def _ini_parser():
    import configparser
    parser = configparser.ConfigParser(allow_no_value=True, delimiters=("=",))
    parser.optionxform = str   # as doit reads it: option names keep their case
    return parser


def _ini_text(data: bytes) -> str:
    import locale
    return _as_text_mode(data.decode(locale.getpreferredencoding(False)))   # what open() without an encoding reads


def _ini_problem(data: bytes) -> str | None:
    """Why doit cannot take its settings from this doit.cfg (read by configparser as doit reads it), or None."""
    import configparser
    import locale
    try:
        text = _ini_text(data)
    except (UnicodeDecodeError, LookupError) as e:
        return f"not text doit can read ({e}); save it as {locale.getpreferredencoding(False)}"
    parser = _ini_parser()
    try:
        parser.read_string(text, "doit.cfg")
        for section in parser.sections():   # doit reads every value: a lone % fails there
            dict(parser[section].items())
    except configparser.Error as e:
        return f"not an INI file doit can read ({str(e).splitlines()[0][:200]}); fix the file, or remove it"
    return None
