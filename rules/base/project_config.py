"""The project's own settings in pyproject.toml: its [tool.kforge] table, read where a decision needs it (the
catalog's folders and record archs in rules/plan/catalog.py, the project's set-up hook in rules/declare/spec.py)."""
from __future__ import annotations

import re
from pathlib import Path

from kforge.base.errors import SpecError
from kforge.base.target import FUNCTION_REF

PYPROJECT = "pyproject.toml"


def kforge_table(root: Path):
    """pyproject.toml's [tool.kforge] table ({} when there is none)."""
    import tomllib
    try:
        return tomllib.loads((root / PYPROJECT).read_text(encoding="utf-8")).get("tool", {}).get("kforge", {})
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise SpecError(f"{root / PYPROJECT}: cannot read it ({e}); fix the file") from None


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
