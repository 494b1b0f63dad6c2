"""Sweep expansion and config ids: readable, stable, derived from values only."""
import itertools
import random
import re

import pytest

from kforge.declare.spec import SpecError, load_spec
from kforge.declare.sweep import config_id
from tests.support import kernel_text, make_project, spec_text


def load(tmp_path, text):
    root = make_project(tmp_path, specs={"s": text})
    return load_spec(root / "specs" / "s.toml", root)


def test_ids_are_readable_and_derived_from_values(tmp_path):
    spec = load(tmp_path, spec_text(dtypes=("fp16", "bf16"), blocks=(128, 256)))
    ids = [config_id(spec, c) for c in spec.configs]
    assert ids == ["fp16-b128-w4", "fp16-b256-w4", "bf16-b128-w4", "bf16-b256-w4"]


def test_ids_do_not_depend_on_order_of_other_configs(tmp_path):
    a = load(tmp_path, spec_text(blocks=(128, 256)))
    b = load(tmp_path, spec_text(blocks=(512, 256, 64)))
    ids_a = {dict(c)["BLOCK"]: config_id(a, c) for c in a.configs}
    ids_b = {dict(c)["BLOCK"]: config_id(b, c) for c in b.configs}
    assert ids_a[256] == ids_b[256] == "fp16-b256-w4"


def test_default_id_without_template(tmp_path):
    text = spec_text(blocks=(128,)).replace('id = "{dtype}-b{BLOCK}-w{num_warps}"\n', "")
    spec = load(tmp_path, text)
    assert [config_id(spec, c) for c in spec.configs] == ["fp16-block128-num_warps4"]


def test_extra_and_exclude(tmp_path):
    text = spec_text(blocks=(128, 256)) + (
        '\n[[extra]]\ndtype = "bf16"\nBLOCK = 1024\nnum_warps = 8\n'
        '\n[[exclude]]\nBLOCK = [256, 512]\n')
    spec = load(tmp_path, text)
    assert [config_id(spec, c) for c in spec.configs] == ["fp16-b128-w4", "bf16-b1024-w8"]


EXTRA = '\n[[extra]]\ndtype = "{dtype}"\nBLOCK = {block}\nnum_warps = 4\n'


@pytest.mark.parametrize("edit, message", [
    (("BLOCK = [128, 256]", "BLOCK = [128, 256, 128]"),
     r"\[sweep\] BLOCK: got 128; allowed: each value once \(this one is listed twice\)$"),
    (("num_warps = [4]", "num_warps = [4, 8, 4]"), r"\[sweep\] num_warps: got 4; allowed: each value once"),
    (('dtype = ["fp16"]', 'dtype = ["bf16", "fp16", "bfloat16"]'),   # one dtype after normalisation
     r"\[sweep\] dtype: got 'bfloat16'; allowed: each value once \('bfloat16' is 'bf16', as 'bf16' listed before "
     r"it\)$"),
    (('dtype = ["fp16"]', 'dtype = ["torch.float16", "float16"]'),
     r"\[sweep\] dtype: got 'float16'; allowed: each value once \('float16' is 'fp16', as 'torch.float16'"),
    (("BLOCK = [128, 256]", "BLOCK = [1e-5, 0.00001]"), r"\[sweep\] BLOCK: got 1e-05; allowed: each value once"),
    (("", EXTRA.format(dtype="fp16", block=128)),   # the sweep makes it already
     r"\[\[extra\]\] #1 \{'dtype': 'fp16', 'BLOCK': 128, 'num_warps': 4\}: already a config of \[sweep\]; remove "
     r"it \(an \[\[extra\]\] adds a config the sweep does not make\)$"),
    (("", EXTRA.format(dtype="float16", block=256)), r"\[\[extra\]\] #1 \{'dtype': 'fp16', 'BLOCK': 256, "
                                                     r"'num_warps': 4\}: already a config of \[sweep\]"),
    (("", EXTRA.format(dtype="bf16", block=64) * 2 ),
     r"\[\[extra\]\] #2 \{'dtype': 'bf16', 'BLOCK': 64, 'num_warps': 4\}: the same config as \[\[extra\]\] #1; "
     r"remove one$"),
    (("", EXTRA.format(dtype="bf16", block=64) + EXTRA.format(dtype="bf16", block=32)
      + EXTRA.format(dtype="bfloat16", block=64)), r"\[\[extra\]\] #3 .*: the same config as \[\[extra\]\] #1"),
    (("", "\n[[exclude]]\nBLOCK = [256, 256]\n"),
     r"\[\[exclude\]\] #1 BLOCK: got 256; allowed: each value once \(this one is listed twice\)$"),
    (("", '\n[[exclude]]\narch = ["sm_90a", "sm_90a"]\nBLOCK = 256\n'),
     r"\[\[exclude\]\] #1 arch: got 'sm_90a'; allowed: each value once"),
    (("", "\n[[exclude]]\nBLOCK = 256\nnum_warps = 4\n\n[[exclude]]\nnum_warps = [4]\nBLOCK = 256\n"),
     r"\[\[exclude\]\] #2 \{'num_warps': \(4,\), 'BLOCK': \(256,\)\}: the same as \[\[exclude\]\] #1; remove one$"),
])
def test_a_value_or_config_the_spec_gives_twice_is_refused_naming_it(tmp_path, edit, message):
    """A value listed twice (equal once made canonical), an [[extra]] the sweep or an earlier [[extra]] makes, an
    [[exclude]] given twice: each would be the same targets again, and was merged without a word."""
    old, new = edit
    text = spec_text(blocks=(128, 256))
    assert old in text
    text = text.replace(old, new, 1) if old else text + new
    with pytest.raises(SpecError, match=r"^specs/s.toml: " + message):
        load(tmp_path, text)


def test_configs_made_canonical_stay_distinct_where_triton_compiles_two(tmp_path):
    """What stays accepted: an [[extra]] whose value is a swept one of another type (128.0 after 128: two compiles
    to Triton), though the values of one [sweep] list are of one type."""
    spec = load(tmp_path, spec_text(blocks=(128, 256)) + EXTRA.format(dtype="fp16", block="128.0"))
    assert [config_id(spec, c) for c in spec.configs][-1] == "fp16-b128.0-w4"


def test_arch_specific_exclude_keeps_config_for_other_archs(tmp_path):
    from kforge.plan.targets import spec_targets
    text = spec_text(archs=("sm_90a", "gfx942"), blocks=(128, 256)) + '\n[[exclude]]\narch = "gfx942"\nBLOCK = 256\n'
    root = make_project(tmp_path, specs={"s": text})
    spec = load_spec(root / "specs" / "s.toml", root)
    names = sorted(t.name for t in spec_targets(spec, root, None))
    assert names == ["scale:fp16-b128-w4@gfx942", "scale:fp16-b128-w4@sm_90a", "scale:fp16-b256-w4@sm_90a"]


@pytest.mark.parametrize("value", ["../../../../escape", "a b", "x@y", "k:v", ".hidden", "-dash", "a/b", "x" * 300])
def test_a_config_id_that_is_not_a_safe_name_is_refused_at_load(tmp_path, value):
    """Config ids become directories under out/ and part of <kernel>:<id>@<arch>."""
    text = spec_text(blocks=(value,)).replace('id = "{dtype}-b{BLOCK}-w{num_warps}"', 'id = "{BLOCK}"')
    with pytest.raises(SpecError, match=r"specs/s.toml: config .* from \[sweep\] gets the id .* not a safe name"):
        load(tmp_path, text)


def test_values_of_mixed_types_in_one_sweep_list_are_refused_at_load(tmp_path):
    text = spec_text(blocks=(256,)).replace("BLOCK = [256]", 'BLOCK = ["1024", 1024.5, true]')
    assert 'BLOCK = ["1024", 1024.5, true]' in text
    with pytest.raises(SpecError, match=r"specs/s.toml: \[sweep\] BLOCK: values of mixed types \(bool, float, str\)"):
        load(tmp_path, text)


def test_a_huge_sweep_is_refused_before_it_is_expanded(tmp_path, monkeypatch):
    import time
    text = spec_text(blocks=tuple(range(16, 16 * 2001, 16))).replace(
        "num_warps = [4]", "num_warps = [1, 2, 4, 8, 16]\nnum_stages = [1, 2, 3, 4, 5, 6, 7, 8]")
    start = time.monotonic()
    with pytest.raises(SpecError, match=r"specs/s.toml: \[sweep\] gives 80,000 configs \(1 dtype x 2000 BLOCK x "
                                        r"5 num_warps x 8 num_stages\), more than the 50,000 one family may have"):
        load(tmp_path / "a", text)
    assert time.monotonic() - start < 5   # refused without expanding two million configs
    monkeypatch.setenv("KFORGE_MAX_CONFIGS", "3")
    with pytest.raises(SpecError, match=r"gives 4 configs .* more than the 3 one family may have"):
        load(tmp_path / "b", spec_text(blocks=(16, 32, 64, 128)))
    assert len(load(tmp_path / "c", spec_text(blocks=(16, 32, 64))).configs) == 3
    extras = "".join(f'\n[[extra]]\ndtype = "fp16"\nBLOCK = {b}\nnum_warps = 4\n' for b in (1024, 2048))
    with pytest.raises(SpecError, match=r"gives 4 configs \(1 dtype x 2 BLOCK x 1 num_warps \+ 2 \[\[extra\]\]\)"):
        load(tmp_path / "d", spec_text(blocks=(16, 32)) + extras)


def test_a_50000_config_family_is_checked_per_value_not_per_config(tmp_path, monkeypatch):
    """Loading formats no config id and tries no config against the excludes one by one (they are checked per
    value): configs are made when iterated (rules/plan/targets.py does), so a family's size costs nothing to load."""
    from kforge.declare import sweep
    from kforge.declare.spec_model import Exclude
    text = spec_text(blocks=tuple(range(16, 16 * 2001, 16))).replace(
        "num_warps = [4]", "num_warps = [1, 2, 4, 8, 16]\nnum_stages = [1, 2, 3, 4, 5]").replace(
        '"{dtype}-b{BLOCK}-w{num_warps}"', '"{dtype}-b{BLOCK}-w{num_warps}s{num_stages}"')
    text += "\n[[exclude]]\nBLOCK = 16\nnum_warps = 1\n"
    calls = {"config_id": 0, "matches": 0}

    def counted(name, real):
        def call(*args):
            calls[name] += 1
            return real(*args)
        return call
    monkeypatch.setattr(sweep, "config_id", counted("config_id", sweep.config_id))
    monkeypatch.setattr(Exclude, "matches", counted("matches", Exclude.matches))
    spec = load(tmp_path, text)
    assert calls == {"config_id": 0, "matches": 0}
    monkeypatch.undo()
    ids = [config_id(spec, c) for c in spec.configs]
    assert len(spec.configs) == len(set(ids)) == 50_000 - 5
    assert ids[:2] == ["fp16-b16-w2s1", "fp16-b16-w2s2"] and ids[-1] == "fp16-b32000-w16s5"


TAGGED_KERNEL = kernel_text().replace("BLOCK: tl.constexpr):", "BLOCK: tl.constexpr, TAG: tl.constexpr):")


@pytest.mark.parametrize("template, sweep, extra", [
    ("{BLOCK}{TAG}", 'BLOCK = ["a", "ab"]\nTAG = ["bc", "c"]', ""),         # 'a' 'bc' and 'ab' 'c'
    ("{TAG}-{BLOCK}", 'BLOCK = ["1", "1-1"]\nTAG = ["a", "a-1"]', ""),      # 'a' '-' '1-1' and 'a-1' '-' '1'
    ("{TAG}-{BLOCK}", 'BLOCK = [1, 2]\nTAG = ["a"]', 'BLOCK = "1"\nTAG = "a"'),   # 1 and "1" are spelled alike
])
def test_configs_that_share_an_id_are_refused_however_the_id_is_built(tmp_path, template, sweep, extra):
    text = spec_text().replace('"{dtype}-b{BLOCK}-w{num_warps}"', f'"{template}"').replace(
        'BLOCK = "constexpr"', 'BLOCK = "constexpr"\nTAG = "constexpr"').replace("BLOCK = [256]", sweep)
    text += f"\n[[extra]]\ndtype = \"fp16\"\nnum_warps = 4\n{extra}\n" if extra else ""
    root = make_project(tmp_path, specs={"s": text}, kernels={"scale": TAGGED_KERNEL})
    with pytest.raises(SpecError, match=r"specs/s.toml: configs .* and .* both get id '[^']*'; add the differing"):
        load_spec(root / "specs" / "s.toml", root)


def test_a_family_with_nothing_swept_is_one_config(tmp_path):
    text = spec_text(archs=("sm_90a", "gfx942")).replace('"*{dtype}"', '"*fp16"').replace(
        '"{dtype}-b{BLOCK}-w{num_warps}"', '"one"').split("[sweep]")[0] + "[constants]\nBLOCK = 256\n\n[sweep]\n"
    spec = load(tmp_path, text + '\n[[exclude]]\narch = "gfx942"\n')
    assert list(spec.configs) == [()] and list(spec.configs.on("gfx942")) == [] and config_id(spec, ()) == "one"


def test_hundreds_of_excludes_cost_a_big_family_little(tmp_path):
    """500 [[exclude]] blocks on 50,000 configs took 25 s to load when each config was tried against each."""
    import time
    blocks = list(range(16, 16 * 2001, 16))
    text = spec_text(blocks=tuple(blocks)).replace(
        "num_warps = [4]", "num_warps = [1, 2, 4, 8, 16]\nnum_stages = [1, 2, 3, 4, 5]").replace(
        '"{dtype}-b{BLOCK}-w{num_warps}"', '"{dtype}-b{BLOCK}-w{num_warps}s{num_stages}"')
    text += "".join(f"\n[[exclude]]\nBLOCK = [{blocks[2 * i]}, {blocks[2 * i + 1]}]\n" for i in range(500))
    start = time.monotonic()
    spec = load(tmp_path, text)
    assert len(spec.configs) == 25 * 1000 and len(list(spec.configs.on("sm_90a"))) == 25 * 1000
    assert time.monotonic() - start < 5


# --- configs and ids against a plain reading of the spec: every combination, checked one by one ---------

def reference(sweep: dict, extras: list[dict], excludes: list[dict], archs: list[str], template: str):
    """(kept configs, their ids) or the start of the error loading must give: what the spec says, computed the
    slow, obvious way."""
    def exact(v):   # 1, 1.0 and true are three values (three compiles to Triton)
        return type(v), v
    for p, vs in sweep.items():   # what the spec gives twice is refused, in the order it is read
        if len({exact(v) for v in vs}) < len(vs):
            return f"[sweep] {p}: got "
    product = {tuple(map(exact, combo)) for combo in itertools.product(*sweep.values())}
    given = [tuple(exact(extra[p]) for p in sweep) for extra in extras]
    for i, key in enumerate(given):
        if key in given[:i] or key in product:
            return f"[[extra]] #{i + 1} "
    blocks = [{k: frozenset(map(exact, v if isinstance(v, list) else [v])) for k, v in ex.items()} for ex in excludes]
    for i, block in enumerate(blocks):
        if block in blocks[:i]:
            return f"[[exclude]] #{i + 1} "
    configs = ([tuple(zip(sweep, combo)) for combo in itertools.product(*sweep.values())]
               + [tuple((p, extra[p]) for p in sweep) for extra in extras])

    def dropped(ex, config, arch):
        values = dict(config, arch=arch)
        return all(values[k] in (v if isinstance(v, list) else [v]) for k, v in ex.items())
    for i, ex in enumerate(excludes):
        if not any(dropped(ex, c, a) for c in configs for a in archs):
            return f"[[exclude]] #{i + 1}"
    kept = [c for c in configs if not all(any(dropped(ex, c, a) for ex in excludes) for a in archs)]
    if not kept:
        return "the sweep is empty"
    def spell(v):
        return str(v).lower() if isinstance(v, bool) else str(v)
    ids = [template.format(**{p: spell(v) for p, v in c}) if template
           else "-".join(spell(v) if p == "dtype" else f"{p.lower()}{spell(v)}" for p, v in c) for c in kept]
    for i, cid in enumerate(ids):
        if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.+-]{0,199}", cid):
            return "config {"   # ... from [sweep] gets the id ...
        if cid in ids[:i]:
            return "configs {"
    return kept, ids


def random_spec(rng: random.Random):
    """A sweep of dtype, BLOCK, TAG and num_warps, with extras, excludes and an id template, drawn to make ids
    that are often unsafe or equal: BLOCK's values are of one type, TAG's are strings such as '', 'a-', '1'."""
    kind = rng.choice(["int", "str", "float", "bool"])
    pools = {"int": [-1, 0, 1, 2, 12, 21, 128], "str": ["", "a", "a-", "-a", "1", "1.2", "ab", "b", "a b", "x" * 199],
             "float": [0.5, 1.0, 1e-05, 2.5], "bool": [True, False]}
    pool = pools[kind] + pools["str"] * (kind != "str")
    sweep = {"dtype": rng.sample(["fp16", "bf16", "fp32"], rng.randint(1, 3)),
             "BLOCK": [rng.choice(pools[kind]) for _ in range(rng.randint(1, 4))],
             "TAG": [rng.choice(pools["str"]) for _ in range(rng.randint(1, 3))],
             "num_warps": rng.sample([1, 2, 4, 8, 16], rng.randint(1, 2))}
    # an extra may give BLOCK a value of another type: 1 and "1" are two configs of one id
    extras = [{p: rng.choice(vs + [rng.choice(pool)] * (p == "BLOCK")) for p, vs in sweep.items()}
              for _ in range(rng.choice([0, 0, 1, 2]))]
    archs = rng.choice([["sm_90a"], ["sm_90a", "gfx942"]])
    excludes = []
    for _ in range(rng.choice([0, 0, 1, 2])):
        keys = rng.sample(["dtype", "BLOCK", "TAG", "num_warps", "arch"], rng.randint(1, 2))
        values = dict(sweep, arch=["sm_90a", "gfx942"])
        excludes.append({k: rng.choice(values[k]) if rng.random() < 0.5 else [rng.choice(values[k])] for k in keys})
    fields = [rng.choice(["dtype", "BLOCK", "TAG", "num_warps"]) for _ in range(rng.randint(0, 4))]
    template = "".join(rng.choice(["", "", "-", ".", "b", "x1"]) + "{" + f + "}" for f in fields) if fields else ""
    return sweep, extras, excludes, archs, template


def toml_list(values) -> str:
    return "[" + ", ".join(toml_value(v) for v in values) + "]"


def toml_value(v) -> str:
    if isinstance(v, list):
        return toml_list(v)
    if isinstance(v, str):
        return f'"{v}"'
    return str(v).lower() if isinstance(v, bool) else repr(v)


def test_configs_and_ids_are_those_of_a_config_by_config_reading(tmp_path):
    """Per-value checks must agree with checking every config: the same configs in the same order, the same
    ids, and a refusal exactly when some config's id is unsafe or shared, or the spec gives a value, a config or an
    exclude twice (300 random sweeps, fixed seed)."""
    rng = random.Random(2026)
    root = make_project(tmp_path, specs={}, kernels={"scale": TAGGED_KERNEL})
    for case in range(300):
        sweep, extras, excludes, archs, template = random_spec(rng)
        text = spec_text(archs=tuple(archs)).split("[sweep]")[0].replace(
            'id = "{dtype}-b{BLOCK}-w{num_warps}"', f'id = "{template}"' if template else "").replace(
            'BLOCK = "constexpr"', 'BLOCK = "constexpr"\nTAG = "constexpr"')
        text += "[sweep]\n" + "".join(f"{p} = {toml_list(vs)}\n" for p, vs in sweep.items())
        text += "".join("\n[[extra]]\n" + "".join(f"{p} = {toml_value(v)}\n" for p, v in e.items()) for e in extras)
        text += "".join("\n[[exclude]]\n" + "".join(f"{p} = {toml_value(v)}\n" for p, v in e.items()) for e in excludes)
        (root / "specs" / "s.toml").write_text(text)
        expected = reference(sweep, extras, excludes, archs, template)
        try:
            spec = load_spec(root / "specs" / "s.toml", root)
        except SpecError as e:
            assert isinstance(expected, str) and str(e).startswith(f"specs/s.toml: {expected}"), (case, text, str(e))
            continue
        assert not isinstance(expected, str), (case, text, expected)
        assert (list(spec.configs), [config_id(spec, c) for c in spec.configs]) == expected, (case, text)
        assert len(spec.configs) == len(expected[0])


def test_a_compile_option_under_constants_is_refused_naming_where_it_belongs(tmp_path):
    text = spec_text().replace("num_warps = [4]", "").replace("-w{num_warps}", "").split("[sweep]")
    text = text[0] + "[constants]\nnum_warps = 8\n\n[sweep]" + text[1]
    root = make_project(tmp_path, specs={"s": text})
    with pytest.raises(SpecError, match=r"\[constants\] num_warps: num_warps is a compile option, not a constexpr of "
                                        r"scale_kernel; set it in \[sweep\] \(`num_warps = \[8\]`\)"):
        load_spec(root / "specs" / "s.toml", root)


def test_an_extra_that_differs_from_a_swept_config_only_in_a_values_type_is_a_config_of_its_own(tmp_path):
    # 128 and 128.0 are equal to Python but two compiles to Triton: neither may stand in for the other
    text = spec_text(blocks=(128,)) + '\n[[extra]]\ndtype = "fp16"\nBLOCK = 128.0\nnum_warps = 4\n'
    spec = load(tmp_path, text)
    assert [(config_id(spec, c), type(dict(c)["BLOCK"])) for c in spec.configs] == [
        ("fp16-b128-w4", int), ("fp16-b128.0-w4", float)]


def test_configs_sharing_an_id_are_shown_by_what_tells_them_apart(tmp_path):
    """Two configs of many long values cut short at the same place read alike: the message showed neither's
    differing value (an outside review on xformers: 669 characters each, the same prefix). Now it shows the
    values that differ, and how many are alike."""
    text = spec_text().replace('"{dtype}-b{BLOCK}-w{num_warps}"', '"{dtype}"').replace(
        'BLOCK = "constexpr"', 'BLOCK = "constexpr"\nTAG = "constexpr"').replace(
        "BLOCK = [256]", "BLOCK = [256, 512]\nTAG = [\"" + "x" * 300 + "\"]")
    root = make_project(tmp_path, specs={"s": text}, kernels={"scale": TAGGED_KERNEL})
    with pytest.raises(SpecError) as e:
        load_spec(root / "specs" / "s.toml", root)
    said = str(e.value)
    assert "configs {'BLOCK': 256} and {'BLOCK': 512} (the rest of each alike: 3 values) from [sweep] both get id" \
        in said and "xxxx" not in said, said


HEURISTIC_KERNEL = '''
import triton
import triton.language as tl


@triton.heuristics({"BLOCK": lambda args: 64})
@triton.jit
def h_kernel(x_ptr, y_ptr, n, s, D: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + i, tl.load(x_ptr + i, mask=i < n) * s, mask=i < n)
'''


@pytest.mark.parametrize("constants, said", [
    ("n = 'big'", "[constants] n: a shape hint for a i32 argument must be an integer, got 'big'"),
    ("s = 'big'", "[constants] s: a shape hint for a fp32 argument must be a number, got 'big'"),
    ("D = 'fp17'", "[constants] D: got 'fp17'; a 'dtype' argument takes an element type: fp64, fp32, "),
])
def test_a_shape_hint_or_dtype_constant_of_the_wrong_kind_is_one_line(tmp_path, constants, said):
    """sweep.py 158, 198 and 217 (a [constants] shape hint that is no number for an entry whose heuristics read the
    arguments; a 'dtype' argument given no element type): reachable from a spec, never run in the whole suite's
    coverage."""
    text = spec_text().replace("scale_kernel", "h_kernel").replace('n = "i32"', 'n = "i32"\ns = "fp32"\nD = "dtype"')
    text = text.replace('id = "{dtype}-b{BLOCK}-w{num_warps}"\n', "").split("BLOCK = [")[0]
    given = constants if constants.startswith("D ") else f"D = 'fp16'\n{constants}"
    root = make_project(tmp_path, specs={"s": text + f"\n[constants]\n{given}\n"},
                        kernels={"scale": HEURISTIC_KERNEL})
    with pytest.raises(SpecError) as e:
        load_spec(root / "specs" / "s.toml", root)
    assert str(e.value).startswith(f"specs/s.toml: {said}") and "\n" not in str(e.value), str(e.value)


def test_one_name_in_constants_and_in_sweep_is_one_line(tmp_path):
    """sweep.py 171: reachable from a spec, never run in the whole suite's coverage."""
    with pytest.raises(SpecError) as e:
        load(tmp_path, spec_text().replace("[sweep]", "[constants]\nBLOCK = 64\n\n[sweep]"))
    assert str(e.value) == "specs/s.toml: BLOCK is both in [constants] and in [sweep]; keep one"


def test_a_constexpr_without_value_waits_for_the_pruner_only_where_the_autotuner_prunes(tmp_path):
    """gemlite's pruners add NUM_STAGES to the configs they return: a constexpr the spec leaves without value is
    refused at load unless the entry's autotuner prunes (its notes carry "prune"), whose configs may set it
    (rules/plan/targets.py checks each pruned config)."""
    import dataclasses
    from kforge.declare.sweep import _check_params
    spec = load(tmp_path, spec_text())
    spec = dataclasses.replace(spec, signature=spec.signature + (("NS", "constexpr"),))
    with pytest.raises(SpecError, match=r"^specs/s.toml: constexpr NS has no value; add it to \[constants\] or "):
        _check_params(spec, spec.configs.params)
    _check_params(dataclasses.replace(spec, notes=(("prune", "tk.scale.prune"),)), spec.configs.params)


FLAG_KERNEL = '''
import triton
import triton.language as tl


@triton.heuristics({"BLOCK": lambda args: 128 if args["flag"] else 64})
@triton.jit
def f_kernel(x_ptr, y_ptr, n, flag, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + i, tl.load(x_ptr + i, mask=i < n), mask=i < n)
'''


@pytest.mark.parametrize("kind, value, block, said", [
    ("i1", "false", 64, None), ("i1", "true", 128, None), ("i1", "0", 64, None), ("bool", "true", 128, None),
    ("i1", "'yes'", None, "[constants] flag: a shape hint for a i1 argument must be an integer or true/false, got "
                          "'yes'"),
    ("i1", "0.5", None, "[constants] flag: a shape hint for a i1 argument must be an integer or true/false, got 0.5"),
    ("i32", "false", None, "[constants] flag: a shape hint for a i32 argument must be an integer, got False"),
])
def test_a_shape_hint_for_a_bool_argument_takes_true_or_false(tmp_path, kind, value, block, said):
    """gemlite's `load_scales_as_block = false` in [constants] for an i1 argument was refused ('a shape hint for a
    i1 argument must be an integer, got False'; 0 worked): Triton passes a bool argument as a bool, so a 1-bit
    argument's hint takes true/false, and the heuristic sees it; other values, and a bool for a wider integer,
    stay one line."""
    from kforge.load.entry_probe import Probe
    from kforge.plan.targets import build_targets
    text = (spec_text().replace("scale_kernel", "f_kernel").replace('n = "i32"', f'n = "i32"\nflag = "{kind}"')
            .replace('id = "{dtype}-b{BLOCK}-w{num_warps}"\n', "").split("BLOCK = [")[0])
    root = make_project(tmp_path, specs={"s": text + f"\n[constants]\nflag = {value}\n"},
                        kernels={"scale": FLAG_KERNEL})
    if said is not None:
        with pytest.raises(SpecError) as e:
            load_spec(root / "specs" / "s.toml", root)
        assert str(e.value) == f"specs/s.toml: {said}"
        return
    try:
        spec = load_spec(root / "specs" / "s.toml", root)
        [target] = build_targets([spec], root, None)
    finally:
        Probe.close_all()
    assert dict(spec.constants)["flag"] == (value == "true" if value != "0" else 0)
    assert dict(target.constexprs)["BLOCK"] == block
