"""Sweep expansion and config ids: readable, stable, derived from values only."""
import pytest

from kforge.spec import SpecError, load_spec
from kforge.sweep import config_id
from tests.support import make_project, spec_text


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
        '\n[[extra]]\ndtype = "fp16"\nBLOCK = 128\nnum_warps = 4\n'   # equal to a swept config: one target
        '\n[[exclude]]\nBLOCK = [256, 512]\n')
    spec = load(tmp_path, text)
    assert [config_id(spec, c) for c in spec.configs] == ["fp16-b128-w4", "bf16-b1024-w8"]


def test_arch_specific_exclude_keeps_config_for_other_archs(tmp_path):
    from kforge.targets import spec_targets
    text = spec_text(archs=("sm_90a", "gfx942"), blocks=(128, 256)) + '\n[[exclude]]\narch = "gfx942"\nBLOCK = 256\n'
    root = make_project(tmp_path, specs={"s": text})
    spec = load_spec(root / "specs" / "s.toml", root)
    names = sorted(t.name for t in spec_targets(spec, root, None))
    assert names == ["scale:fp16-b128-w4@gfx942", "scale:fp16-b128-w4@sm_90a", "scale:fp16-b256-w4@sm_90a"]


@pytest.mark.parametrize("value", ["../../../../escape", "a b", "x@y", "k:v", ".hidden", "-dash", "a/b", "x" * 300])
def test_a_config_id_that_is_not_a_safe_name_is_refused_at_load(tmp_path, value):
    """Config ids become directories under out/ and part of <kernel>:<id>@<arch>."""
    text = spec_text(blocks=(value,)).replace('id = "{dtype}-b{BLOCK}-w{num_warps}"', 'id = "{BLOCK}"')
    with pytest.raises(SpecError, match=r"specs/s.toml: \[sweep\] config .* gets the id .* which is not a safe name"):
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
