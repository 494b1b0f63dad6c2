"""A spec's [sweep], [[extra]] and [[exclude]] -> its configs, and each config's stable, readable id."""
from __future__ import annotations

import dataclasses
import json
import math
import re
import string
import types

from kforge.base import settings
from kforge.base.dtypes import allowed_dtypes, canonical_dtype
from kforge.base.errors import SpecError
from kforge.declare.spec_model import Config, Configs, Exclude, Scalar, Spec, shown
from kforge.base.target import FUNCTION_REF
from kforge.declare.triton_options import OPTIONS, value_problem
from kforge_runtime.schema import COMPILE_TIME, VALUE_KINDS


CONFIG_ID = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]{0,199}")   # a directory name and part of a target name
ID_FIRST = frozenset(string.ascii_letters + string.digits + "_")   # CONFIG_ID's characters, for per-value checks
ID_CHARS = ID_FIRST | frozenset(".+-")
ID_MAX = 200


def expand(spec: Spec, sweep: dict, extras: list[dict], excludes: list[dict], made_extras: int = 0,
           own_excludes: int | None = None) -> Spec:
    """The spec with its Configs, checked per sweep value, not per config (a 50,000-config family loads without
    making them). What the spec lists twice is refused; what kforge made is merged: the first `made_extras`
    extras (autotune configs, a record's lines) and the excludes after the first `own_excludes` (None: none)."""
    where = spec.path
    params = tuple(sweep)
    _check_params(spec, params)
    for p, values in sweep.items():
        if not values:
            raise SpecError(f"{where}: [sweep] {p}: empty list; give at least one value")
        kinds = sorted({type(v).__name__ for v in values})
        if len(kinds) > 1:
            raise SpecError(f"{where}: [sweep] {p}: values of mixed types ({', '.join(kinds)}): got {shown(values)}; "
                            f"give every value of one type")
    size = math.prod(len(v) for v in sweep.values()) + len(extras)   # counted before anything is expanded
    limit = settings.get("max_configs")
    if size > limit:
        extra = f" + {len(extras):,} [[extra]]" if extras else ""
        raise SpecError(f"{where}: [sweep] gives {size:,} configs ("
                        + " x ".join(f"{len(v)} {p}" for p, v in sweep.items()) + extra
                        + f"), more than the {limit:,} one family may have; narrow the sweep, split the family, "
                          f"or raise the limit with KFORGE_MAX_CONFIGS=N")
    # [override] lists are swept too (rules/declare/spec.py), and messages name the table the spec wrote them in
    values = tuple(_once(spec, p, [_canon(spec, p, v, "sweep") for v in vs], vs,
                         f"[{'override' if p in spec.derived else 'sweep'}] {p}")
                   for p, vs in sweep.items())
    swept = [frozenset(map(exact, vs)) for vs in values]
    # equal means of one type too: 128 and 128.0 are two compiles to Triton, two configs
    unique: dict[tuple, Config] = {}
    first: dict[tuple, int] = {}   # config -> the extra that gave it first
    for i, extra in enumerate(extras):
        own = i - made_extras   # the spec's own [[extra]] blocks, numbered from 1 in messages
        if set(extra) != set(params):
            own_only = [p for p in params if p not in spec.tuned]
            tuned = f", or those of [sweep] alone ({own_only}): such a pairing is built with every " \
                    f"@triton.autotune config" if spec.tuned else ""
            raise SpecError(f"{where}: [[extra]] #{own + 1} must give exactly the swept parameters "
                            f"{list(params)}{tuned}; got {shown(list(extra))}")
        c = tuple((p, _canon(spec, p, extra[p], "extra")) for p in params)
        key = tuple(exact(v) for _, v in c)
        earlier = first.setdefault(key, i) - made_extras
        if own >= 0 and earlier >= 0 and earlier != own:
            raise SpecError(f"{where}: [[extra]] #{own + 1} {shown(dict(c))}: the same config as [[extra]] "
                            f"#{earlier + 1}; remove one")
        # an autotuned entry's sweep holds the library's configs, which a release may change: merged
        if own >= 0 and not spec.tuned and all(k in vs for k, vs in zip(key, swept)):
            raise SpecError(f"{where}: [[extra]] #{own + 1} {shown(dict(c))}: already a config of [sweep]; "
                            f"remove it (an [[extra]] adds a config the sweep does not make)")
        unique.setdefault(key, c)
    outside = tuple(c for c in unique.values() if not all(exact(v) in vs for (_, v), vs in zip(c, swept)))

    norm_excludes = tuple(_normalize_exclude(spec, params, i, ex) for i, ex in enumerate(excludes))
    blocks: dict[frozenset, int] = {}   # an [[exclude]] as what it drops (its keys and values, in any order)
    for i, ex in enumerate(norm_excludes[:own_excludes]):
        same = blocks.setdefault(frozenset((k, frozenset(map(exact, vs))) for k, vs in ex.given), i)
        if same != i:
            raise SpecError(f"{where}: [[exclude]] #{i + 1} {shown(dict(ex.given))}: the same as [[exclude]] "
                            f"#{same + 1}; remove one")
    # an autotuner's pruner may rewrite its configs (rules/plan/targets.py): an exclude may name a value it makes
    rewritten = set(spec.tuned) if "prune" in dict(spec.notes) else set()
    for i, ex in enumerate(norm_excludes):
        if not _matches_some(ex, values, outside, spec.archs) and not rewritten.intersection(dict(ex.given)):
            raise SpecError(f"{where}: [[exclude]] #{i + 1} {shown(dict(ex.given))} matches no config; "
                            f"fix its values or remove it")
    configs = Configs(params, values, outside, norm_excludes, spec.archs)
    if next(iter(configs), None) is None:
        raise SpecError(f"{where}: the sweep is empty after [[exclude]]; nothing would be built")
    spec = dataclasses.replace(spec, configs=configs, excludes=norm_excludes)
    _check_id_template(spec, params)
    if not _ids_unique_and_safe(spec, values, outside):
        ids: dict[str, Config] = {}
        for c in configs:   # config by config: names the configs at fault, or finds none (excluded)
            check_config_id(spec, c, ids, "[sweep] and the entry's autotune configs" if spec.tuned else "[sweep]")
    return spec


def check_values(where: str, signature: tuple, toolchain: str, swept: dict) -> None:
    """Each [sweep] value as expand() checks it, before the family's module is imported for its autotune configs or
    heuristics: a dtype typo then fails at once, not after a probe per arch (seconds each for a large library)."""
    early = types.SimpleNamespace(path=where, signature=signature, toolchain=toolchain)
    early.type_vars, early.constexprs = Spec.type_vars.func(early), Spec.constexprs.func(early)
    for param, values in swept.items():
        for value in values if isinstance(values, list) else ():
            _canon(early, param, value, "sweep")


def exact(value: Scalar) -> tuple[type, Scalar]:
    """A value as a key that tells 1, 1.0 and true apart: Python's == does not, and Triton compiles each apart."""
    return type(value), value


def _once(spec: Spec, param: str, canon: list[Scalar], given: list, table_key: str) -> tuple[Scalar, ...]:
    """A list's canonical values, when none is listed twice once canonical ('bfloat16' is 'bf16'), else SpecError."""
    seen: dict[tuple, Scalar] = {}
    for value, raw in zip(canon, given):
        if exact(value) in seen:
            before = seen[exact(value)]
            why = ("this one is listed twice" if exact(raw) == exact(before) else
                   f"{shown(raw)} is {shown(value)}, as {shown(before)} listed before it")
            raise SpecError(f"{spec.path}: {table_key}: got {shown(raw)}; allowed: each value once ({why})")
        seen[exact(value)] = raw
    return tuple(canon)


def _matches_some(ex: Exclude, values: tuple[tuple[Scalar, ...], ...], outside: tuple[Config, ...],
                  archs: tuple[str, ...]) -> bool:
    """Whether ex drops any config on any arch (the product holds every combination of the values)."""
    if ex.archs is not None and not ex.archs.intersection(archs):
        return False
    return all(vs.intersection(values[i]) for i, vs in ex.at) or any(all(c[i][1] in vs for i, vs in ex.at) for c in outside)


def config_id(spec: Spec, config: Config) -> str:
    """'bf16-m128n128k64-w8s3' from the spec's id template, or 'bf16-block_m128-...' by default."""
    functions = {a for a, t in spec.signature if t == "function"}
    if spec.id_template:
        return spec.id_template.format_map({p: _short(v, p in functions) for p, v in config})
    type_vars = spec.type_vars
    return "-".join(_short(v) if p in type_vars else f"{p.lower()}{_short(v, p in functions)}" for p, v in config)


def _short(v: Scalar, function: bool = False) -> str:
    """A value as ids spell it: str(), but true/false as TOML writes them and a "function" by its name."""
    if function:
        return str(v).rsplit(":", 1)[-1]
    return str(v).lower() if isinstance(v, bool) else str(v)


def _check_params(spec: Spec, params: tuple[str, ...]) -> None:
    where = spec.path
    constexprs, type_vars = spec.constexprs, spec.type_vars
    constants = dict(spec.constants)
    options = tuple(OPTIONS) if spec.toolchain == "triton" else ()   # FlyDSL kernels set their own block size
    # an entry whose heuristics (or pruner) read the arguments may be given scalar ones' values: shape hints.
    # Its pointers are given to them as stand-ins answering their dtype alone (rules/load/entry_probe.py).
    hints = tuple(a for a, t in spec.signature if _is_scalar(t)) if spec.reads_args else ()
    if spec.reads_args:
        for p in (*params, *constants):
            kind = dict(spec.signature).get(p, "")
            if kind.startswith(("*", "tensordesc")):
                raise SpecError(f"{where}: {p} is a {kind} argument: the entry's heuristics see it as a stand-in "
                                f"answering its element type alone, so it takes no value; remove it from "
                                f"{'[sweep]' if p in params else '[constants]'}")
            problem = _hint_problem(kind, constants[p]) if p in hints and p in constants else None
            if problem:
                raise SpecError(f"{where}: [constants] {p}: {problem}")
    allowed = set(constexprs) | set(type_vars) | set(options) | set(hints)
    for p in params:
        if p not in allowed:
            kind = dict(spec.signature).get(p)
            what = (f"a runtime {kind} argument of {spec.entry}: a binary takes it at launch, so no config sets it; "
                    f"a value for it is a shape hint, which only an entry whose @triton.heuristics or autotune "
                    f"pruner reads the arguments takes (this one has none): remove it" if kind else
                    f"not a parameter of {spec.entry}")
            raise SpecError(f"{where}: [sweep] {p}: {what}; allowed: constexprs "
                            f"{list(constexprs)}, type variables {list(type_vars)}, options {list(options)}"
                            + (f", shape hints {list(hints)}" if hints else ""))
        if p in constants:
            raise SpecError(f"{where}: {p} is both in [constants] and in [sweep]; keep one")
    for c in constants:
        if c in options:   # a compile option, not an argument: it goes where options go
            raise SpecError(f"{where}: [constants] {c}: {c} is a compile option, not a constexpr of {spec.entry}; "
                            f"set it in [sweep] (`{c} = [{json.dumps(constants[c])}]`), or for one arch in "
                            f"[arch.<arch>]")   # json.dumps: the line a user pastes is TOML (true, not True)
        if c not in constexprs and c not in hints:
            raise SpecError(f"{where}: [constants] {c}: not a constexpr of {spec.entry}; "
                            f"constexprs: {list(constexprs)}")
    for c in without_value(spec, params):
        if "prune" not in dict(spec.notes):   # else the autotuner's pruner may set it: checked once it has pruned
            raise SpecError(no_value(spec, c))   # (rules/plan/targets.py _pruned)
    for v in type_vars:
        if v not in params:
            raise SpecError(f"{where}: [signature] uses {{{v}}} but [sweep] has no {v}; add `{v} = [\"bf16\"]`")


def without_value(spec: Spec, params: tuple[str, ...], arch: str | None = None) -> list[str]:
    """The constexprs the spec gives no value on `arch` (None: on some arch of its own)."""
    constants = dict(spec.constants)
    return [c for c in spec.constexprs if c not in constants and c not in params and c not in spec.derived
            and not (c in spec.on_arch(arch) if arch else all(c in spec.on_arch(a) for a in spec.archs))]


def no_value(spec: Spec, c: str, pruned: str = "") -> str:
    """The line saying constexpr c has no value; `pruned`: the words saying the pruner did not set it either."""
    unread = dict(spec.unread_defaults).get(c)
    dtype = _dtype_default(unread)
    if dtype is not None:   # a string in [constants] would reach Triton as a string: no .to_ir at compile
        return (f"{spec.path}: constexpr {c} has no value: its default in the source, {shown(unread, 80)}, is a "
                f"dtype{pruned}; declare `{c} = \"dtype\"` in [signature] and give it in [constants] or [sweep] "
                f"(`{c} = \"{dtype}\"`)")
    why = (f": its default in the source, {shown(unread, 80)}, is not one kforge reads (a literal, or a name "
           f"bound once to a literal at the top of its module or of a module of its package, a package with "
           f"an __init__.py)" if unread else "")
    return f"{spec.path}: constexpr {c} has no value{why}{pruned}; add it to [constants] or [sweep]"


def _dtype_default(text) -> str | None:
    """The canonical dtype a default's source text names (`tl.int32`, `triton.language.bfloat16`), else None."""
    found = isinstance(text, str) and re.fullmatch(r"(?:tl|triton\.language|torch)\.(\w+)", text)
    return canonical_dtype(found[1]) if found else None


def typed_value(kind: str, value, where: str):
    """A "dtype" argument's value as a canonical element type name; a "function" argument's as "module:name"."""
    if kind == "dtype":
        canon = canonical_dtype(value) if isinstance(value, str) else None
        if canon is None:
            raise SpecError(f"{where}: got {shown(value)}; a 'dtype' argument takes an element type: "
                            f"{allowed_dtypes()}")
        return canon
    if not isinstance(value, str) or not re.fullmatch(FUNCTION_REF, value):
        raise SpecError(f"{where}: got {shown(value)}; a 'function' argument names a @triton.jit function as "
                        f"'module:function', e.g. 'kernels.activations:relu'")
    return value


def _is_scalar(kind: str) -> bool:
    """A runtime argument passed by value (i32, fp32, ...), not a pointer or a descriptor."""
    return kind not in COMPILE_TIME and not kind.startswith(("*", "tensordesc"))


def _hint_problem(kind: str, value) -> str | None:
    """Why a shape hint cannot be a value its runtime argument receives at launch (None: it can)."""
    if canonical_dtype(kind) == "u1":   # i1, bool: Triton passes a bool argument as a bool (0 and 1 work too)
        ok, want = isinstance(value, int), "an integer or true/false"
    elif kind.startswith(("i", "u")):
        ok, want = isinstance(value, int) and not isinstance(value, bool), "an integer"
    else:
        ok, want = isinstance(value, (int, float)) and not isinstance(value, bool), "a number"
    return None if ok else f"a shape hint for a {kind} argument must be {want}, got {shown(value)}"


def _canon(spec: Spec, param: str, value: Scalar, table: str) -> Scalar:
    kind = dict(spec.signature).get(param)
    if kind in VALUE_KINDS:
        return typed_value(kind, value, f"{spec.path}: [{table}] {param}")
    problem = _hint_problem(kind, value) if kind is not None and _is_scalar(kind) else None
    if problem:
        raise SpecError(f"{spec.path}: [{table}] {param}: {problem}")
    if param in spec.type_vars:   # type variables' values become canonical dtype names
        canon = canonical_dtype(value) if isinstance(value, str) else None
        if canon is None:
            raise SpecError(f"{spec.path}: [{table}] {param}: got {shown(value)}; allowed: {allowed_dtypes()}")
        value = canon
    if spec.toolchain == "triton" and param in OPTIONS and param not in spec.constexprs:
        problem = value_problem(param, value)
        if problem:
            raise SpecError(f"{spec.path}: [{table}] {param}: {problem.replace(repr(value), shown(value), 1)}")
    return value


def _normalize_exclude(spec: Spec, params, i: int, ex: dict) -> Exclude:
    for k in ex:
        if k not in params and k != "arch":
            raise SpecError(f"{spec.path}: [[exclude]] #{i + 1}: key {shown(k)} is not swept; "
                            f"allowed: {', '.join(params)}, arch")
    given = tuple((k, _once(spec, k, [_canon(spec, k, x, "exclude") if k != "arch" else x for x in listed], listed,
                            f"[[exclude]] #{i + 1} {k}"))
                  for k, v in ex.items() for listed in [v if isinstance(v, list) else [v]])
    return Exclude(given=given, at=tuple((params.index(k), frozenset(vs)) for k, vs in given if k != "arch"),
                   archs=next((frozenset(vs) for k, vs in given if k == "arch"), None))


def _check_id_template(spec: Spec, params) -> None:
    if not spec.id_template:
        return
    try:
        fields = [f for _, f, _, _ in string.Formatter().parse(spec.id_template) if f is not None]
    except ValueError as e:   # an unmatched '{' or '}'
        raise SpecError(f"{spec.path}: [kernel] id: {shown(spec.id_template)} is not a template ({e}); "
                        f"allowed: text with placeholders such as {{BLOCK}}") from None
    for f in fields:
        if f not in params:
            raise SpecError(f"{spec.path}: [kernel] id: placeholder {{{f}}} is not a swept parameter; "
                            f"allowed: {', '.join(params)}")
    if not all(c.isalnum() or c in "-_.{}" for c in spec.id_template):
        raise SpecError(f"{spec.path}: [kernel] id: {shown(spec.id_template)} may hold only letters, digits, "
                        f"'-', '_', '.' and placeholders")


def _ids_unique_and_safe(spec: Spec, values: tuple[tuple[Scalar, ...], ...], outside: tuple[Config, ...]) -> bool:
    """True when the values alone show every config's id safe and unique; False when that takes formatting each
    config (check_config_id). Ids are unique when each reads back into its values: a parameter with several
    values is in the id, spells each differently, and (where it first appears) ends the id or is followed by
    text whose first character none of its spellings holds."""
    spellings = []   # per param: how its ids spell each of its distinct values, extras' values included
    functions = {i for i, p in enumerate(spec.configs.params) if (p, "function") in spec.signature}
    for i, vs in enumerate(values):
        distinct = {exact(v): v for v in vs + tuple(c[i][1] for c in outside)}
        texts = [_short(v, i in functions) for v in distinct.values()]
        if len(set(texts)) != len(texts):
            return False
        spellings.append(texts)
    pieces: list[str | int] = []   # the id: text, or the index of a parameter with several values
    for piece in _id_pieces(spec):
        if isinstance(piece, int) and len(spellings[piece]) == 1:
            piece = spellings[piece][0]
        if isinstance(piece, str) and pieces and isinstance(pieces[-1], str):
            pieces[-1] += piece
        elif piece != "":
            pieces.append(piece)
    if any(len(texts) > 1 and i not in pieces for i, texts in enumerate(spellings)):
        return False   # configs that differ only there share an id
    seen = set()
    for j, piece in enumerate(pieces):
        if isinstance(piece, int) and piece not in seen:
            seen.add(piece)
            after = pieces[j + 1] if j + 1 < len(pieces) else ""
            if isinstance(after, int) or (after and any(after[0] in t for t in spellings[piece])):
                return False
    # safe: CONFIG_ID's characters, a safe first one, and not too long even with the longest values
    choices = [[p] if isinstance(p, str) else spellings[p] for p in pieces]
    return (bool(choices) and all(t[:1] and t[0] in ID_FIRST for t in choices[0])
            and all(ID_CHARS.issuperset(t) for texts in choices for t in texts)
            and sum(max(map(len, texts)) for texts in choices) <= ID_MAX)


def _id_pieces(spec: Spec) -> list[str | int]:
    """The id template as text and parameter indexes ('{dtype}-b{BLOCK}' -> [0, '-b', 1])."""
    params = spec.configs.params
    if spec.id_template:
        pieces: list[str | int] = []
        for text, field, _, _ in string.Formatter().parse(spec.id_template):
            pieces += [text] + ([params.index(field)] if field is not None else [])
        return pieces
    return [piece for i, p in enumerate(params)
            for piece in (["-"] if i else []) + ([] if p in spec.type_vars else [p.lower()]) + [i]]


def check_config_id(spec: Spec, config: Config, ids: dict[str, Config], made_by: str = "[sweep]") -> None:
    """The config's id is a safe name (a directory under out/ and part of <kernel>:<id>@<arch>: '../x' or 'x@y'
    would escape out/ or break it) and no other's in `ids` (where it is added); `made_by`: where it came from."""
    cid = config_id(spec, config)
    if not CONFIG_ID.fullmatch(cid):
        raise SpecError(f"{spec.path}: config {shown(dict(config))} from {made_by} gets the id {shown(cid)}, which is "
                        f"not a safe name; ids may hold letters, digits, '_', '.', '+', '-' (starting with a letter, "
                        f"digit or '_'), at most 200 characters: change the values or [kernel] id")
    if cid in ids:
        # each shown by what tells them apart: two long configs cut short at the same place read alike
        first, second = dict(ids[cid]), dict(config)
        differ = [k for k in {**first, **second} if k not in first or k not in second or first[k] != second[k]
                  or type(first[k]) is not type(second[k])]
        apart = lambda c: {k: c[k] for k in differ if k in c}
        same = f" (the rest of each alike: {len(first) - len(apart(first))} values)" if len(first) > len(differ) else ""
        raise SpecError(f"{spec.path}: configs {shown(apart(first))} and {shown(apart(second))}{same} from {made_by} "
                        f"both get id {shown(cid)}; add the differing parameter to [kernel] id")
    ids[cid] = config
