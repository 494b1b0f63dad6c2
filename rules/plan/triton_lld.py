"""`ld.lld` for FlyDSL on a machine with neither ROCm nor a system lld: the LLD that Triton links into libtriton
(`amd.link_hsaco(in, out)`, the `ld.lld -shared IN -o OUT` FlyDSL asks for), new enough for code object v6.
rules/plan/amd_linker.py writes a shell script running this file with that libtriton's path; only libtriton is
loaded (about 0.07 s), not the triton package. Standard library only: it runs under `python -I`.
"""
from __future__ import annotations

import importlib.util
import sys

USAGE = "usage: triton_lld.py LIBTRITON LABEL [--version | -shared INPUT.o -o OUTPUT.hsaco]"


def version_line(label: str) -> str:
    """What `ld.lld --version` prints: no path, since FlyDSL targets' keys hold it (computed from the label alone)."""
    return f"LLD in {label}'s libtriton (compatible with GNU linkers)"


def link_args(args: list[str]) -> tuple[str, str]:
    """(input, output) of `-shared INPUT -o OUTPUT` in any order; anything else is refused, never guessed."""
    rest, output = list(args), None
    if "-o" in rest:
        i = rest.index("-o")
        output = rest[i + 1] if i + 1 < len(rest) else None
        del rest[i:i + 2]
    if "-shared" in rest:
        rest.remove("-shared")
    if output is None or len(rest) != 1 or rest[0].startswith("-"):
        raise ValueError(f"Triton's LLD links one object with `-shared INPUT -o OUTPUT`; got {args}")
    return rest[0], output


def main(argv: list[str]) -> int:
    if len(argv) < 3:
        sys.stderr.write(USAGE + "\n")
        return 2
    libtriton, label, args = argv[0], argv[1], argv[2:]
    if args == ["--version"]:
        print(version_line(label))
        return 0
    try:
        source, output = link_args(args)
    except ValueError as e:
        sys.stderr.write(f"ld.lld (kforge, via Triton): {e}\n")
        return 2
    spec = importlib.util.spec_from_file_location("libtriton", libtriton)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.amd.link_hsaco(source, output)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
