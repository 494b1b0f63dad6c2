"""Specs -> Targets (rules/base/target.py): one per (kernel, config, arch), each with its action key and artifact
directory."""
from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from kforge.load import device_model
from kforge.plan import keys
from kforge.base.archs import ARCHS
from kforge.base.layout import Layout
from kforge.base.errors import SpecError
from kforge.declare.spec_model import TYPE_VAR_RE, Spec, shown_path
from kforge.declare.triton_options import FILLED_OPTIONS, OPTIONS, arch_problem, value_problem
from kforge.base.dtypes import canonical_arg_type
from kforge.declare.sweep import check_config_id, config_id, no_value, without_value
from kforge.base.target import Target
from kforge_runtime.schema import COMPILE_TIME


def build_targets(specs: list[Spec], root: Path, arch_filter: tuple[str, ...] | None,
                  read: set[Path] | None = None) -> list[Target]:
    """Every target of the specs for the archs (None: all), SpecError at the first family that fails. `read`
    collects the files the targets came from and those an import looked for in vain (the catalog stamps them)."""
    targets: list[Target] = []
    seen: dict[str, str] = {}
    for spec in specs:
        if spec.name in seen:
            raise SpecError(f"{spec.path}: kernel name {spec.name!r} is already used by {seen[spec.name]}; "
                            f"target names must be unique: rename one [kernel] name")
        try:
            targets += spec_targets(spec, root, arch_filter, read)
        except SpecError:
            raise
        except SyntaxError as e:   # a module the kernel imports (its own source was parsed when the spec loaded)
            name = shown_path(Path(e.filename), root)
            at = f"{name}:{e.lineno}" if e.lineno else name
            raise SpecError(f"{spec.path}: kernel {spec.name}: {at}, a module its source imports, is not Python "
                            f"kforge can read ({e.msg}); fix that file") from None
        except (OSError, ValueError) as e:   # its sources could not be read or named
            raise SpecError(f"{spec.path}: reading the sources of kernel {spec.name} failed: "
                            f"{type(e).__name__}: {e}".splitlines()[0]) from None
        seen[spec.name] = spec.path
    return targets


class _Shared(NamedTuple):
    """What every config of one (spec, arch) shares: computed once, not per target."""
    spec: Spec
    fields: dict      # the Target fields every config of it has
    key: str          # the digest of the shared payload, which each target's key hashes with its own values
    key_without_sources: str   # the same without the sources' digests
    signatures: dict  # type-variable values -> the resolved signature, made once each
    function_sources: Callable[[str], tuple]   # a "function" argument's "module:name" -> its sources' digests


def spec_targets(spec: Spec, root: Path, arch_filter: tuple[str, ...] | None,
                 read: set[Path] | None = None) -> list[Target]:
    from kforge.load import sources   # parses kernel sources: only where the catalog is computed, not loaded
    layout = Layout.of(root)
    distribution: tuple[str, str] = ("", "")
    if spec.module:   # an installed module: its closure within its package, and its distribution's version
        from kforge.load import installed
        found = installed.find(spec.module)
        source, module, closure, misses = found.path, spec.module, found.closure(), set(found.misses)
        digests, distribution = sources.digest_files(closure, found.base), found.distribution()
    else:
        source = (root / spec.source).resolve()
        misses = set()
        closure = sources.local_closure(source, root, misses)
        digests, module = sources.digest_files(closure, root), sources.module_name(source, root)
    if read is not None:   # the files the targets depend on, and those whose creation would change them
        read.update(closure, misses)
    env = keys.compiler_env()
    # the set-up hooks' sources are in every key: what they do shapes the import the compile sees
    setup = [(ref, _function_sources(ref, root, f"{spec.path}: [kernel] setup", read, {}, "a set-up function"))
             for ref in spec.setup]
    result = []
    for arch_name in spec.archs:
        if arch_filter is not None and arch_name not in arch_filter:
            continue
        versions = keys.fingerprint_for(spec.toolchain, arch_name, layout.tool_versions)
        # an [override] value is pinned (its rule never runs); an autotune config's is not: the heuristic overwrites it
        fixed = {**dict(spec.constants), **spec.on_arch(arch_name),
                 **dict.fromkeys(p for p in spec.configs.params if p not in spec.tuned or p not in spec.derived)}
        pinned = tuple(d for d in spec.derived if d in fixed)
        family_env = spec.env_on(arch_name)
        # hashed once per (spec, arch): each target's key hashes this digest with its own values
        payload = {
            "toolchain": spec.toolchain, "versions": versions, "arch": arch_name, "entry": spec.entry,
            "module": module, "sources": digests, "divisible_by_16": spec.divisible_by_16, "env": env,
            **({"family_env": family_env} if family_env else {}),
            **({"overrides": pinned} if pinned else {}),
            **({"device": device_model.row(arch_name)} if spec.device_model else {}),
            **({"setup": setup} if setup else {}),
            **({"distribution": distribution} if spec.module else {})}
        key = keys.action_key(payload)
        # without the sources' digests: an edit leaving the kernel's Triton digest as it was is cut off early
        key_without_sources = keys.action_key({**payload, "sources": None})
        # "tuned": its configs are the library's @triton.autotune list: one not fitting the arch is skipped, not failed
        notes = spec.notes + ((("overrides", ", ".join(pinned)),) if pinned else ()) + \
            ((("tuned", ", ".join(spec.tuned)),) if spec.tuned else ())
        fields = dict(kernel=spec.name, arch=arch_name, spec_path=spec.path, toolchain=spec.toolchain,
                      source=str(source), module=module, entry=spec.entry, divisible_by_16=spec.divisible_by_16,
                      source_digests=digests, toolchain_versions=versions, layout=layout, env=family_env, notes=notes,
                      device_model=spec.device_model, setup=spec.setup, heuristics=spec.heuristics,
                      # a value an [arch.<name>] table gives there is the spec's, not a default read
                      defaulted=tuple(a for a in spec.defaulted if a not in spec.on_arch(arch_name)),
                      recorded_code=dict(spec.source_keys).get(arch_name, ()))
        shared = _Shared(spec, fields, key, key_without_sources, {},
                         functools.partial(_function_sources, root=root, where=spec.path, read=read, seen={}))
        configs = spec.configs.on(arch_name)
        if spec.reads_args:   # the module's own code, asked in a child process (rules/load/entry_probe.py)
            from kforge.load.entry_probe import Probe
            probe = Probe.of(root, **spec.importing(arch_name))
            configs = list(configs)   # an iterator: listed before `added` counts it
            added = [{} for _ in configs]
            if "prune" in dict(spec.notes):   # the configs its autotuner would try, as it prunes them
                configs, added = _pruned(spec, arch_name, configs, probe, module)
            if len(pinned) < len(spec.derived):   # the entry's @triton.heuristics, on each config
                # as at a launch, they see what the pruned config adds (Autotuner.run passes its kwargs)
                given = [{**dict(spec.constants), **spec.on_arch(arch_name), **dict(c), **a}
                         for c, a in zip(configs, added)]
                pointers = [_pointer_types(spec, known) for known in given]
                derived = probe.heuristics(module, spec.entry, given, pointers, spec.path, pinned, spec.name)
                result += [_target(shared, c, {**a, **d}) for c, a, d in zip(configs, added, derived)]
                continue
            result += [_target(shared, c, a) for c, a in zip(configs, added)]
            continue
        result += [_target(shared, config) for config in configs]
    return result


def _pruned(spec: Spec, arch: str, configs: list, probe, module: str) -> tuple[list, list[dict]]:
    """The configs of one arch as the entry's autotuner prunes them (rules/load/entry_probe.py), per group that
    shares the spec's own values; what it keeps or rewrites are the targets, less the spec's [[exclude]]. Second:
    per config, the values the pruned config sets beyond the autotuned parameters (constexprs the spec leaves
    without value, options), carried as a heuristic's are: Triton's launch passes them with the config's."""
    groups: dict[tuple, list[dict]] = {}
    for c in configs:
        own = tuple((p, v) for p, v in c if p not in spec.tuned)
        groups.setdefault(own, []).append({p: v for p, v in c if p in spec.tuned})
    requests = []
    for own in groups:
        known = {**dict(spec.constants), **spec.on_arch(arch), **dict(own)}
        kinds = dict(spec.signature)
        requests.append({
            "configs": groups[own], "pointers": _pointer_types(spec, known),
            "args": {a: v for a, v in known.items() if a in kinds and kinds[a] not in COMPILE_TIME},
            "kwargs": {a: v for a, v in known.items() if kinds.get(a) in COMPILE_TIME and a not in spec.tuned}})
    kept = probe.prune(module, spec.entry, requests, spec.path, spec.name)
    tuner = f"the autotuner of {module}.{spec.entry}"
    given = {**{p: "[sweep]" for p in spec.configs.params if p not in spec.tuned},
             **{c: "[constants]" for c, _ in spec.constants if c not in spec.defaulted},
             **{c: f"[arch.{arch}]" for c in spec.on_arch(arch)}}
    unset = without_value(spec, spec.configs.params, arch)   # constexprs only the pruner may set
    found: dict[tuple, dict] = {}
    ids: dict[str, tuple] = {}
    for own, chosen in zip(groups, kept):
        for values in chosen:
            # options a config leaves unset come back unset (maxnreg=None): at Triton's default, as the spec has them
            values = {**{o: d for o, d in FILLED_OPTIONS.items() if o in spec.tuned and o not in values}, **values}
            if not set(spec.tuned) <= set(values):
                raise SpecError(f"{spec.path}: {tuner} pruned its configs into one that sets {sorted(values)}, not "
                                f"{sorted(spec.tuned)}; kforge sweeps configs that set the same parameters")
            # what it adds: a heuristic's value stands over it (Triton runs those after the autotuner)
            added = {p: v for p, v in values.items() if p not in spec.tuned and p not in spec.derived}
            for p, v in added.items():
                if p in given:   # the launch would pass it and the config would: Triton refuses the conflict
                    raise SpecError(f"{spec.path}: {tuner} prunes its configs into ones that set {p} (to {v!r}), which "
                                    f"the spec gives in {given[p]}; leave {p} out of the spec: a launch giving it "
                                    f"fails in Triton (\"Conflicting meta-parameters\"), the pruner sets it")
                if p not in spec.constexprs and p not in OPTIONS:
                    raise SpecError(f"{spec.path}: {tuner} pruned its configs into one that sets {p}, neither a "
                                    f"constexpr of {spec.entry} nor a compile option (Triton refuses that launch); "
                                    f"fix the pruner")
            merged = {**dict(own), **values}
            config = tuple((p, merged[p]) for p in spec.configs.params)
            if config in found or any(ex.matches(config, arch) for ex in spec.excludes):
                if config in found and found[config] != added:
                    raise SpecError(f"{spec.path}: {tuner} pruned its configs into two that differ only in what "
                                    f"it adds ({found[config]} and {added}, with {dict(config)}); kforge builds "
                                    f"one target per config: make the difference a swept parameter")
                continue
            # values the spec's sweep was never checked with: an option's, an id that must stay safe and unique
            for p, v in (*config, *added.items()):
                problem = value_problem(p, v) if p in OPTIONS and p not in spec.constexprs else None
                if problem:
                    raise SpecError(f"{spec.path}: the autotuner's pruner set {p}: {problem}")
            check_config_id(spec, config, ids, f"the autotuner's pruner on {arch}")
            missing = [c for c in unset if c not in added]
            if missing:
                raise SpecError(no_value(spec, missing[0], f", and the autotuner's pruner "
                                f"({dict(spec.notes)['prune']}) did not set it in config {config_id(spec, config)} "
                                f"on {arch}"))
            found[config] = added
    return list(found), list(found.values())


def _pointer_types(spec, known: dict) -> dict:
    """{pointer argument: its element type} with the config's type variables filled in (for heuristics)."""
    found = {}
    for a, t in spec.signature:
        if t.startswith("*"):
            canon = canonical_arg_type(TYPE_VAR_RE.sub(lambda m: str(known.get(m[1])), t))
            if canon is not None:
                found[a] = canon[1:]
    return found


def _function_sources(ref: str, root: Path, where: str, read: set | None, seen: dict,
                      what: str = "a @triton.jit function") -> tuple:
    """The digests of what a "function" argument's (or set-up hook's) module executes: a project module first
    (the project is first on the compile's path), else an installed one. `seen`: those resolved for the family."""
    from kforge.load import installed, sources
    if ref in seen:
        return seen[ref]
    fix = f"fix the reference ('module:function', {what})"
    module, name = ref.split(":")
    parts = module.split(".")
    candidates = (root.joinpath(*parts) / "__init__.py", root.joinpath(*parts).with_suffix(".py"))
    local = next((c for c in candidates if c.is_file()), None)
    if local is not None:
        misses: set[Path] = set()
        closure, base, path = sources.local_closure(local, root, misses), root.resolve(), local
    else:
        try:
            found = installed.find(module)
        except installed.NotInstalled as e:
            raise SpecError(f"{where}: function {ref}: {e}; {fix}") from None
        closure, base, path, misses = found.closure(), found.base, found.path, set(found.misses)
    if name not in sources.function_names(path):
        raise SpecError(f"{where}: function {ref}: {module} ({path}) defines no function {name}; {fix}")
    if read is not None:
        read.update(closure, misses, candidates)
    seen[ref] = sources.digest_files(tuple(closure), base)
    return seen[ref]


def _adapted(spec: Spec, signature: tuple, constexprs: tuple, known: dict) -> tuple[tuple, tuple]:
    """A FlyDSL [adapter]'s builder arguments (renamed, element types in the builder's names) and the
    placeholders its launcher is traced with (tensor shapes from sizes or this config's values)."""
    adapter = {table: dict(items) for table, items in spec.adapter}
    rename, names = adapter.get("arguments", {}), adapter.get("dtype_names", {})
    shapes, scalars = adapter.get("shapes", {}), adapter.get("scalars", {})
    arguments = tuple((rename.get(c, c), names.get(v, v) if c in spec.type_vars else v) for c, v in constexprs)
    placeholders = tuple(
        (a, t[1:], tuple(x if type(x) is int else known[x] for x in shapes[a])) if t.startswith("*") else
        (a, "scalar", scalars.get(a, 0))
        for a, t in signature if t not in COMPILE_TIME)
    return arguments, placeholders


def _target(shared: _Shared, config, derived: dict | None = None) -> Target:
    spec, arch = shared.spec, shared.fields["arch"]
    values = dict(config)
    known = {**dict(spec.constants), **spec.on_arch(arch), **values, **(derived or {})}   # derived: never pinned
    types = tuple(known.get(v) for v in spec.type_vars + spec.shape_vars)
    signature = shared.signatures.get(types)
    if signature is None:
        signature = tuple((a, t if t in COMPILE_TIME else
                           canonical_arg_type(TYPE_VAR_RE.sub(lambda m: str(known.get(m[1])), t)))
                          for a, t in spec.signature)
        for a, t in signature:
            if t is None:
                given = dict(spec.signature)[a]
                allowed = "a descriptor's block sizes are integers 1 to 65536; " if "tensordesc" in given else ""
                raise SpecError(f"{spec.path}: [signature] {a}: type {given!r} with config {values} is not a known "
                                f"type; {allowed}fix the values the spec gives")
        shared.signatures[types] = signature
    constexprs = tuple((c, known.get(c)) for c in spec.constexprs)
    placeholders = ()
    if spec.toolchain == "flydsl":   # the factory gets every compile-time value, element types included
        constexprs += tuple((v, values[v]) for v in spec.type_vars)
        if spec.adapter:
            constexprs, placeholders = _adapted(spec, signature, constexprs, known)
    # a constexpr named as an option (`num_warps: tl.constexpr`) is the option too: Triton's JIT compiles with
    # every keyword of the call as an option, the kernel's parameters' included
    # None is Triton's "not set" (a Config's maxnreg=None); another vendor's option at its default in an autotune
    # config is one the library's config left unset (declare/spec.py _options_filled): this vendor has no such option
    a = ARCHS[arch]
    options = tuple((o, known[o]) for o in OPTIONS if known.get(o) is not None and not (
        o in spec.tuned and o not in (derived or {}) and OPTIONS[o].vendor not in (None, a.vendor)
        and known[o] == FILLED_OPTIONS.get(o, object())))
    cid = config_id(spec, config)
    for o, v in options:
        problem = arch_problem(o, v, a.vendor, a.warp_size, a.target_arch)
        if problem:
            raise SpecError(f"{spec.path}: config {cid} for {arch}: {problem}; set it only where it applies "
                            f"(an [[exclude]] with arch = [\"{arch}\"], or a spec of its own for those archs)")
    functions = [(v, shared.function_sources(v)) for c, v in constexprs if (c, "function") in spec.signature]
    own = {"signature": signature, "options": options, "constexprs": [(c, type(v).__name__, v) for c, v in constexprs],
           **({"functions": functions} if functions else {}), **({"placeholders": placeholders} if placeholders else {})}
    key = keys.action_key({"shared": shared.key, **own})
    key_without_sources = keys.action_key({"shared": shared.key_without_sources, **own})
    fields = shared.fields
    if derived and set(derived) & set(fields["defaulted"]):   # a pruner's value, not the source's default
        fields = {**fields, "defaulted": tuple(a for a in fields["defaulted"] if a not in derived)}
    return Target(**fields, config_id=cid, signature=signature, constexprs=constexprs, options=options,
                  config=config, key=key, key_without_sources=key_without_sources, placeholders=placeholders)
