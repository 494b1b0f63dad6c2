"""Record files (*.jsonl in a catalog folder, written by `python -m kforge_runtime.record`) -> families.

Each line is one Triton specialization an application used (rules/runtime/record.py). Lines of one kernel with
the same argument types, hints and kinds of values become one family `rec_<function>_<digest>`, a line a config
(its id: the values that differ between its lines, or `r`), built for the arch it was recorded on and those
`[tool.kforge] record_archs` adds, unless its options cannot run there. A line equal to another, or to a target
the rest of the catalog builds, is dropped. A line with "autotune" (an autotuner's pick for a key) builds as any
other, and `tuned_choices` lists it for the bundle's manifest. A bad line is one SpecError naming file and line.
"""
from __future__ import annotations

import hashlib
import json
import math
import re
from pathlib import Path

from kforge.base.archs import ARCHS
from kforge.base.project_config import read_user_file
from kforge.base.errors import SpecError
from kforge.base.target import FUNCTION_REF
from kforge.declare.spec_model import shown, shown_path
from kforge.declare.sweep import ID_MAX
from kforge.declare.triton_options import OPTIONS, arch_problem, value_problem
from kforge_runtime.schema import COMPILE_TIME, RECORD_FIELDS, RECORD_FORMAT, RECORD_OPTIONAL, TRITON_VENDOR_DEFAULTS
from kforge_runtime.serve import identity as canonical

KEYS = set(RECORD_FIELDS)
KERNEL_MAX = 500   # characters in a record's "module:function": far past any package's module path


RECORD_LIMIT = 256 << 20   # bytes: about 350,000 lines, far more targets than a catalog builds
LINE_LIMIT = 1 << 20       # characters of one line: a record is a few hundred (a 1,000-character value at most)

def read(path: Path, where: str) -> list[dict]:
    """The file's specializations, each checked, duplicates (an autotuner's pick: its specialization) dropped."""
    return [record for _, record, _, _ in _numbered(path, where)]


def _numbered(path: Path, where: str) -> list[tuple[int, dict, list[str], set]]:
    """read()'s specializations, each as its first line holds it, with that line's number, every source_key its
    lines hold (two GPUs whose import gave the code another value: the compile takes either) and, as a set holding
    True, whether an autotuner's pick is among its lines (its config gave the options)."""
    found: dict[str, tuple[int, dict, list[str], set]] = {}
    for number, record in _lines(path, where):
        picked = "autotune" in record
        record = {k: v for k, v in record.items() if k != "autotune"}
        _, _, keys, tuned = found.setdefault(json.dumps({k: v for k, v in record.items() if k != "source_key"},
                                                        sort_keys=True), (number, record, [], set()))
        if "source_key" in record and record["source_key"] not in keys:
            keys.append(record["source_key"])
        if picked:
            tuned.add(True)
    return list(found.values())


def tuned_choices(paths: list[Path], root: Path, extra_archs: tuple[str, ...] = ()) -> list[dict]:
    """The autotuners' picks the files record, one per kernel, arch built for, key and config, with how many lines
    picked it: processes that tuned apart (xdist workers, ranks) may differ, and serving keeps every pick."""
    picks: dict[tuple, dict] = {}
    for record in (r for path in paths for _, r in _lines(path, shown_path(path, root)) if "autotune" in r):
        for arch in sorted({record["arch"], *extra_archs}, key=list(ARCHS).index):
            if arch == record["arch"] or not _unfit(record["options"], arch):
                key, config = record["autotune"]["key"], record["autotune"]["config"]
                pick = picks.setdefault((record["kernel"], arch, json.dumps(key), json.dumps(config, sort_keys=True)),
                                        {"kernel": record["kernel"], "arch": arch, "key": key, "config": config,
                                         "lines": 0})
                pick["lines"] += 1
    return list(picks.values())


def _lines(path: Path, where: str) -> list[tuple[int, dict]]:
    """The file's records with their line numbers, each checked (a bad one: SpecError naming its line)."""
    try:
        lines = read_user_file(path, RECORD_LIMIT, "a record file", "record fewer runs into it, or split it",
                               where).decode("utf-8").splitlines()
    except UnicodeDecodeError as e:
        raise SpecError(f"{where}: cannot read it ({e}); a record file is UTF-8 JSON lines") from None
    found = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        at = f"{where}:{number}"
        if len(line) > LINE_LIMIT:   # one line of 256 MiB ([1, 1, ...]) was parsed whole: gigabytes of objects
            raise SpecError(f"{at}: a line of {len(line):,} characters, longer than a record can be (at most "
                            f"{LINE_LIMIT:,}); each line is one record, as `python -m kforge_runtime.record` writes it")
        try:
            record = json.loads(line, object_pairs_hook=_once)
        except _Twice as e:   # json keeps the last of a key given twice, without a word: which one was meant?
            raise SpecError(f"{at}: key {shown(e.args[0], 60)} given twice in one object; each line is one record, "
                            f"as `python -m kforge_runtime.record` writes it") from None
        except ValueError as e:
            raise SpecError(f"{at}: not a JSON object ({e}); each line is one record") from None
        except RecursionError:   # `{"x": [[[...]]]}` thousands deep: json recurses once per level
            raise SpecError(f"{at}: not a record: arrays or objects nested too deeply to read; each line is one "
                            f"record, as `python -m kforge_runtime.record` writes it") from None
        _check(record, at)
        found.append((number, record))
    if not found:
        raise SpecError(f"{where}: holds no record; record one with `python -m kforge_runtime.record --out {where} "
                        f"app.py`")
    return found


class _Twice(ValueError):
    """A record line's object gives a key (args[0]) twice."""


def _once(pairs: list[tuple[str, object]]) -> dict:
    """json's object_pairs_hook: the object, when no key is given twice."""
    found = dict(pairs)
    if len(found) < len(pairs):
        raise _Twice(next(k for i, (k, _) in enumerate(pairs) if k in dict(pairs[:i])))
    return found


def _check(record, at: str) -> None:
    if not isinstance(record, dict) or not KEYS <= set(record) <= KEYS | set(RECORD_OPTIONAL) \
            or record.get("format") != RECORD_FORMAT:
        raise SpecError(f"{at}: not a {RECORD_FORMAT} record (its keys: {', '.join(sorted(KEYS))}, and "
                        f"\"autotune\" for an autotuner's pick); record it again with this kforge")
    tuned = record.get("autotune", {"key": [], "config": {}})
    if not (isinstance(tuned, dict) and set(tuned) == {"key", "config"} and isinstance(tuned["key"], list)
            and all(isinstance(v, (bool, int, float, str)) for v in tuned["key"])
            and isinstance(tuned["config"], dict)
            and all(isinstance(v, (bool, int, float, str, type(None))) for v in tuned["config"].values())):
        raise SpecError(f"{at}: \"autotune\" must be {{\"key\": [numbers and strings], \"config\": {{name: "
                        f"value}}}}: the autotuner's key and the config it picked")
    # a kernel of thousands of characters names every message of its family: refused here, as no module's
    if not isinstance(record["kernel"], str) or len(record["kernel"]) > KERNEL_MAX \
            or not re.fullmatch(FUNCTION_REF, record["kernel"]):
        raise SpecError(f"{at}: kernel {shown(record['kernel'])} is not 'module:function' (at most {KERNEL_MAX} "
                        f"characters)")
    if not isinstance(record["arch"], str) or record["arch"] not in ARCHS:
        raise SpecError(f"{at}: arch {shown(record['arch'])} is not one kforge builds ({', '.join(ARCHS)})")
    signature = record["signature"]
    if not isinstance(signature, list) or not all(
            isinstance(p, list) and len(p) == 2 and all(isinstance(x, str) for x in p) for p in signature):
        raise SpecError(f"{at}: signature must be a list of [argument, type] pairs")
    repeated = next((a for i, (a, _) in enumerate(signature) if a in {b for b, _ in signature[:i]}), None)
    if repeated is not None:   # one of the two would be dropped without a word: a kernel has each argument once
        raise SpecError(f"{at}: signature names argument {shown(repeated)} twice; record the kernel again")
    if not isinstance(record["constexprs"], dict) or not isinstance(record["options"], dict) or not isinstance(
            record["divisible_by_16"], list):
        raise SpecError(f"{at}: constexprs and options must be objects, divisible_by_16 a list")
    # each name as this line holds it; a value kforge cannot build (a string of thousands of characters, -inf, an
    # integer past 64 bits: Triton compiles them) fails its line alone (_unbuildable), the file's others build
    for field in ("constexprs", "options"):
        for name, value in record[field].items():
            _check_name(name, f"{at}: {field}")
            if not isinstance(value, (bool, int, float, str)):
                _check_value(value, f"{at}: {field} {name}")
    for i, name in enumerate(record["divisible_by_16"]):
        _check_name(name, f"{at}: divisible_by_16")
        if name in record["divisible_by_16"][:i]:
            raise SpecError(f"{at}: divisible_by_16 names argument {shown(name)} twice; record the kernel again")
    if "source_key" in record and not (isinstance(record["source_key"], str)
                                       and re.fullmatch(r"(v[0-9]{1,3}:)?[0-9a-f]{16,128}", record["source_key"])):
        raise SpecError(f"{at}: source_key {shown(record['source_key'])} is not a digest (v<n>: and hex digits); "
                        f"record the kernel again")
    for value in tuned["key"]:
        _check_value(value, f"{at}: autotune key")
    for name, value in tuned["config"].items():
        if value is not None:
            _check_value(value, f"{at}: autotune config {name}")


def _check_name(name, at: str) -> None:
    if not (isinstance(name, str) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,99}", name)):
        raise SpecError(f"{at}: {repr(name)[:60]} is not an argument name (letters, digits and _)")


def _unbuildable(record: dict, at: str) -> str | None:
    """Why kforge cannot build a well-formed line's values (each is one Triton compiled), or None."""
    try:
        for field in ("constexprs", "options"):
            for name, value in record[field].items():
                _check_value(value, f"{at}: {field} {name}")
    except SpecError as e:
        return f"{e}; the line is not built (served, such a call compiles with Triton): remove it to build clean"
    # an option's value no arch takes (num_warps 3): its line alone, named (in its kernel's family, the spec's
    # check named the family's first line and its [extra] table, and the kernel's good lines failed with it)
    a = ARCHS.get(record["arch"])
    for name, value in record["options"].items():
        problem = value_problem(name, value) if name in OPTIONS and name not in record["constexprs"] else None
        if problem is None and a is not None and name in OPTIONS and name not in record["constexprs"]:
            problem = arch_problem(name, value, a.vendor, a.warp_size, a.target_arch)   # no such launch ran there
        if problem:
            return (f"{at}: options {name}: {problem.replace(repr(value), shown(value), 1)}; the line is not built "
                    f"(served, such a call compiles with Triton): remove it to build clean")
    # a kernel parameter named as an option (`num_warps: tl.constexpr`) given positionally: the parameter has one
    # value, the compile option its default; a config holds one value per name
    clash = next((n for n, v in record["constexprs"].items() if record["options"].get(n, v) != v), None)
    if clash is not None:
        return (f"{at}: {clash} is the kernel's parameter ({shown(record['constexprs'][clash])}) and, otherwise, its "
                f"compile option ({shown(record['options'][clash])}), which kforge builds as one value; the line is not "
                f"built (served, such a call compiles with Triton): pass {clash} by keyword, or remove the line")
    return None


ID_TEXT = re.compile(r"[A-Za-z0-9_.+-]{0,64}")   # a string a config id can spell ('fp32'; not 'ñ→✓' or 'a b')


def _check_value(value, at: str) -> None:
    """A value a line may give: true/false, a string, a 64-bit integer or a finite number (not NaN, not 1e400)."""
    if isinstance(value, bool) or (isinstance(value, str) and len(value) <= 1000) \
            or (isinstance(value, int) and -2 ** 63 <= value < 2 ** 63) \
            or (isinstance(value, float) and math.isfinite(value)):
        return
    shown = f"an integer of {value.bit_length()} bits" if isinstance(value, int) else json.dumps(value)[:60]
    raise SpecError(f"{at}: {shown} is not a value kforge builds (true/false, a string, a 64-bit integer or a "
                    f"finite number)")


def families(path: Path, root: Path, extra_archs: tuple[str, ...] = ()) -> list[tuple[dict, str]]:
    """(spec tables, where) per family of the file's records, for spec.spec_from_tables."""
    where = shown_path(path, root)
    groups: dict[str, tuple[int, list[dict]]] = {}   # shape -> (its first line: messages name it, its records)
    for number, record, keys, tuned in _numbered(path, where):
        refused = _unbuildable(record, f"{where}:{number}")
        shape = json.dumps([record["kernel"], record["signature"], sorted(record["divisible_by_16"]),
                            sorted(record["constexprs"]), sorted(record["options"])])
        # a family of its own: it fails alone, or a string it holds spells no id (a family's ids spell its values)
        spelled = all(not isinstance(v, str) or ID_TEXT.fullmatch(v) for v in record["constexprs"].values())
        shape += f"#{number}" if refused or not spelled else ""
        groups.setdefault(shape, (number, []))[1].append({**record, "source_key": keys,   # every key its lines hold
                                                          **({"refused": refused} if refused else {}),
                                                          **({"autotune": True} if tuned else {})})
    found = []
    for shape, (first_line, records) in groups.items():
        first = records[0]
        module, entry = first["kernel"].split(":")
        name = f"rec_{entry.strip('_').lower()}_{hashlib.sha256(shape.encode()).hexdigest()[:6]}"
        params = [*first["constexprs"], *first["options"]]
        configs = [{**r["constexprs"], **r["options"]} for r in records]
        archs = sorted({r["arch"] for r in records} | set(extra_archs), key=list(ARCHS).index)
        lines = len(records)
        vendors: list[str | None] = [None] * lines   # the vendor a config is built for alone (None: every arch)
        recorded_on = {ARCHS[r["arch"]].vendor for r in records}   # a vendor's own lines are what it launches
        for r, c in list(zip(records, configs)):
            added = _other_vendors_stages(r, c, [a for a in archs if ARCHS[a].vendor not in recorded_on])
            if added is not None and added[1] not in configs:
                records.append(r)
                configs.append(added[1])
                vendors.append(added[0])
        tables = {"kernel": {"name": name, "module": module, "entry": entry, "toolchain": "triton",
                             "archs": archs, "description": f"recorded: {first['kernel']}",
                             "id": _id_template(params, configs)},
                  "signature": dict(first["signature"]),
                  "hints": {"divisible_by_16": sorted(first["divisible_by_16"])},
                  "sweep": {p: [configs[0][p]] for p in params}}
        if len(configs) > 1:
            tables["extra"] = configs[1:]
        # the code each arch's lines were recorded from, which the compile checks (triton_backend.py); two on one
        # arch: two GPUs whose import gave the code another value (an SM count), or two versions
        codes: dict[str, set[str]] = {}
        for r in records:
            codes.setdefault(r["arch"], set()).update(r["source_key"])
        if any(codes.values()):
            tables["kernel"]["source_keys"] = {a: sorted(keys) for a, keys in codes.items() if keys}
        if "refused" in first:   # a family of its own line, which fails alone (spec.py raises it)
            tables["kernel"]["refused"] = first["refused"]
        # left out on another arch whose options it cannot take (32 warps of a Hopper record on wave64 AMD)
        skipped = [{"arch": a, **c} for a in archs for r, c, only in zip(records, configs, vendors)
                   if (a != r["arch"] and _unfit(r["options"], a)) or (only is not None and ARCHS[a].vendor != only)]
        if skipped:
            tables["exclude"] = skipped
        found.append((tables, f"{at_lines(where, first_line, lines)}: {first['kernel']}"))
    return found


def _id_template(params: list[str], configs: list[dict]) -> str:
    """The family's id template: what tells its configs apart (a record holds every value Triton fixed). Where
    spelling every value that varies would pass ID_MAX (lmdeploy's fill_kv_cache lines differ in 20 strides, all
    following the head size), only the values that first tell them apart, most varied first, in their order, each
    named by its place in the kernel's parameters where their names are still too long."""
    spelled = {p: {json.dumps(c[p]): len(str(c[p])) for c in configs} for p in params}
    varying = [p for p in params if len(spelled[p]) > 1]
    label = {p: p.lower() for p in params}
    longest = lambda named: sum(len(label[p]) + max(spelled[p].values()) + 1 for p in named)
    if longest(varying) > ID_MAX:
        told, kept = {()}, set()
        for p in sorted(varying, key=lambda p: -len(spelled[p])):
            apart = {tuple(json.dumps(c[q]) for q in (*kept, p)) for c in configs}
            if len(apart) > len(told):
                told, kept = apart, kept | {p}
        varying = [p for p in varying if p in kept]
        if longest(varying) > ID_MAX:   # each by its place instead
            label = {p: f"{params.index(p)}_" for p in params}
    return "-".join(f"{label[p]}{{{p}}}" for p in varying) or "r"


def _other_vendors_stages(record: dict, config: dict, archs: list[str]) -> tuple[str, dict] | None:
    """A plain launch leaves num_stages at its vendor's default (3 on NVIDIA, 2 on AMD), which a line keeps (it
    cannot tell a default from a value the call gave): for the other vendor's archs the line is built with that
    vendor's default too, which the same call there compiles with (an autotuner's config gives its own), as
    (vendor, config); None where there is none to add."""
    own = ARCHS[record["arch"]].vendor
    others = {ARCHS[a].vendor for a in archs} - {own}   # the archs of vendors none of the family's lines ran on
    if not others or "autotune" in record or "num_stages" in record["constexprs"] \
            or config.get("num_stages") != TRITON_VENDOR_DEFAULTS[own]["num_stages"]:
        return None
    other = others.pop()
    return other, {**config, "num_stages": TRITON_VENDOR_DEFAULTS[other]["num_stages"]}


def at_lines(where: str, first: int, count: int) -> str:
    """`specs/app.jsonl:12 (and 15 more lines)`, which AT_LINES reads back."""
    more = count - 1
    return f"{where}:{first}" + (f" (and {more} more line{'s' if more > 1 else ''})" if more else "")


AT_LINES = re.compile(r"(?P<where>.+?\.jsonl):(?P<first>\d+)(?: \(and (?P<more>\d+) more lines?\))?: (?P<rest>.*)",
                      re.DOTALL)   # a message that starts with at_lines(...) and a colon


def _unfit(options: dict, arch: str) -> bool:
    a = ARCHS[arch]
    return any(arch_problem(o, v, a.vendor, a.warp_size, a.target_arch) for o, v in options.items() if o in OPTIONS)


def identity(target) -> str:
    """What decides a target's binary: serving's canonical form (kforge_runtime.serve.identity) with the kinds of
    its compile-time arguments (a "dtype" argument's "bf16" is not the string "bf16")."""
    runtime = [[a, t] for a, t in target.signature if t not in COMPILE_TIME]
    kinds = [[a, t] for a, t in target.signature if t in COMPILE_TIME]
    return json.dumps([canonical(f"{target.module}:{target.entry}", target.arch, runtime, dict(target.constexprs),
                                 list(target.divisible_by_16), dict(target.options)), kinds])


def is_recorded(target) -> bool:
    """Whether its spec_path is "<file>.jsonl: <kernel>"."""
    return target.spec_path.split(":", 1)[0].endswith(".jsonl")


def without_duplicates(targets: list) -> list:
    """The targets less each recorded one that another target of the catalog already builds."""
    built = {identity(t) for t in targets if not is_recorded(t)}
    return [t for t in targets if not is_recorded(t) or identity(t) not in built]
