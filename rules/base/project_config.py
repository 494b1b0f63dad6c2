"""The project's own settings in pyproject.toml: its [tool.kforge] table, read where a decision needs it (the
catalog's folders and record archs in rules/plan/catalog.py, the project's set-up hook in rules/declare/spec.py)."""
from __future__ import annotations

import os
import re
import stat
from pathlib import Path

from kforge.base.errors import SpecError
from kforge.base.target import FUNCTION_REF

PYPROJECT = "pyproject.toml"
SIZE_LIMIT = 16 << 20   # bytes: far past any project's pyproject.toml, and never a whole disk image read into memory
# every key kforge reads from [tool.kforge]: one it does not know is a typo (`catalogue`) that would otherwise be
# ignored without a word, the project silently built from specs/
KEYS = ("catalog", "record_archs", "setup")


def read_pyproject(root: Path) -> bytes | None:
    """The bytes of the project's pyproject.toml, None when there is none (read_user_file)."""
    return read_user_file(root / PYPROJECT, SIZE_LIMIT, "a pyproject.toml", "put the project's pyproject.toml in "
                          "its place", missing_ok=True)


def not_a_file(mode: int) -> str:
    """What a user's file that is no regular file is, for a message: the runtime's file_kind, the one wording
    (kforge_runtime may import no kforge, so it lives there); the loader is imported on this error only."""
    from kforge_runtime.bundle import file_kind
    return file_kind(mode)


def read_user_file(path: Path, limit: int, what: str, fix: str, where: str | None = None,
                   missing_ok: bool = False) -> bytes | None:
    """The bytes of a file the user gives kforge (pyproject.toml, a spec, a record), read as a file or not at all:
    a FIFO blocked every command that opened it, a device (a link to /dev/zero) never ends, a folder is no file,
    a file of gigabytes was read whole into memory; each is one SpecError naming the file (`where`, else the
    path) and the fix (a link to a file is read as that file). None for a missing file when missing_ok."""
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
    data = read_pyproject(root)
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
    """`[tool.kforge] setup`: a set-up hook ("module:function") every family's importing processes run before
    the family's own (docs/device_model.md)."""
    config = kforge_table(root)
    hook = config.get("setup") if isinstance(config, dict) else None
    if hook is None:
        return ()
    if not isinstance(hook, str) or not re.fullmatch(FUNCTION_REF, hook):
        raise SpecError(f"{PYPROJECT}: [tool.kforge] setup: expected a function as 'module:function', e.g. "
                        f"'mylib_kforge:setup', got {hook!r}")
    return (hook,)
