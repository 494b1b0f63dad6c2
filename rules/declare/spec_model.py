"""What a loaded spec is: the frozen Spec and Tune, its Configs (made on demand) and Excludes; spec.py (loading)
and sweep.py (sweeps, config ids) build on it."""
from __future__ import annotations

import itertools
import operator
import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property, reduce
from pathlib import Path

from kforge_runtime.schema import COMPILE_TIME

Scalar = int | float | bool | str
Config = tuple[tuple[str, Scalar], ...]   # (param, value) pairs in the sweep's key order

NAME_MAX = 100   # characters in an argument, parameter or type variable name (they go into every message)
TYPE_VAR_RE = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]{0,99})\}")   # at most NAME_MAX characters


def shown(value, limit: int = 200) -> str:
    """repr(value) for a message, cut short: a spec may hold a 50,000-value list or a 5,000-character path."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text):,} characters)"


def nested(value) -> Iterator:
    """value and every value in it, in lists, tuples and tables at any depth (iterative: no depth limit)."""
    todo = [value]
    while todo:
        v = todo.pop()
        yield v
        todo += v.values() if isinstance(v, dict) else v if isinstance(v, (list, tuple)) else ()


def shown_path(path: Path, root: Path) -> str:
    """A file as messages name it: relative to the project root when inside it."""
    try:
        return str(path.resolve().relative_to(root.resolve()))
    except ValueError:
        return str(path)


@dataclass(frozen=True)
class Exclude:
    """One [[exclude]]: it drops a config on an arch when each key it gives holds one of the values listed."""
    given: tuple[tuple[str, tuple[Scalar, ...]], ...]   # key -> values, canonical, as the spec gave them
    at: tuple[tuple[int, frozenset], ...]               # the swept keys: (position in a config, values)
    archs: frozenset | None                             # the arch values; None: every arch

    def matches(self, config: Config, arch: str) -> bool:   # config: values in the sweep's order (`at` indexes it)
        return (self.archs is None or arch in self.archs) and all(config[i][1] in vs for i, vs in self.at)


@dataclass(frozen=True)
class Configs:
    """A family's configs, made on demand: every combination of the swept values (in the order listed), then the
    extras outside it, less those excluded on every arch. Nothing is stored per config: a family may have 50,000."""
    params: tuple[str, ...]
    values: tuple[tuple[Scalar, ...], ...]   # per param: its distinct canonical values
    extras: tuple[Config, ...]               # the [[extra]] configs that are not combinations of `values`
    excludes: tuple[Exclude, ...]
    archs: tuple[str, ...]

    def __iter__(self) -> Iterator[Config]:
        return self.on(*self.archs)

    def on(self, *archs: str) -> Iterator[Config]:
        """The configs built for at least one of archs (for one arch: the configs of its targets), in order."""
        if not self.excludes:
            yield from (tuple(zip(self.params, combo)) for combo in itertools.product(*self.values))
            yield from self.extras
            return
        # Bit e of a mask: exclude e allows that value (or arch). A config is excluded on an arch when some
        # exclude allows each of its values and the arch: an AND per parameter, not a test per exclude, so
        # thousands of [[exclude]] blocks cost a 50,000-config family little more than a few do.
        every = (1 << len(self.excludes)) - 1
        free = [_bits(all(p != i for p, _ in ex.at) for ex in self.excludes) for i in range(len(self.params))]
        given: list[dict[Scalar, int]] = [{} for _ in self.params]   # per param: value -> the excludes listing it
        for e, ex in enumerate(self.excludes):
            for i, vs in ex.at:
                for v in vs:
                    given[i][v] = given[i].get(v, 0) | 1 << e
        on_arch = [_bits(ex.archs is None or arch in ex.archs for ex in self.excludes) for arch in archs]

        def kept(masks) -> bool:
            hit = reduce(operator.and_, masks, every)
            return not all(hit & bits for bits in on_arch)
        allowed = [[free[i] | given[i].get(v, 0) for v in vs] for i, vs in enumerate(self.values)]
        for combo in itertools.product(*(range(len(vs)) for vs in self.values)):
            if kept(map(list.__getitem__, allowed, combo)):
                yield tuple(zip(self.params, map(tuple.__getitem__, self.values, combo)))
        yield from (c for c in self.extras if kept(free[i] | given[i].get(v, 0) for i, (_, v) in enumerate(c)))

    def __len__(self) -> int:
        return sum(1 for _ in self)


def _bits(flags) -> int:   # bit e set when flag e is true
    return sum(1 << e for e, flag in enumerate(flags) if flag)


@dataclass(frozen=True)
class Tune:
    """[tune]: the problem shapes `doit tune` benchmarks the family's configs on, and how to make them."""
    harness: str                        # module file with problem(shape, types, device) and grid(shape, config)
    shape_args: tuple[str, ...]         # runtime integer arguments that make up a shape, e.g. (M, N, K)
    shapes: tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class Spec:
    path: str                       # the TOML file, as given (for messages)
    name: str                       # kernel family: doit task basename, out/<arch>/<name>/
    source: str                     # kernel source, relative to the project root ("" when `module` names it)
    entry: str                      # the @triton.jit function in it
    toolchain: str
    archs: tuple[str, ...]
    id_template: str
    signature: tuple[tuple[str, str], ...]   # (argument, type | "constexpr"); types may hold {type_var}
    constants: tuple[tuple[str, Scalar], ...]
    divisible_by_16: tuple[str, ...]
    configs: Configs                # sweep product + extras - excludes that match every arch
    excludes: tuple[Exclude, ...]
    description: str = ""
    tune: Tune | None = None
    module: str = ""                # an installed module holding the entry (rules/load/installed.py), instead of source
    derived: tuple[str, ...] = ()   # constexprs the entry's @triton.heuristics compute per config (load/entry_probe.py)
    per_arch: tuple[tuple[str, tuple[tuple[str, Scalar], ...]], ...] = ()   # [arch.<name>]: values for one arch
    env: tuple[tuple[str, str], ...] = ()   # [env]: set where the family compiles; in its key
    adapter: tuple = ()   # FlyDSL [adapter]: (table, ((key, value), ...)) for arguments, dtype_names, shapes, scalars
    tuned: tuple[str, ...] = ()   # the parameters the entry's @triton.autotune configs set (its pruner gets them)
    notes: tuple[tuple[str, str], ...] = ()   # the entry's autotuner and jit options, as doit info shows them
    device_model: bool = False   # the module is imported as the arch's reference GPU sees it (rules/load/device_model.py)
    setup: tuple[str, ...] = ()  # set-up hooks "module:function" run before the module is imported (catalog's first)
    arch_env: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = ()   # [arch.<name>.env]: over [env] there
    # what the compile checks against the imported entry (triton_backend.py): constexprs valued by the def's
    # defaults, the heuristics the load ran or pinned (None for a record: its values are as Triton launched them)
    defaulted: tuple[str, ...] = ()
    heuristics: tuple[str, ...] | None = None
    unread_defaults: tuple[tuple[str, str], ...] = ()   # constexprs whose default's text kforge does not read: said
    source_keys: tuple[tuple[str, tuple[str, ...]], ...] = ()   # a record's: (arch, the source keys its lines hold)

    @property
    def reads_args(self) -> bool:
        """Whether @triton.heuristics or a pruning autotuner read the launch's arguments (shape hints may be given)."""
        return bool(self.derived) or "prune" in dict(self.notes)

    def on_arch(self, arch: str) -> dict:
        """The [arch.<arch>] values (constexprs and options)."""
        return dict(next((values for a, values in self.per_arch if a == arch), ()))

    def env_on(self, arch: str) -> tuple[tuple[str, str], ...]:   # where the module is imported and compiled
        return merged_env(self.env, self.arch_env, arch)

    def importing(self, arch: str) -> dict:
        return importing(arch, self.env_on(arch), self.device_model, self.setup)

    # cached: rules/plan/targets.py and config ids ask once per config
    @cached_property
    def constexprs(self) -> tuple[str, ...]:
        return tuple(a for a, t in self.signature if t in COMPILE_TIME)

    @cached_property
    def type_vars(self) -> tuple[str, ...]:
        """The swept element types the signature names ({dtype}), not a tensor descriptor's block sizes."""
        return tuple(dict.fromkeys(v for _, t in self.signature for v in TYPE_VAR_RE.findall(t.split("[", 1)[0])))

    @cached_property
    def shape_vars(self) -> tuple[str, ...]:
        """The values a tensor descriptor's block shape names: tensordesc<{dtype}[1, {BLOCK_M}, {BLOCK_K}]>."""
        return tuple(dict.fromkeys(v for _, t in self.signature for v in TYPE_VAR_RE.findall(t.partition("[")[2])))


def merged_env(env: tuple, arch_env: tuple, arch: str) -> tuple[tuple[str, str], ...]:
    """[env] with [arch.<arch>.env] over it, sorted."""
    own = dict(next((e for a, e in arch_env if a == arch), ()))
    return tuple(sorted({**dict(env), **own}.items())) if own else env


def importing(arch: str, env: tuple, model: bool, setup: tuple[str, ...]) -> dict:
    """Probe.of's arguments for one arch: the environment, and the arch the process models and runs set-up
    hooks for (None where neither applies: one probe serves every arch)."""
    return {"env": env, "arch": arch if model or setup else None, "model": model, "setup": setup}
