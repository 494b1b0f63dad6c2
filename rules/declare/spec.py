"""specs/*.toml (and a Python catalog's families) -> validated, frozen Spec objects. Every check names the file,
table and key, the value received and what is allowed, and stops at the first problem with one SpecError; the
kernel source is read with `ast`, nothing here imports a compiler.
"""
from __future__ import annotations

import itertools
import json
import math
import re
import stat
import tomllib
from pathlib import Path

from kforge.base import archs as archs_mod
from kforge.load import entry_probe, sources
from kforge.declare import sweep
from kforge.base.dtypes import allowed_dtypes, canonical_arg_type
from kforge.base.errors import SpecError
from kforge.base.project_config import not_a_file, project_setup, read_user_file
from kforge.declare.spec_model import (NAME_MAX, TYPE_VAR_RE, Spec, Tune, importing, merged_env, nested, shown,
                                       shown_path)
from kforge.base.target import FUNCTION_REF
from kforge.declare.triton_options import FILLED_OPTIONS, OPTIONS, value_problem
from kforge_runtime.schema import COMPILE_TIME, NONE, VALUE_KINDS   # NONE: a [signature] type (passed as None)

TOOLCHAINS = ("triton", "flydsl")
NAME_RE = re.compile(r"^[a-z][a-z0-9_]*$")
DESCRIPTION_MAX = 300   # characters of a family's one-line description
BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")   # a TOML key written without quotes
INT64 = range(-2**63, 2**63)               # TOML's integers


# table -> key -> (python type(s), required, what it is). "*" is any key (mappings).
SCHEMA: dict[str, dict[str, tuple[type | tuple[type, ...], bool, str]]] = {
    "kernel": {
        "name": (str, True, "kernel family name, lower_snake_case"),
        "source": (str, False, "kernel source file, relative to the project root (or `module`)"),
        "module": (str, False, "an installed module holding the kernel, e.g. 'liger_kernel.ops.rms_norm' "
                               "(or `source`)"),
        "entry": (str, True, "the @triton.jit function (triton) or the kernel factory (flydsl) in the source"),
        "toolchain": (str, True, f"one of: {', '.join(TOOLCHAINS)}"),
        "archs": (list, False, "a list of archs to build for, e.g. [\"sm_90a\"] (default: sm_90a, gfx942, gfx950)"),
        "id": (str, False, "config id template, e.g. '{dtype}-m{BLOCK_M}'"),
        "description": (str, False, "one line for `doit list`"),
        "device_model": (bool, False, "false: import the module as this machine is, not as the arch's reference "
                                      "GPU would see it (docs/device_model.md; default true, Triton only)"),
        "setup": (str, False, "a set-up hook 'module:function' run before the module is imported where it is "
                              "(docs/device_model.md)"),
    },
    "signature": {"*": (str, True, "argument type ('*{dtype}', 'i32', 'fp32'), 'constexpr', 'dtype' (a "
                                   "constexpr element type), or 'none' (passed as None)")},
    "constants": {"*": ((int, float, bool, str, type(None)), False,
                        "a fixed constexpr value: a number, a bool or a string (a dtype by its name, 'fp32', its "
                        "argument declared 'dtype' in [signature]), None only from a Python catalog")},
    "hints": {"divisible_by_16": (list, False, "arguments promised 16-divisible (pointers, strides)")},
    "arch": {"*": (dict, False, "values for one arch: [arch.gfx942] with constexprs or compile options, "
                                "e.g. num_warps = 16, and [arch.gfx942.env], its environment over [env]")},
    "adapter": {
        "arguments": (dict, False, "spec parameter -> the builder's argument name, e.g. {dtype = \"dtype_str\"}"),
        "dtype_names": (dict, False, "kforge element type -> the builder's name for it, e.g. {fp16 = \"f16\"}"),
        "shapes": (dict, False, "tensor argument -> its placeholder's shape: sizes or parameter names"),
        "scalars": (dict, False, "scalar argument -> its placeholder value (default 0)"),
    },
    "env": {"*": (str, False, "an environment variable set where the family compiles (and its module is "
                              "imported), e.g. LIGER_AUTOTUNE = \"0\"")},
    "sweep": {"*": (list, True, "non-empty list of values of one parameter")},
    "override": {"*": ((int, float, bool, str, list), False, "a value pinned in place of what the entry's "
                       "@triton.heuristics compute: one value for the family, or a list (one config per value)")},
    "extra": {"*": ((int, float, bool, str), False, "one explicit config")},
    "exclude": {"*": ((int, float, bool, str, list), False, "partial config to drop")},
    "tune": {
        "harness": (str, True, "module file defining problem(shape, types, device) and grid(shape, config); "
                               "optionally prepare(problem, config), run before each launch"),
        "shape_args": (list, True, "the runtime integer arguments a shape gives, e.g. ['M', 'N', 'K']"),
        "shapes": (list, True, "problem shapes to tune for: lists of positive integers, one per shape_args"),
    },
}
NESTED_LISTS = {("tune", "shapes")}
HARNESS_FUNCTIONS = ("problem", "grid")
REQUIRED_TABLES = ("kernel", "signature", "sweep")
LIST_TABLES = ("extra", "exclude")


SPEC_LIMIT = 16 << 20   # bytes: a spec of 50,000 configs' values is a few MB; never a disk image read whole

def load_spec(path: Path, root: Path) -> Spec:
    """Parse and validate one spec file; root is the project root that `source` is relative to."""
    return spec_from_tables(read_tables(path, root), shown_path(path, root), root)


def read_tables(path: Path, root: Path) -> dict:
    """One spec file's tables, as TOML gives them (SpecError when it cannot be read or is not TOML)."""
    where = shown_path(path, root)
    data = read_user_file(path, SPEC_LIMIT, "a spec", "a spec is a TOML file of a few kB", where)
    try:
        raw = tomllib.loads(data.decode("utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise SpecError(f"{where}: not valid TOML: {e}") from None
    except UnicodeDecodeError as e:
        raise SpecError(f"{where}: not UTF-8 text (byte {e.start}: {e.reason}); save the spec as UTF-8") from None
    except ValueError as e:   # tomllib reads a decimal integer with Python's int(), which stops at 4,300 digits
        raise SpecError(f"{where}: not valid TOML: {str(e).split(';')[0]}; "
                        f"allowed: TOML's 64-bit integers, -2**63 .. 2**63-1") from None
    except RecursionError:
        raise SpecError(f"{where}: not valid TOML: arrays or tables nested too deeply to read; "
                        f"allowed: a few levels, as in [tune] shapes") from None
    return raw


def spec_from_tables(raw: dict, where: str, root: Path, recorded: bool = False) -> Spec:
    """One family from its tables (a TOML spec's, or a Python catalog's family() call's); `where` names it in
    messages. recorded: the configs are specializations as Triton compiled them (rules/declare/records.py), the
    values the entry's @triton.autotune and @triton.heuristics chose included: those are not applied again."""
    codes = {}
    if recorded:   # the code its lines were recorded from, by arch (rules/declare/records.py): not a spec's key
        codes = raw["kernel"].get("source_keys", {})
        if "refused" in raw["kernel"]:   # a record line kforge cannot build (records._unbuildable)
            raise SpecError(raw["kernel"]["refused"])
        raw = {**raw, "kernel": {k: v for k, v in raw["kernel"].items() if k != "source_keys"}}
    _check_integers(raw, where)
    _check_schema(raw, where)
    k = raw["kernel"]
    name = _check_name(k["name"], where)
    if k["toolchain"] not in TOOLCHAINS:
        _fail(where, "kernel", "toolchain", k["toolchain"], ", ".join(TOOLCHAINS))
    arch_names = tuple(k.get("archs", archs_mod.DEFAULT_ARCHS))
    for i, a in enumerate(arch_names):
        if a not in archs_mod.ARCHS:
            _fail(where, "kernel", "archs", a, ", ".join(archs_mod.ARCHS))
        if a in arch_names[:i]:   # it would be two targets of one name
            _fail(where, "kernel", "archs", a, "each arch once (this one is listed twice)")
    if not arch_names:
        _fail(where, "kernel", "archs", [], "a non-empty list of " + ", ".join(archs_mod.ARCHS))

    if ("source" in k) == ("module" in k):
        raise SpecError(f"{where}: [kernel]: give exactly one of `source` (a project file, e.g. "
                        f"'kernels/gemm.py') and `module` (an installed module, e.g. 'liger_kernel.ops.rms_norm'); "
                        f"got {'both' if 'source' in k else 'neither'}")
    if "module" in k:
        source_path = _installed_python(k["module"], where, recorded)
    else:
        source_path = _project_python(root, k["source"], where, "[kernel] source", "kernel sources")
    params = sources.function_params(source_path, k["entry"])
    if params is None:
        raise SpecError(f"{where}: [kernel] entry: no function {shown(k['entry'])} in "
                        f"{k.get('source') or source_path}; "
                        f"functions there: {', '.join(sources.function_names(source_path)) or 'none'}")

    signature = tuple(raw["signature"].items())
    adapter = _check_adapter(raw["adapter"], signature, k["toolchain"], where) if "adapter" in raw else ()
    if k["toolchain"] == "flydsl":
        _check_factory(signature, params, where, k["entry"], dict(dict(adapter).get("arguments", ())))
    else:
        names = [a for a, _ in signature]
        if names != list(params):
            extra, missing = [a for a in names if a not in params], [p for p in params if p not in names]
            first = (f"{shown(extra[0])} is no argument of it" if extra else f"{shown(missing[0])} is missing" if
                     missing else "the order differs")   # the one to fix, before the two lists (16 names each)
            raise SpecError(f"{where}: [signature] must list the arguments of {k['entry']} in order: {first}; "
                            f"got {shown(names)}, the source has {shown(list(params))}")
        _check_types(signature, where)
    constants = tuple(raw.get("constants", {}).items())
    # an argument of type "none" is passed as None: Triton compiles it as a constexpr None, the launch skips it
    nones = [a for a, t in signature if t == NONE]
    for a in nones:
        if k["toolchain"] != "triton":
            _fail(where, "signature", a, NONE, "types of a FlyDSL launcher's arguments ('none' is Triton's)")
        if a in dict(constants) or a in raw["sweep"]:
            raise SpecError(f"{where}: {a} is None (its [signature] type is 'none'); remove it from "
                            f"{'[constants]' if a in dict(constants) else '[sweep]'}")
    signature = tuple((a, "constexpr" if t == NONE else t) for a, t in signature)
    constants += tuple((a, None) for a in nones)
    constants = tuple((a, _typed_value(signature, a, v, where, "constants")) for a, v in constants)
    hints = tuple(raw.get("hints", {}).get("divisible_by_16", ()))
    runtime_args = {a for a, t in signature if t not in COMPILE_TIME}
    for i, h in enumerate(hints):
        if h not in runtime_args:
            _fail(where, "hints", "divisible_by_16", h, "runtime arguments: " + ", ".join(sorted(runtime_args)))
        if h in hints[:i]:   # it would be a key of its own for the same binary
            _fail(where, "hints", "divisible_by_16", h, "each argument once (this one is listed twice)")

    tune = _check_tune(raw["tune"], signature, k["toolchain"], root, where) if "tune" in raw else None
    env = _check_env(raw.get("env", {}), where)
    arch_tables, arch_env = _arch_env(raw.get("arch", {}), where)   # arch_env: (arch, ((name, value), ...))
    model = k.get("device_model", True) and k["toolchain"] == "triton"   # FlyDSL traces with CPU tensors
    if "setup" in k and not re.fullmatch(FUNCTION_REF, k["setup"]):
        _fail(where, "kernel", "setup", k["setup"], "a function as 'module:function', e.g. 'mylib_kforge:setup'")
    setup = (*project_setup(root), *([k["setup"]] if "setup" in k else []))   # the project's hooks, then its own
    swept, extras, derived, tuned, notes, chosen = raw["sweep"], raw.get("extra", []), (), (), (), None
    defaulted, unread = (), ()
    made = len(extras) if recorded else 0   # extras kforge made (a record's lines, the autotuner's configs): merged
    excludes = raw.get("exclude", [])
    if k["toolchain"] == "triton" and not recorded and entry_probe.is_wrapped(source_path, k["entry"]):
        sweep.check_values(where, signature, k["toolchain"], swept)
        module = k.get("module") or sources.module_name(source_path, root)
        probes = {a: entry_probe.Probe.of(root, **importing(a, merged_env(env, arch_env, a), model, setup))
                  for a in arch_names}
        chosen, elsewhere = entry_probe.describe_per_arch(probes, module, k["entry"], where, name)
        if chosen["autotune"]:
            chosen, elsewhere = _options_filled(chosen, elsewhere, signature, arch_names,
                                                f"{where}: {module}.{k['entry']}'s @triton.autotune configs")
        excludes = [*excludes, *({**c, "arch": archs} for c, archs in elsewhere)]   # configs of other archs
        derived = tuple(chosen["heuristics"])
        for d in derived:
            if d in swept or d in dict(constants):
                raise SpecError(f"{where}: {d} is computed by the entry's @triton.heuristics; to pin its value, give "
                                f"it in [override] instead of {'[sweep]' if d in swept else '[constants]'} (one value "
                                f"for the family, or a list: one config per value)")
    swept, constants = _with_overrides(raw.get("override", {}), derived, swept, constants, arch_tables,
                                       signature, where)
    if chosen is not None:
        if chosen["autotune"] is not None:
            clash = [n for n in chosen.get("around_tuner", ()) if n in chosen["autotune"][0]]
            if clash:   # Autotuner.run passes the config's value and the heuristic's both: a TypeError at launch
                raise SpecError(f"{where}: {module}.{k['entry']}: @triton.heuristics around @triton.autotune sets "
                                f"{clash[0]}, which the autotune configs set too: Triton fails at launch with both; "
                                f"put the heuristic under the autotuner, or drop {clash[0]} from one of them")
            listed_on = lambda c: [a for a in arch_names if not any(c == e and a in on for e, on in elsewhere)]
            swept, extras, made = _with_autotune(swept, extras, chosen["autotune"], where, f"{module}.{k['entry']}",
                                                 listed_on)
            tuned = tuple(chosen["autotune"][0])
        notes = _tuner_notes(chosen, hints, signature, where, f"{module}.{k['entry']}")
    if k["toolchain"] == "triton":   # a constexpr the spec gives no value takes its default in the source
        given = {*dict(constants), *swept, *derived}
        defaults = sources.function_defaults(source_path, k["entry"])
        defaulted = tuple(a for a, t in signature if t == "constexpr" and a in defaults and a not in given)
        constants += tuple((a, defaults[a]) for a in defaulted)
        unread = tuple((a, text) for a, text in sources.default_texts(source_path, k["entry"]).items()
                       if dict(signature).get(a) == "constexpr" and a not in defaults)
    per_arch = _check_per_arch(arch_tables, arch_names, signature, swept, k["toolchain"], where)
    if "id" in k and not k["id"].strip():
        raise SpecError(f"{where}: [kernel] id: {shown(k['id'], 60)} is empty; give a template such as "
                        f"'{{dtype}}-m{{BLOCK_M}}', or leave id out for the default (each swept name and value)")
    # `doit list` prints the description as it is: an escape sequence in it would drive the terminal
    description = k.get("description", "")
    if not description.isprintable() or len(description) > DESCRIPTION_MAX:
        raise SpecError(f"{where}: [kernel] description: not one line of text (a line break, a control character "
                        f"or over {DESCRIPTION_MAX} characters); give one short line")
    spec = Spec(path=where, name=name, source=k.get("source", ""), module=k.get("module", ""), entry=k["entry"],
                toolchain=k["toolchain"],
                archs=arch_names, id_template=k.get("id", ""), signature=signature, constants=constants,
                divisible_by_16=hints, configs=(), excludes=(), description=description, tune=tune,
                derived=derived, per_arch=per_arch, env=env, adapter=adapter, tuned=tuned, notes=notes,
                device_model=model, setup=setup, arch_env=arch_env, defaulted=defaulted, unread_defaults=unread,
                heuristics=None if recorded or k["toolchain"] != "triton" else derived,
                source_keys=tuple((a, tuple(keys)) for a, keys in sorted(codes.items())))
    return sweep.expand(spec, swept, extras, excludes, made, 0 if recorded else len(raw.get("exclude", [])))


def _typed_value(signature, key: str, value, where: str, table: str):
    """A value for a "dtype" or "function" argument in its checked form (declare/sweep.py checks swept ones)."""
    kind = dict(signature).get(key)
    return sweep.typed_value(kind, value, f"{where}: [{table}] {key}") if kind in VALUE_KINDS else value


ENV_NAME = re.compile(r"[A-Z_][A-Z0-9_]*")
# what kforge itself sets where it compiles, or what decides which code runs at all
# (XDG_CACHE_HOME: where kforge keeps its local cache and bytecode, as HOME decides it)
ENV_RESERVED = ("TRITON_CACHE_DIR", "TRITON_HOME", "FLYDSL_GPU_ARCH", "ARCH", "COMPILE_ONLY", "PATH", "HOME",
                "XDG_CACHE_HOME")
ENV_RESERVED_PREFIXES = ("LD_", "PYTHON", "KFORGE_")


def _check_env(table: dict, where: str, shown_as: str = "env") -> tuple:
    """[env]: NAME = "value" pairs set in the compile servers (and the probe) of this family: in its key."""
    for name, value in table.items():
        _check_env_name(name, where, shown_as)
        if not isinstance(value, str):
            raise SpecError(f"{where}: [{shown_as}] {name}: expected a string, got {shown(value)}")
        if "\0" in value:
            raise SpecError(f"{where}: [{shown_as}] {name}: a value may not hold a NUL character")
    return tuple(sorted(table.items()))


def _check_env_name(name: str, where: str, shown_as: str) -> None:
    if not ENV_NAME.fullmatch(name) or name in ENV_RESERVED or name.startswith(ENV_RESERVED_PREFIXES):
        raise SpecError(f"{where}: [{shown_as}] {_key(name)}: not a variable a family may set; allowed: an "
                        f"environment variable's name (upper-case letters, digits and _, not starting with a "
                        f"digit), not {', '.join(ENV_RESERVED)} nor "
                        f"{', '.join(p + '*' for p in ENV_RESERVED_PREFIXES)}")


def _arch_env(tables: dict, where: str) -> tuple[dict, tuple]:
    """[arch.<name>.env] split off the [arch.<name>] tables: (the tables without it, ((arch, env), ...))."""
    found, rest = [], {}
    for arch, body in tables.items():
        env = body.get("env") if isinstance(body, dict) else None
        if isinstance(env, dict):
            found.append((arch, _check_env(env, where, f"arch.{_key(arch)}.env")))
            body = {k: v for k, v in body.items() if k != "env"}
        rest[arch] = body
    return rest, tuple(found)


def _check_per_arch(tables: dict, archs: tuple, signature, swept: dict, toolchain: str, where: str) -> tuple:
    """[arch.<name>] tables: constexpr values and compile options for one arch, over [constants]."""
    constexprs = {a for a, t in signature if t in COMPILE_TIME}
    options = set(OPTIONS) if toolchain == "triton" else set()
    found = []
    for arch, body in tables.items():
        if arch not in archs:
            _fail(where, "arch", arch, "(a table)", "one of the spec's archs: " + ", ".join(archs))
        for key, value in body.items():
            if key not in constexprs and key not in options:
                raise SpecError(f"{where}: [arch.{arch}] {_key(key)}: not a constexpr or compile option of the "
                                f"entry; constexprs: {sorted(constexprs)}")
            if not isinstance(value, (int, float, bool, str)):
                raise SpecError(f"{where}: [arch.{arch}] {key}: expected one value (int, float, bool or string), "
                                f"got {shown(value)}")
            if key in swept:
                raise SpecError(f"{where}: [arch.{arch}] {key}: also in [sweep]; keep one (an [[exclude]] with "
                                f"arch drops swept values on one arch)")
            problem = value_problem(key, value) if key in options and key not in constexprs else None
            if problem:   # a value of 100,000 characters is shown short
                raise SpecError(f"{where}: [arch.{arch}] {key}: {problem.replace(repr(value), shown(value), 1)}")
        found.append((arch, tuple((key, _typed_value(signature, key, v, where, f"arch.{arch}"))
                                  for key, v in body.items())))
    return tuple(found)


def _options_filled(chosen: dict, elsewhere: list, signature: tuple, archs: tuple, said: str) -> tuple[dict, list]:
    """The autotune configs (and (config, archs not listing it)) with each Triton option that another config sets
    and one leaves unset at Triton's default, what Triton compiles that one with (mamba-ssm's maxnreg=None beside
    maxnreg=128; gemlite's AMD configs adding waves_per_eu). Configs equal once filled are one. Triton's launch
    refuses another vendor's option (an unknown keyword): with a pruner, a config setting one is no target on that
    vendor's archs (the pruner may drop it there); without one, every call fails there, and so does the family."""
    params = {a for a, _ in signature}
    listed = chosen["autotune"]
    unset = {o for c in listed for o in c if o in FILLED_OPTIONS and o not in params}
    absent = {_frozen(c): set(on) for c, on in elsewhere}
    runs_on: dict[tuple, tuple[dict, set]] = {}   # each filled config -> (it, the archs some config of it runs on)
    foreign: dict[str, str] = {}   # an arch -> an option of another vendor that a config listed there sets
    for c in listed:
        filled = {**c, **{o: FILLED_OPTIONS[o] for o in sorted(unset - set(c))}}
        runs = set()
        for a in (a for a in archs if a not in absent.get(_frozen(c), ())):
            other = [o for o in c if o in OPTIONS and o not in params
                     and OPTIONS[o].vendor not in (None, archs_mod.ARCHS[a].vendor)]
            if other:
                foreign.setdefault(a, other[0])
            else:
                runs.add(a)
        runs_on.setdefault(_frozen(filled), (filled, set()))[1].update(runs)
    for a, option in foreign.items():
        if "prune" not in chosen["tuner"] or not any(a in runs for _, runs in runs_on.values()):
            raise SpecError(f"{said} listed on {a} set {option}, an option of another vendor that Triton's launch "
                            f"refuses there (the kernel's every call on {a} fails): drop {a} from archs, or give "
                            f"that vendor a spec of its own")
    configs = [filled for filled, _ in runs_on.values()]
    return ({**chosen, "autotune": configs},
            [(filled, [a for a in archs if a not in runs]) for filled, runs in runs_on.values() if set(archs) - runs])


def _frozen(config: dict) -> tuple:
    return tuple(sorted(config.items()))


def _with_autotune(swept: dict, extras: list, configs: list[dict], where: str,
                   entry: str, listed_on=None) -> tuple[dict, list, int]:
    """The spec's sweep times the entry's own @triton.autotune configs (a list, not a product): the first joins
    the sweep, the rest become extras, one per combination of the spec's own swept values, before the spec's
    [[extra]] (their number is the third value: a config the library lists twice is one target); [[extra]] blocks
    giving the spec's own swept parameters alone are crossed with the configs too. listed_on: a config -> the
    archs whose autotuner lists it."""
    if not configs:
        raise SpecError(f"{where}: {entry}'s @triton.autotune lists no configs; give it at least one")
    keys = list(configs[0])
    for c in configs:
        if set(c) != set(keys):
            sides: dict[tuple, list] = {}   # each set of parameters -> the archs listing a config that sets it
            for d in configs:
                sides.setdefault(tuple(sorted(d)), []).extend(listed_on(d) if listed_on else ())
            archs = [list(dict.fromkeys(on)) for on in sides.values()]
            if listed_on and len({a for on in archs for a in on}) == sum(map(len, archs)):   # no arch on two sides
                raise SpecError(f"{where}: {entry}'s @triton.autotune configs set different parameters on different "
                                f"archs (" + "; ".join(f"{list(s)} on {', '.join(on)}" for s, on in zip(sides, archs))
                                + f"); kforge sweeps configs that set the same ones: give each side a spec of its "
                                  f"own, {_per_vendor(archs)}(" + " and ".join(f"archs = {json.dumps(on)}" for on in
                                                                              archs) + ")")
            raise SpecError(f"{where}: {entry}'s @triton.autotune configs set different parameters ({sorted(keys)} "
                            f"and {sorted(c)}); kforge sweeps configs that set the same ones")
    clash = [key for key in keys if key in swept]
    if clash:
        raise SpecError(f"{where}: [sweep] {clash[0]}: chosen by {entry}'s @triton.autotune configs; remove it "
                        f"from [sweep] (an [[exclude]] filters the autotune configs)")
    own = list(itertools.product(*swept.values()))
    grown = {**swept, **{key: [configs[0][key]] for key in keys}}
    added = [{**dict(zip(swept, combo)), **c} for c in configs[1:] for combo in own]
    pairings: dict[str, int] = {}   # [[extra]] blocks giving the spec's own values alone: each is built with every
    for i, e in enumerate(extras):   # autotune config, as the sweep is
        if set(e) == set(swept) and swept:
            same = pairings.setdefault(json.dumps(e, sort_keys=True), i)
            if same != i:
                raise SpecError(f"{where}: [[extra]] #{i + 1} {shown(e)}: the same as [[extra]] #{same + 1}; "
                                f"remove one")
            added += [{**e, **c} for c in configs]
    return grown, [*added, *(e for i, e in enumerate(extras) if i not in pairings.values())], len(added)


def _per_vendor(sides: list[list[str]]) -> str:
    """'one per vendor ' where each side's archs are one vendor's, a vendor of its own; else ''."""
    vendors = [{archs_mod.ARCHS[a].vendor for a in on} for on in sides]
    return "one per vendor " if all(len(v) == 1 for v in vendors) and len(set().union(*vendors)) == len(sides) else ""


def _tuner_notes(chosen: dict, hints: tuple, signature, where: str, entry: str) -> tuple[tuple[str, str], ...]:
    """What `doit info` says of the entry's autotuner and @triton.jit options; a 16-divisibility promise, or a
    value (an integer equal to 1 made a constexpr), for an argument Triton never specializes is refused."""
    unspecialized = chosen.get("unspecialized", {})
    for a, t in signature:
        if t == "constexpr" and unspecialized.get(a) == "do_not_specialize":
            raise SpecError(f"{where}: [signature] {a}: a constexpr, but {entry}'s @triton.jit(do_not_specialize=...) "
                            f"names it: Triton passes it as a runtime integer at every launch, equal to 1 or not, so "
                            f"no launch of the library's would match that binary; give its integer type (i32 or i64)")
    for h in hints:
        if h in unspecialized:
            raise SpecError(f"{where}: [hints] divisible_by_16: {h} is in {entry}'s @triton.jit("
                            f"{unspecialized[h]}=...): Triton never specializes it on 16-divisibility, so no launch "
                            f"of the library's would match that binary; remove {h} from divisible_by_16")
    notes = [(fact, str(value)) for fact, value in chosen.get("tuner", {}).items()]
    if unspecialized:
        notes.append(("unspecialized", ", ".join(f"{a} ({o})" for a, o in sorted(unspecialized.items()))))
    return tuple(notes)


def _with_overrides(table: dict, derived: tuple, swept: dict, constants: tuple, per_arch: dict, signature,
                    where: str) -> tuple[dict, tuple]:
    """[override]: values pinned in place of what the entry's @triton.heuristics compute (one reading the device
    cannot run on a build machine): one value is the family's, a list is swept."""
    for name, value in table.items():
        if name not in derived:
            computed = f"it computes {', '.join(derived)}" if derived else "it has none"
            raise SpecError(f"{where}: [override] {_key(name)}: not computed by the entry's @triton.heuristics "
                            f"({computed}); give a constexpr's value in [constants] or [sweep]")
        if value == []:
            raise SpecError(f"{where}: [override] {name}: empty list; give one value, or a list of values to sweep")
        if isinstance(value, list):
            swept = {**swept, name: value}
        else:
            constants += ((name, _typed_value(signature, name, value, where, "override")),)
    for arch, body in per_arch.items():
        for key in body if isinstance(body, dict) else ():
            if key in derived and key not in table:
                raise SpecError(f"{where}: [arch.{arch}] {key}: computed by the entry's @triton.heuristics; to pin "
                                f"it on {arch}, name it in [override] too (its value on the other archs)")
    return swept, constants


def _check_integers(raw: dict, where: str) -> None:
    """TOML integers are 64-bit, but tomllib reads longer ones (in hex): too long for Python to print in a
    message or an id (past 4,300 digits), and no kernel argument takes one. TOML's nan and inf (a record line
    refuses them) are no value a config is built for: NaN equals no launch's value, and JSON has neither."""
    for table, body in raw.items():
        for key, value in body.items() if isinstance(body, dict) else [(None, body)]:
            big = next((v for v in nested(value) if isinstance(v, int) and v not in INT64), None)
            if big is not None:
                raise SpecError(f"{where}: [{_key(table)}]{'' if key is None else ' ' + _key(key)}: got an integer "
                                f"of {big.bit_length()} bits; allowed: TOML's 64-bit integers, -2**63 .. 2**63-1")
            odd = next((v for v in nested(value) if isinstance(v, float) and not math.isfinite(v)), None)
            if odd is not None:
                raise SpecError(f"{where}: [{_key(table)}]{'' if key is None else ' ' + _key(key)}: got {odd}; "
                                f"allowed: a finite number")


def _key(key: str) -> str:
    """A key as a message shows it: as the spec may write it bare, else quoted (a key may hold anything)."""
    return key if BARE_KEY.fullmatch(key) and len(key) <= NAME_MAX else shown(key)


def _check_schema(raw: dict, where: str) -> None:
    for table in raw:
        if table not in SCHEMA:
            raise SpecError(f"{where}: unknown table [{_key(table)}]; allowed: {', '.join(SCHEMA)}")
    for table in REQUIRED_TABLES:
        if table not in raw:
            why = ("; add it: the values swept, one config each combination (empty where the entry's "
                   "@triton.autotune configs are all the configs)" if table == "sweep" else "")
            raise SpecError(f"{where}: missing table [{table}]{why}")
    for table, body in raw.items():
        if table in LIST_TABLES:
            if not isinstance(body, list) or not all(isinstance(b, dict) for b in body):
                raise SpecError(f"{where}: [[{table}]] must be an array of tables ([[{table}]] blocks)")
            for b in body:
                _check_keys(b, table, where)
        elif not isinstance(body, dict):
            raise SpecError(f"{where}: {table} must be a table [{table}], got {type(body).__name__}")
        else:
            _check_keys(body, table, where)


def _check_keys(body: dict, table: str, where: str) -> None:
    schema = SCHEMA[table]
    for key, value in body.items():
        rule = schema.get(key) or schema.get("*")
        if rule is None:
            raise SpecError(f"{where}: [{table}] unknown key {shown(key)}; allowed: {', '.join(schema)}")
        types, _, what = rule
        if table == "env":   # a variable's name, not an argument's: "" or "A=B" or a NUL is refused as such
            _check_env_name(key, where, table)
        elif "*" in schema and not (key.isidentifier() and len(key) <= NAME_MAX):   # used in code and messages
            raise SpecError(f"{where}: [{table}] {shown(key)}: not a name; allowed: the kernel's argument and "
                            f"parameter names (letters, digits and _, not starting with a digit; at most {NAME_MAX})")
        flat = not isinstance(value, list) or (table, key) in NESTED_LISTS or all(
            isinstance(v, (int, float, bool, str)) for v in value)
        if not isinstance(value, types) or not flat:
            raise SpecError(f"{where}: [{table}] {key}: expected {what}, got {shown(value)} "
                            f"({type(value).__name__})")
    for key, (_, required, what) in schema.items():
        if required and key != "*" and key not in body:
            raise SpecError(f"{where}: [{table}] missing key {key!r} ({what})")


def _check_tune(t: dict, signature, toolchain: str, root: Path, where: str) -> Tune:
    if toolchain != "triton":
        raise SpecError(f"{where}: [tune] needs toolchain 'triton': tuning launches the artifacts through "
                        f"kforge's runtime loader, which cannot launch {toolchain} artifacts yet")
    harness = _project_python(root, t["harness"], where, "[tune] harness", "tune harnesses")
    missing = [f for f in HARNESS_FUNCTIONS if sources.function_params(harness, f) is None]
    if missing:
        raise SpecError(f"{where}: [tune] harness: {t['harness']} must define {', '.join(HARNESS_FUNCTIONS)}; "
                        f"missing {', '.join(missing)}")
    int_args = [a for a, ty in signature if ty in ("i32", "i64", "u32", "u64")]
    args = t["shape_args"]
    for a in args:
        if a not in int_args:
            _fail(where, "tune", "shape_args", a, "integer runtime arguments: " + ", ".join(int_args))
    if not args or len(set(args)) != len(args):
        _fail(where, "tune", "shape_args", args, "a non-empty list of distinct integer arguments")
    if not t["shapes"]:
        _fail(where, "tune", "shapes", [], f"a non-empty list of shapes, each a list of {len(args)} sizes")
    seen = set()
    for shape in t["shapes"]:
        if (not isinstance(shape, list) or len(shape) != len(args)
                or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in shape)):
            _fail(where, "tune", "shapes", shape, f"a list of {len(args)} positive integers ({', '.join(args)})")
        if tuple(shape) in seen:
            _fail(where, "tune", "shapes", shape, "each shape once (this one is listed twice)")
        seen.add(tuple(shape))
    return Tune(harness=t["harness"], shape_args=tuple(args), shapes=tuple(tuple(s) for s in t["shapes"]))


RUN_TIME_MODULE = ("; a recorded kernel whose module no import finds may have been made at run time (generated code a "
                   "library loads from a file, as flag_gems's _gen_module_*): such a kernel cannot be built ahead, and "
                   "its calls compile under Triton's JIT (a strict serve names them): drop its lines")


def _installed_python(module: str, where: str, recorded: bool) -> Path:
    """The file of an installed module (found on sys.path, read, never imported, here)."""
    from kforge.load import installed
    try:
        path = installed.find(module).path
    except installed.NotInstalled as e:
        raise SpecError(f"{where}: [kernel] module: {e}{RUN_TIME_MODULE if recorded else ''}") from None
    try:
        sources.function_names(path)
    except (SyntaxError, ValueError, OSError) as e:
        raise SpecError(f"{where}: [kernel] module: {module} ({path}) is not Python kforge can read ({e}); "
                        f"reinstall the package") from None
    return path


def _project_python(root: Path, rel: str, where: str, key: str, what: str) -> Path:
    """root/rel, when it is a Python file of the project's own source (read, never imported, here)."""
    path = root / rel
    try:
        found = path.is_file()
    except OSError as e:   # a name too long for the file system, a directory that may not be searched
        raise SpecError(f"{where}: {key}: cannot look up {shown(rel)} ({e.strerror}); "
                        f"fix the path, relative to {root}") from None
    if not found:
        what_is_there = _not_a_python_file(path)
        raise SpecError(f"{where}: {key}: file {shown(rel)} {what_is_there} (looked for {shown(str(path))}); "
                        f"fix the path, relative to {root}")
    not_project = sources.project_source_problem(path, root)
    if not_project:
        hint = (" (a kernel of an installed package is named by `module = \"package.module\"`)"
                if key == "[kernel] source" else "")
        raise SpecError(f"{where}: {key}: {shown(rel)} is not the project's own source: {not_project}; "
                        f"keep {what} in the project's directories, e.g. kernels/{hint}")
    try:
        sources.function_names(path)   # parses it (and keeps the parse for the checks that follow)
    except SyntaxError as e:
        why = f"line {e.lineno}: {e.msg}" if e.lineno else e.msg
    except (ValueError, OSError) as e:   # null bytes; unreadable
        why = getattr(e, "strerror", None) or str(e)
    else:
        return path
    raise SpecError(f"{where}: {key}: {shown(rel)} is not Python kforge can read ({why}); fix the file, or the "
                    f"path (relative to {root})")


def _not_a_python_file(path: Path) -> str:
    """What lies at a path that is no regular file, for a message: a FIFO or a link to /dev/zero exists, and
    "does not exist" sent the user looking for a file that is there."""
    try:
        mode = path.stat().st_mode   # through a link, as a read would go
    except (OSError, ValueError):   # ValueError: a NUL in the path
        return "is a broken link" if path.is_symlink() else "does not exist"
    if stat.S_ISDIR(mode):
        return "is a folder, not a Python file"
    return f"is not a regular file ({not_a_file(mode)})"


# kforge's own tasks and doit's commands: a family's group task of that name would clash with them
RESERVED_NAMES = ("kernels", "package", "tune", "run", "list", "clean", "forget", "info", "help", "auto",
                  "dumpdb", "ignore", "strace", "tabcompletion", "prune", "cache")


def _check_name(name: str, where: str) -> str:
    # a folder under out/<arch>/ and the first part of every target name: a file system holds 255 bytes a name
    if not NAME_RE.match(name) or len(name) > NAME_MAX:
        _fail(where, "kernel", "name", name, f"lower_snake_case: a-z, 0-9, _ (starting with a letter), at most "
                                             f"{NAME_MAX} characters")
    if name in RESERVED_NAMES:
        raise SpecError(f"{where}: [kernel] name: {name!r} is the name of a kforge task or doit command "
                        f"({', '.join(RESERVED_NAMES)}); choose another, e.g. {name + '_kernel'!r}")
    return name


def listed_name(name, fallback: str) -> str:
    """The name a family that did not load is listed by: its own when it is a family name, else `fallback`."""
    return name if isinstance(name, str) and NAME_RE.match(name) and len(name) <= NAME_MAX else fallback


def _check_adapter(table: dict, signature, toolchain: str, where: str) -> tuple:
    """[adapter]: how to call a FlyDSL builder as a library writes it (its own argument and element type names,
    the launcher alone returned, which kforge traces with placeholders)."""
    if toolchain != "flydsl":
        raise SpecError(f"{where}: [adapter] is for toolchain 'flydsl' builders; a Triton entry needs none")
    runtime = {a: t for a, t in signature if t not in (*COMPILE_TIME, NONE)}
    compile_time = {a for a, t in signature if t == "constexpr"} | {
        v for _, t in signature for v in TYPE_VAR_RE.findall(t)}
    arguments, names = table.get("arguments", {}), table.get("dtype_names", {})
    shapes, scalars = table.get("shapes", {}), table.get("scalars", {})
    for p, name in arguments.items():
        if p not in compile_time or not isinstance(name, str) or not name.isidentifier():
            _fail(where, "adapter", "arguments", {p: name}, "a compile-time parameter of the spec mapped to an "
                  f"argument name of the builder; parameters: {sorted(compile_time)}")
    passed: dict[str, str] = {}   # the builder's argument name -> the parameter passed as it
    for p in sorted(compile_time):
        name = arguments.get(p, p)
        if name in passed:   # one of the two values would be lost in the call
            _fail(where, "adapter", "arguments", {p: name}, f"each builder argument once ({passed[name]!r} is "
                  f"passed as {shown(name, 60)} too)")
        passed[name] = p
    named: dict[str, str] = {}   # the builder's element type name -> kforge's
    for dtype, name in names.items():
        if canonical_arg_type(dtype) != dtype or not isinstance(name, str):
            _fail(where, "adapter", "dtype_names", {dtype: name}, f"element types ({allowed_dtypes()}) mapped to "
                  f"the builder's names (strings)")
        if name in named:   # both configs would build the same code, one of them under the other's type
            _fail(where, "adapter", "dtype_names", {dtype: name}, f"one element type per builder name "
                  f"({named[name]!r} is {shown(name, 60)} too)")
        named[name] = dtype
    tensors = [a for a, t in runtime.items() if t.startswith("*")]
    for a in runtime:
        if a in tensors:
            shape = shapes.get(a)
            if not isinstance(shape, list) or not shape or not all(
                    (type(x) is int and x > 0) or (isinstance(x, str) and x in compile_time) for x in shape):
                _fail(where, "adapter", "shapes", {a: shape}, f"for each tensor argument ({', '.join(tensors)}) "
                      f"a list of positive sizes or compile-time parameter names")
        elif a in shapes:
            _fail(where, "adapter", "shapes", {a: shapes[a]}, "shapes only for tensor (pointer) arguments")
    for a, v in scalars.items():
        if a not in runtime or runtime[a].startswith("*") or type(v) not in (int, float, bool):
            _fail(where, "adapter", "scalars", {a: v}, "scalar runtime arguments mapped to a number")
    unknown = set(shapes) - set(runtime)
    if unknown:
        _fail(where, "adapter", "shapes", sorted(unknown)[0], f"runtime arguments: {sorted(runtime)}")
    return tuple((key, tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in table[key].items()))
                 for key in ("arguments", "dtype_names", "shapes", "scalars") if key in table)


def _check_factory(signature, params, where, entry, arguments: dict) -> None:
    """A FlyDSL factory takes exactly the constexprs and type variables (+ arch), by their [adapter] names."""
    _check_types(signature, where)
    compile_time = {arguments.get(p, p) for p in {a for a, t in signature if t == "constexpr"} | {
        v for _, t in signature for v in TYPE_VAR_RE.findall(t)}}
    given = set(params) - {"arch"}
    if given != compile_time:
        raise SpecError(f"{where}: {entry}(...) must take the compile-time values as keyword parameters "
                        f"(the constexprs and type variables of [signature], optionally arch); it takes "
                        f"{sorted(params)}, the spec has {sorted(compile_time)}")


def _check_types(signature, where) -> None:
    for arg, t in signature:
        if t in (*COMPILE_TIME, NONE):
            continue
        element, *block = t.split("[", 1)   # type vars are checked per config later; block sizes too
        probe = TYPE_VAR_RE.sub("fp32", element) + "".join("[" + TYPE_VAR_RE.sub("16", b) for b in block)
        if t.lstrip().startswith(("(", "[")):   # a tuple argument (`x.stride()` passed whole, indexed in the kernel)
            raise SpecError(f"{where}: [signature] {arg}: got {shown(t)}: kforge does not build kernels taking a "
                            f"tuple argument; leave this kernel to Triton's JIT, or give the kernel one argument "
                            f"per element (docs/spec_format.md)")
        if canonical_arg_type(probe) is None:
            _fail(where, "signature", arg, t, "'constexpr', 'dtype', 'none', or a type such as '*bf16', 'i32', "
                  f"'fp32', '*{{dtype}}', 'tensordesc<{{dtype}}[64, 64]>'; element types: {allowed_dtypes()}")


def _fail(where: str, table: str, key: str, value, allowed: str):
    raise SpecError(f"{where}: [{table}] {key}: got {shown(value)}; allowed: {allowed}")
