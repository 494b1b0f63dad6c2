"""Fuzzing the spec loader: whatever a spec file holds, load_spec returns a Spec or raises one SpecError, a
single line naming the file; never another exception, never a hang. A spec that loads has configs whose ids
are unique, safe names (what load_spec promises the rest of the build).

Seeds are valid specs: the repo's specs/*.toml (loaded against the repo) and tests/support.spec_text() (a
throw-away project). Mutations come from a fixed seed, so a failure reproduces; its message shows the case.
About 1,950 cases, each under a time limit; a few seconds in all.
"""
from __future__ import annotations

import datetime
import math
import random
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from kforge.declare.spec import SpecError, load_spec
from kforge.declare.sweep import CONFIG_ID, config_id
from tests.support import REPO, make_project, spec_text, time_limit

CASE_SECONDS = 5   # one case (load, then every config and id) is far below this; above it is a hang
CASES_PER_SEED = 12   # mutated specs per seed spec and kind of mutation: a few hundred in all, seconds in CI
MESSAGE_MAX = 1000   # a message quotes what it got, shortened: a huge list is not printed whole
BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")

ODD_STRINGS = [
    "", " ", "a b", "/", "a/b", "..", ".", "../../etc/passwd", "/etc/passwd", "@", "x@y", ":", "k:v", "\x00",
    "a\x00b", "\n", "tab\there", "caf\u00e9", "\u2603", "{", "}", "{}", "{dtype", "{BLOCK!r}", "{BLOCK:>4}",
    "{{dtype}}", "x" * 300, "a" * 5000, "-1", "1e5", "nan", "true", "specs", "specs/s.toml", "pyproject.toml",
    "dodo.py", "tk", "tk/", "kernels", "constexpr", "*{dtype}", "*{nope}", "*bf16", "i32", "fp16", "bfloat16",
    "sm_90a", "gfx942", "triton", "flydsl",
]
ODD_KEYS = ["", " ", "a b", "/", "..", "@", ":", "\x00", "\n", "{", "1abc", "caf\u00e9", "x" * 300, "a" * 5000]
ODD_NUMBERS = [0, 1, -1, 3, 7, 16, 128, 2**31, 2**63 - 1, -2**63, 2**64, 2**20000,
               0.0, -0.0, 0.5, 1e300, -1e-5, math.inf, -math.inf, math.nan, True, False]
DATES = [datetime.datetime(1979, 5, 27, 7, 32), datetime.date(1979, 5, 27), datetime.time(7, 32),
         datetime.datetime(1979, 5, 27, tzinfo=datetime.timezone.utc)]


@dataclass
class Raw:
    """TOML text written as it is (what a Python value cannot say: nesting deeper than the writer recurses)."""
    text: str


# --- a minimal TOML writer (tomllib only reads) --------------------------------------------------------

def dumps(doc: dict) -> str:
    """TOML for a parsed document: plain keys first, then [tables] and [[arrays of tables]]."""
    lines = [f"{_key(k)} = {_value(v)}" for k, v in doc.items() if not _is_table(v) and not _is_table_array(v)]
    for k, v in doc.items():
        if _is_table(v):
            lines += ["", f"[{_key(k)}]"] + [f"{_key(kk)} = {_value(vv)}" for kk, vv in v.items()]
        elif _is_table_array(v):
            for t in v:
                lines += ["", f"[[{_key(k)}]]"] + [f"{_key(kk)} = {_value(vv)}" for kk, vv in t.items()]
    return "\n".join(lines) + "\n"


def _is_table(v) -> bool:
    return isinstance(v, dict)


def _is_table_array(v) -> bool:
    return isinstance(v, list) and bool(v) and all(isinstance(t, dict) for t in v)


def _key(k: str) -> str:
    return k if BARE_KEY.fullmatch(k) else _string(k)


def _string(s: str) -> str:
    if s.isprintable() and '"' not in s and "\\" not in s:
        return f'"{s}"'
    escaped = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\t": "\\t", "\r": "\\r"}
    return '"' + "".join(escaped.get(c) or (c if c.isprintable() else f"\\u{ord(c):04x}") for c in s) + '"'


def _value(v) -> str:
    if isinstance(v, Raw):
        return v.text
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return hex(v) if v >= 2**63 else str(v)   # hex: Python will not print a 6,000-digit decimal
    if isinstance(v, float):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf") if math.isinf(v) else repr(v)
    if isinstance(v, str):
        return _string(v)
    if isinstance(v, (datetime.date, datetime.time)):
        return v.isoformat()
    if isinstance(v, list):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_key(k)} = {_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(f"cannot write {type(v).__name__} as TOML")


# --- seeds ----------------------------------------------------------------------------------------------

@dataclass
class Seed:
    name: str
    text: str
    root: Path   # the project the spec's paths are relative to


def seeds(tmp_path: Path) -> list[Seed]:
    project = make_project(tmp_path / "project", specs={})
    tuned = spec_text(dtypes=("fp16", "bf16"), blocks=(128, 256)) + (
        '\n[[extra]]\ndtype = "fp16"\nBLOCK = 1024\nnum_warps = 8\n\n[[exclude]]\narch = "sm_90a"\nBLOCK = 128\n'
        '\n[tune]\nharness = "tk/scale_tune.py"\nshape_args = ["n"]\nshapes = [[1000], [1000000]]\n')
    (project / "tk" / "scale_tune.py").write_text("def problem(shape, types, device):\n    pass\n\n\n"
                                                  "def grid(shape, config):\n    pass\n")
    found = [Seed("support.spec_text", spec_text(), project),
             Seed("support.spec_text+extra+exclude+tune", tuned, project)]
    found += [Seed(p.name, p.read_text(), REPO) for p in sorted((REPO / "specs").glob("*.toml"))]
    return found


# --- one case, guarded ----------------------------------------------------------------------------------

def check_case(path: Path, root: Path, data: bytes) -> str | None:
    """None when load_spec keeps its promise for this file content; else what went wrong, in one line."""
    path.write_bytes(data)
    where = str(path.resolve().relative_to(root.resolve())) if path.resolve().is_relative_to(root.resolve()) \
        else str(path)
    with time_limit(CASE_SECONDS, where):
        try:
            spec = load_spec(path, root)
            configs = list(spec.configs)
            ids = [config_id(spec, c) for c in configs]
        except SpecError as e:
            message = str(e)
            if where not in message or "\n" in message or len(message) > MESSAGE_MAX:
                return f"SpecError not one line of at most {MESSAGE_MAX} characters naming {where}: {message[:300]!r}"
            return None
        except Exception as e:   # any other exception, or TimeLimitExceeded, is the finding
            return f"{type(e).__name__}: {str(e)[:300]}"
    if len(set(ids)) != len(ids) or not all(CONFIG_ID.fullmatch(i) for i in ids):
        return f"loaded, but its config ids are not unique safe names: {sorted(set(ids))[:5]}"
    return None


def run_cases(tmp_path: Path, cases) -> None:
    """cases: (seed, what was done, bytes). Fails listing each distinct problem once, with a case showing it."""
    problems: dict[str, str] = {}
    for seed, what, data in cases:
        path = (tmp_path / "fuzz" if seed.root == REPO else seed.root / "specs") / "fuzzed.toml"
        path.parent.mkdir(exist_ok=True)
        problem = check_case(path, seed.root, data)
        if problem is not None:
            signature = re.sub(r"\d+|'[^']*'", "#", problem)[:120]
            problems.setdefault(signature, f"{problem}\n    seed {seed.name}, {what}: {data[:400]!r}")
    assert not problems, f"{len(problems)} kinds of failure:\n" + "\n".join(problems.values())


# --- (a) byte mutations ---------------------------------------------------------------------------------

INSERTS = [b"\xff", b"\xc3", b"\xe2\x82", b"\x00", b"\r", b"\n", b"[", b"]", b"[[", b'"', b"'", b"=", b"{", b"}",
           b"#", b",", b".", b"\\", b"\\u0000", b"9" * 5000, b"[" * 2000, b"{a=" * 800, b"\xef\xbb\xbf"]


def byte_mutation(rng: random.Random, data: bytes) -> tuple[str, bytes]:
    i = rng.randrange(len(data) + 1)
    kind = rng.choice(["flip", "delete", "insert", "truncate", "duplicate line"])
    if kind == "flip" and i < len(data):
        bit = 1 << rng.randrange(8)
        return f"flip bit {bit:#x} of byte {i}", data[:i] + bytes([data[i] ^ bit]) + data[i + 1:]
    if kind == "delete":
        n = rng.choice([1, 1, 2, 8, 40])
        return f"delete {n} bytes at {i}", data[:i] + data[i + n:]
    if kind == "truncate":
        return f"truncate at {i}", data[:i]
    if kind == "duplicate line":
        lines = data.split(b"\n")
        j = rng.randrange(len(lines))
        return f"duplicate line {j}", b"\n".join(lines[:j + 1] + lines[j:])
    insert = rng.choice(INSERTS)
    return f"insert {insert[:10]!r} at {i}", data[:i] + insert + data[i:]


def test_byte_mutations_load_or_name_the_file(tmp_path):
    rng = random.Random(20260806)
    cases = []
    for seed in seeds(tmp_path):
        data = seed.text.encode()
        for _ in range(CASES_PER_SEED):
            whats = []
            mutated = data
            for _ in range(rng.choice([1, 1, 2, 3])):
                what, mutated = byte_mutation(rng, mutated)
                whats.append(what)
            cases.append((seed, "; ".join(whats), mutated))
    run_cases(tmp_path, cases)


# --- (b) structural mutations -----------------------------------------------------------------------------

def paths(node, here=()) -> list[tuple]:
    """Every position in a parsed document: tuples of keys and list indexes (the root is ())."""
    found = [here]
    if isinstance(node, dict):
        for k, v in node.items():
            found += paths(v, here + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            found += paths(v, here + (i,))
    return found


def get(node, path):
    for p in path:
        node = node[p]
    return node


def random_value(rng: random.Random, names: list, depth: int = 0):
    kind = rng.choice(["str", "str", "name", "name", "number", "date", "list", "table", "huge", "deep"]
                      if depth < 2 else ["str", "name", "number"])
    if kind == "str":
        return rng.choice(ODD_STRINGS)
    if kind == "name":
        return rng.choice(names)
    if kind == "number":
        return rng.choice(ODD_NUMBERS)
    if kind == "date":
        return rng.choice(DATES)
    if kind == "list":
        return [random_value(rng, names, depth + 1) for _ in range(rng.choice([0, 1, 2, 3]))]
    if kind == "table":
        return {str(rng.choice(names)): random_value(rng, names, depth + 1) for _ in range(rng.choice([0, 1, 2]))}
    if kind == "huge":
        n = rng.choice([1000, 20000, 51000])   # 51,000: over the 50,000 configs one family may have
        return rng.choice([list(range(16, 16 * (n + 1), 16)), [f"v{i}" for i in range(n)], ["fp16"] * n])
    d = rng.choice([10, 100, 300, 1000])
    return Raw(rng.choice(["[" * d + "1" + "]" * d, "{a = " * d + "1" + "}" * d]))


def structural_mutation(rng: random.Random, doc: dict, names: list) -> str:
    table = rng.choice([()] + [(k,) for k in doc])   # each table as likely as another, however long
    spots = [p for p in paths(doc) if p[:len(table)] == table]
    leaves = [p for p in spots if p and not isinstance(get(doc, p), (dict, list))]
    kind = rng.choice(["leaf", "leaf", "leaf", "replace", "replace", "delete", "add key", "append"])
    spot = rng.choice(leaves if kind == "leaf" and leaves else spots)
    node = get(doc, spot)
    if kind == "add key" and isinstance(node, dict):
        key = str(rng.choice(names + ODD_KEYS))
        node[key] = random_value(rng, names)
        return f"add {key!r} at {spot}"
    if kind == "append" and isinstance(node, list):
        node.append(random_value(rng, names) if rng.random() < 0.5 or not node else node[0])
        return f"append to {spot}"
    if kind == "delete" and spot:
        del get(doc, spot[:-1])[spot[-1]]
        return f"delete {spot}"
    if not spot:
        return "nothing"
    # a leaf keeps the document's shape (so the loader gets further); a replaced value may change it
    value = random_value(rng, names, depth=2 if kind == "leaf" else 0)
    get(doc, spot[:-1])[spot[-1]] = value
    shown = f"a list of {len(value)}" if isinstance(value, list) else _value(value)[:40]
    return f"{kind} {spot} with {shown}"


def names_in(doc) -> list:
    """The seed's own keys and strings: a mutation that swaps one for another looks almost valid."""
    found = set()
    for spot in paths(doc):
        found.update(str(p) for p in spot if isinstance(p, str))
        value = get(doc, spot)
        if isinstance(value, (str, int)) and not isinstance(value, bool):
            found.add(value)
    return sorted(found, key=str)


def test_structural_mutations_load_or_name_the_file(tmp_path):
    rng = random.Random(8062026)
    cases = []
    for seed in seeds(tmp_path):
        parsed = tomllib.loads(seed.text)
        assert tomllib.loads(dumps(parsed)) == parsed, f"the test's TOML writer garbles {seed.name}"
        names = names_in(parsed)
        for _ in range(CASES_PER_SEED):
            doc = tomllib.loads(seed.text)
            whats = [structural_mutation(rng, doc, names) for _ in range(rng.choice([1, 1, 2, 3]))]
            cases.append((seed, "; ".join(whats), dumps(doc).encode()))
    run_cases(tmp_path, cases)


# --- (c) every odd string at every string position of one seed: what random choice hits only by luck -----

def renamed(doc: dict, spot: tuple, key: str) -> dict:
    """doc with the key at spot renamed (its place in the table kept)."""
    parent = get(doc, spot[:-1])
    items = list(parent.items())
    parent.clear()
    parent.update((key if k == spot[-1] else k, v) for k, v in items)
    return doc


def test_odd_strings_at_every_string_value_and_key(tmp_path):
    seed = seeds(tmp_path)[1]   # the richest self-contained one: extra, exclude and tune
    parsed = tomllib.loads(seed.text)
    cases = []
    for spot in paths(parsed):
        for odd in ODD_STRINGS if isinstance(get(parsed, spot), str) else ():
            doc = tomllib.loads(seed.text)
            get(doc, spot[:-1])[spot[-1]] = odd
            cases.append((seed, f"{spot} = {odd!r:.40}", dumps(doc).encode()))
        for odd in ODD_KEYS if spot and isinstance(spot[-1], str) else ():
            doc = renamed(tomllib.loads(seed.text), spot, odd)
            cases.append((seed, f"key {spot} renamed {odd!r:.40}", dumps(doc).encode()))
    run_cases(tmp_path, cases)
