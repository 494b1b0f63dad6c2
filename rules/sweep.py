"""A spec's [sweep], [[extra]] and [[exclude]] -> its configs, and each config's stable, readable id."""
from __future__ import annotations

import dataclasses
import itertools
import math
import re
import string

from kforge import settings
from kforge.dtypes import allowed_dtypes, canonical_dtype
from kforge.spec_model import COMPILE_OPTIONS, Config, Scalar, Spec, SpecError

WARPS_ALLOWED = (1, 2, 4, 8, 16)


CONFIG_ID = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]{0,199}")   # a directory name and part of a target name


def expand(spec: Spec, sweep: dict, extras: list[dict], excludes: list[dict]) -> Spec:
    where = spec.path
    params = tuple(sweep)
    _check_params(spec, params)
    for p, values in sweep.items():
        if not values:
            raise SpecError(f"{where}: [sweep] {p}: empty list; give at least one value")
        kinds = sorted({type(v).__name__ for v in values})
        if len(kinds) > 1:
            raise SpecError(f"{where}: [sweep] {p}: values of mixed types ({', '.join(kinds)}): got {values!r}; "
                            f"give every value of one type")
    size = math.prod(len(v) for v in sweep.values()) + len(extras)   # counted before anything is expanded
    limit = settings.get("max_configs")
    if size > limit:
        raise SpecError(f"{where}: [sweep] gives {size:,} configs ("
                        + " x ".join(f"{len(v)} {p}" for p, v in sweep.items())
                        + f"), more than the {limit:,} one family may have; narrow the sweep, split the family, "
                          f"or raise the limit with KFORGE_MAX_CONFIGS=N")
    canon = {p: tuple(_canon(spec, p, v, "sweep") for v in vs) for p, vs in sweep.items()}
    configs: list[Config] = [tuple(zip(params, combo)) for combo in itertools.product(*canon.values())]
    for i, extra in enumerate(extras):
        if set(extra) != set(params):
            raise SpecError(f"{where}: [[extra]] #{i + 1} must give exactly the swept parameters "
                            f"{list(params)}; got {list(extra)}")
        configs.append(tuple((p, _canon(spec, p, extra[p], "extra")) for p in params))
    configs = list(dict.fromkeys(configs))   # an extra equal to a swept config is the same target

    norm_excludes = tuple(_normalize_exclude(spec, params, i, ex) for i, ex in enumerate(excludes))
    for i, ex in enumerate(norm_excludes):
        if not any(matches(ex, c, a) for c in configs for a in spec.archs):
            raise SpecError(f"{where}: [[exclude]] #{i + 1} {dict(ex)} matches no config; "
                            f"fix its values or remove it")
    kept = tuple(c for c in configs if not all(any(matches(ex, c, a) for ex in norm_excludes)
                                               for a in spec.archs))
    if not kept:
        raise SpecError(f"{where}: the sweep is empty after [[exclude]]; nothing would be built")
    spec = dataclasses.replace(spec, configs=kept, excludes=norm_excludes)
    _check_id_template(spec, params)
    _check_unique_ids(spec)
    return spec


def matches(exclude, config: Config, arch: str) -> bool:
    values = dict(config, arch=arch)
    return all(values[k] in v for k, v in exclude)


def config_id(spec: Spec, config: Config) -> str:
    """'bf16-m128n128k64-w8s3' from the spec's id template, or 'bf16-block_m128-...' by default."""
    values = {p: _short(v) if isinstance(v, bool) else v for p, v in config}
    if spec.id_template:
        return spec.id_template.format(**values)
    parts = [str(v) if p in spec.type_vars else f"{p.lower()}{_short(v)}" for p, v in config]
    return "-".join(parts)


def _short(v: Scalar) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)


def _check_params(spec: Spec, params: tuple[str, ...]) -> None:
    where = spec.path
    constexprs, type_vars = spec.constexprs, spec.type_vars
    constants = dict(spec.constants)
    options = COMPILE_OPTIONS if spec.toolchain == "triton" else ()   # FlyDSL kernels set their own block size
    allowed = set(constexprs) | set(type_vars) | set(options)
    for p in params:
        if p not in allowed:
            raise SpecError(f"{where}: [sweep] {p}: not a parameter of {spec.entry}; allowed: constexprs "
                            f"{list(constexprs)}, type variables {list(type_vars)}, options {list(options)}")
        if p in constants:
            raise SpecError(f"{where}: {p} is both in [constants] and in [sweep]; keep one")
    for c in constants:
        if c not in constexprs:
            raise SpecError(f"{where}: [constants] {c}: not a constexpr of {spec.entry}; "
                            f"constexprs: {list(constexprs)}")
    for c in constexprs:
        if c not in constants and c not in params:
            raise SpecError(f"{where}: constexpr {c} has no value; add it to [constants] or [sweep]")
    for v in type_vars:
        if v not in params:
            raise SpecError(f"{where}: [signature] uses {{{v}}} but [sweep] has no {v}; add `{v} = [\"bf16\"]`")


def _canon(spec: Spec, param: str, value: Scalar, table: str) -> Scalar:
    value = canonical_value(param, value, spec.type_vars, spec.path)
    if param == "num_warps" and (type(value) is not int or value not in WARPS_ALLOWED):
        raise SpecError(f"{spec.path}: [{table}] num_warps: got {value!r}; allowed: {WARPS_ALLOWED}")
    if param == "num_stages" and (type(value) is not int or not 1 <= value <= 8):
        raise SpecError(f"{spec.path}: [{table}] num_stages: got {value!r}; allowed: integers 1..8")
    return value


def _normalize_exclude(spec: Spec, params, i: int, ex: dict):
    for k in ex:
        if k not in params and k != "arch":
            raise SpecError(f"{spec.path}: [[exclude]] #{i + 1}: key {k!r} is not swept; "
                            f"allowed: {', '.join(params)}, arch")
    return tuple((k, tuple(_canon(spec, k, x, "exclude") if k != "arch" else x
                           for x in (v if isinstance(v, list) else [v])))
                 for k, v in ex.items())


def _check_id_template(spec: Spec, params) -> None:
    if not spec.id_template:
        return
    fields = [f for _, f, _, _ in string.Formatter().parse(spec.id_template) if f is not None]
    for f in fields:
        if f not in params:
            raise SpecError(f"{spec.path}: [kernel] id: placeholder {{{f}}} is not a swept parameter; "
                            f"allowed: {', '.join(params)}")
    if not all(c.isalnum() or c in "-_.{}" for c in spec.id_template):
        raise SpecError(f"{spec.path}: [kernel] id: {spec.id_template!r} may hold only letters, digits, "
                        f"'-', '_', '.' and placeholders")


def _check_unique_ids(spec: Spec) -> None:
    """Every config id is unique and a safe name: it becomes a directory under out/ and part of the target
    name <kernel>:<id>@<arch> (a value like '../x', 'a b' or 'x@y' would escape out/ or break the name)."""
    seen: dict[str, Config] = {}
    for c in spec.configs:
        cid = config_id(spec, c)
        if not CONFIG_ID.fullmatch(cid):
            raise SpecError(f"{spec.path}: [sweep] config {dict(c)} gets the id {cid!r}, which is not a safe name; "
                            f"ids may hold letters, digits, '_', '.', '+', '-' (starting with a letter, digit or '_'), "
                            f"at most 200 characters: change the values or [kernel] id")
        if cid in seen:
            raise SpecError(f"{spec.path}: configs {dict(seen[cid])} and {dict(c)} both get id {cid!r}; "
                            f"add the differing parameter to [kernel] id")
        seen[cid] = c


def canonical_value(param: str, value: Scalar, type_vars: tuple[str, ...], where: str) -> Scalar:
    """Type-variable values become canonical dtype names; the rest stay as TOML gave them."""
    if param in type_vars:
        canon = canonical_dtype(value) if isinstance(value, str) else None
        if canon is None:
            raise SpecError(f"{where}: [sweep] {param}: got {value!r}; allowed: {allowed_dtypes()}")
        return canon
    return value
