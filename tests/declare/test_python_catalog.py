"""rules/declare/python_catalog.py and [tool.kforge] catalog: Python catalogs, checked as TOML specs are, loaded again when
anything they read changes."""
import os
import sys
import textwrap
import time

import pytest

from kforge.plan import catalog as catalog_module
from kforge.base.errors import SpecError
from kforge.plan.catalog import load_specs
from kforge.plan.targets import build_targets
from tests.support import doit, make_project, spec_text, statuses

CATALOG = '''
import json
from pathlib import Path

from kforge.declare import family

blocks = json.loads((Path(__file__).parent / "blocks.json").read_text())
for dtype in ("fp16", "bf16"):
    family(name=f"scale_{dtype}", source="tk/scale.py", entry="scale_kernel", toolchain="triton",
           archs=["sm_90a"], id="b{BLOCK}",
           signature={"x_ptr": "*{dtype}", "y_ptr": "*{dtype}", "n": "i32", "BLOCK": "constexpr"},
           hints={"divisible_by_16": ["x_ptr", "y_ptr"]},
           sweep={"dtype": [dtype], "BLOCK": blocks, "num_warps": [4]})
'''


def python_project(tmp_path, text=CATALOG, blocks="[128, 256]"):
    root = make_project(tmp_path / "p", specs={})
    (root / "specs" / "lib.py").write_text(textwrap.dedent(text))
    (root / "specs" / "blocks.json").write_text(blocks)
    return root


def names(root):
    return sorted(t.name for t in build_targets(load_specs(root), root, None))


def test_a_python_catalog_declares_several_families_from_a_loop_and_a_data_file(tmp_path):
    root = python_project(tmp_path)
    assert names(root) == ["scale_bf16:b128@sm_90a", "scale_bf16:b256@sm_90a",
                           "scale_fp16:b128@sm_90a", "scale_fp16:b256@sm_90a"]


def test_python_and_toml_specs_live_side_by_side(tmp_path):
    root = python_project(tmp_path)
    (root / "specs" / "scale.toml").write_text(spec_text())
    assert "scale:fp16-b256-w4@sm_90a" in names(root) and len(names(root)) == 5


def test_a_bad_family_gets_the_toml_message_naming_the_file_and_line(tmp_path):
    root = python_project(tmp_path, CATALOG.replace('"i32"', '"int33"'))
    with pytest.raises(SpecError, match=r"^specs/lib.py:9: family 'scale_fp16': \[signature\] n: "):
        load_specs(root)


WRAPPED = '''
from kforge.declare import family as declare


def family(**arguments):   # the catalog's own wrapper, adding what every family shares
    declare(toolchain="triton", archs=["sm_90a"], **arguments)


def scale(dtype):
    family(name=f"scale_{dtype}", source="tk/scale.py", entry="scale_kernel", id="b{BLOCK}",
           signature={"x_ptr": "*{dtype}", "y_ptr": "*{dtype}", "n": "i32", "BLOCK": "constexpr"},
           sweep={"dtype": [dtype], "BLOCK": [128], "num_warps": [4]})


scale("fp16")
scale("int33")
'''


def test_a_family_declared_through_the_catalogs_own_wrapper_is_named_by_the_line_that_declared_it(tmp_path):
    """The outermost line of the catalog file: each call of a wrapper, not the wrapper's one line for all."""
    root = python_project(tmp_path, WRAPPED)
    with pytest.raises(SpecError, match=r"^specs/lib.py:16: family 'scale_int33': \[sweep\] dtype: got 'int33'"):
        load_specs(root)


def test_a_family_a_helper_module_declares_as_it_is_imported_is_named_by_the_helpers_line(tmp_path):
    """A catalog importing a helper that declares families itself: the helper's line, not the import's."""
    root = python_project(tmp_path, "import sys, pathlib\nsys.path.insert(0, str(pathlib.Path(__file__).parent))\n"
                                    "import _more  # noqa: F401\n")
    (root / "specs" / "_more.py").write_text(textwrap.dedent(WRAPPED))
    with pytest.raises(SpecError, match=r"^specs/_more.py:\d+: family 'scale_int33': \[sweep\] dtype: got 'int33'"):
        load_specs(root)


def test_a_value_a_loop_gives_twice_is_refused_naming_the_call(tmp_path):
    """A catalog that computes its sweep may give a value twice (`min(b, 1024) for b in ...`): refused as a TOML
    spec's is, not merged."""
    root = python_project(tmp_path, blocks="[128, 256, 128]")
    with pytest.raises(SpecError, match=r"^specs/lib.py:9: family 'scale_fp16': \[sweep\] BLOCK: got 128; allowed: "
                                        r"each value once \(this one is listed twice\)$"):
        load_specs(root)


def test_a_name_or_argument_of_thousands_of_characters_is_one_short_line(tmp_path):
    """A family() name names every message of its family; a 100,000-character one was written whole into each,
    and was a valid name (a folder under out/<arch>/ no file system holds)."""
    root = python_project(tmp_path / "a", CATALOG.replace('name=f"scale_{dtype}"', 'name="x" * 100_000'))
    with pytest.raises(SpecError) as e:
        load_specs(root)
    assert str(e.value).startswith("specs/lib.py:9: family 'xxx") and len(str(e.value)) < 600, str(e.value)[:300]
    assert "[kernel] name: got 'xxx" in str(e.value) and "at most 100 characters" in str(e.value)
    broken = catalog_module.Catalog(root, None, 50_000).load(keep_going=True).broken   # listed by its file's name
    assert {b.name for b in broken} == {"lib", "lib_broken"}, {b.name[:20] for b in broken}
    root = python_project(tmp_path / "b", CATALOG.replace('toolchain="triton"', 'toolchain="triton", **{"y" * 100_000: 1}'))
    with pytest.raises(SpecError) as e:
        load_specs(root)
    assert str(e.value).startswith("specs/lib.py:9: family() got unknown argument 'yyy") and len(str(e.value)) < 600


@pytest.mark.parametrize("edit, said", [
    (('sweep={', 'sweep={1: [2], '), "[sweep] 1: a key of type int; keys are names (strings)"),
    (('signature={', 'signature={None: "i32", '), "[signature] None: a key of type NoneType"),
    (('sweep={', 'env={1: "x"}, sweep={'), "[env] 1: a key of type int"),
    (('sweep={', 'arch={"sm_90a": {(1, 2): 4}}, sweep={'), "[arch] 'sm_90a' (1, 2): a key of type tuple"),
    (('sweep={', 'extra=[{1: 2}], sweep={'), "[extra] 1: a key of type int"),
])
def test_a_key_that_is_no_string_is_one_line_not_a_traceback(tmp_path, edit, said):
    """TOML's keys are strings; a Python catalog's dict may hold any: `sweep={1: [64]}` was an AttributeError
    ('int' object has no attribute 'isidentifier') out of the whole load, a tuple key a TypeError where the
    catalog keeps the declaration (JSON). The file fails, as for a family() argument it does not know."""
    root = python_project(tmp_path, CATALOG.replace(*edit))
    for load in (load_specs, lambda root: catalog_module.Catalog(root, None, 50_000).load(keep_going=True)):
        with pytest.raises(SpecError) as e:
            found = load(root)
            raise SpecError(found.broken[0].error)   # the catalog keeps going: the file is one broken entry
        assert str(e.value).startswith("specs/lib.py:9: family 'scale_fp16': " + said), str(e.value)


def test_every_table_of_a_toml_spec_is_an_argument_of_family(tmp_path):
    """arch, env and adapter too: a Python catalog can say all a TOML spec can."""
    from kforge.declare.spec import SCHEMA
    from kforge.declare import python_catalog as declare
    assert set(declare.KERNEL_KEYS) | set(declare.TABLES) == set(SCHEMA["kernel"]) | set(SCHEMA) - {"kernel"}
    root = python_project(tmp_path, CATALOG.replace('archs=["sm_90a"]', 'archs=["sm_90a", "gfx942"]').replace(
        'sweep={', 'env={"TK_FAST": "1"}, arch={"sm_90a": {"num_warps": 4}, "gfx942": {"num_warps": 8}}, '
        'sweep={').replace(', "num_warps": [4]})', '})'))
    specs = load_specs(root)
    assert all(s.env == (("TK_FAST", "1"),) for s in specs)
    targets = build_targets(specs, root, None)
    warps = {t.arch: dict(t.options)["num_warps"] for t in targets}
    assert warps == {"sm_90a": 4, "gfx942": 8}


def test_an_unknown_argument_or_a_failing_file_is_one_line_naming_the_file_and_line(tmp_path):
    root = python_project(tmp_path, CATALOG.replace("hints=", "hint="))
    with pytest.raises(SpecError, match=r"^specs/lib.py:9: family\(\) got unknown argument 'hint'; allowed: name"):
        load_specs(root)
    root = python_project(tmp_path / "2", CATALOG.replace("blocks = json", "blocks = 1 / 0 or json"))
    with pytest.raises(SpecError, match=r"^specs/lib.py:7: the catalog file failed: ZeroDivisionError"):
        load_specs(root)
    root = python_project(tmp_path / "4", CATALOG.replace("blocks = json", "raise SystemExit(0)\nblocks = json"))
    with pytest.raises(SpecError, match=r"^specs/lib.py:7: the catalog file failed: SystemExit: 0"):
        load_specs(root)   # a catalog that exits is not an empty catalog
    root = python_project(tmp_path / "3", "x = 1\n")
    with pytest.raises(SpecError, match=r"specs/lib.py: declares no family"):
        load_specs(root)


def test_family_outside_a_catalog_load_says_where_it_may_be_called():
    from kforge.declare import family
    with pytest.raises(SpecError, match=r"family\(\) is called by a catalog file while kforge loads it"):
        family(name="x")


def loaded(root):
    return catalog_module.Catalog(root, None, 50_000).load()


@pytest.mark.parametrize("edit", ["data file", "helper module", "catalog file", "pyproject"])
def test_editing_what_a_python_catalog_read_loads_it_again(tmp_path, monkeypatch, edit):
    root = python_project(tmp_path, CATALOG.replace("import json\n", "import json\nimport tk.helper  # noqa\n"))
    (root / "tk" / "helper.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(root))
    for name in [m for m in sys.modules if m == "tk" or m.startswith("tk.")]:   # another test's project's tk
        monkeypatch.delitem(sys.modules, name)
    assert loaded(root).loaded_from == "specs"
    assert loaded(root).loaded_from == "saved"   # unchanged: the saved catalog
    time.sleep(0.01)
    path = {"data file": root / "specs" / "blocks.json", "helper module": root / "tk" / "helper.py",
            "catalog file": root / "specs" / "lib.py", "pyproject": root / "pyproject.toml"}[edit]
    path.write_text(path.read_text() + ("\n" if edit != "data file" else " "))
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 10**9))
    assert loaded(root).loaded_from == "specs"


def test_the_catalog_folders_come_from_pyproject(tmp_path):
    root = python_project(tmp_path)
    (root / "specs").rename(root / "kernels_catalog")
    (root / "pyproject.toml").write_text((root / "pyproject.toml").read_text()
                                         + '\n[tool.kforge]\ncatalog = ["kernels_catalog"]\n')
    assert len(names(root)) == 4
    (root / "pyproject.toml").write_text((root / "pyproject.toml").read_text().replace(
        '["kernels_catalog"]', '["no_such_folder"]'))
    with pytest.raises(SpecError, match=r"\[tool.kforge\] catalog: 'no_such_folder' is neither a folder of the "
                                        r"project nor an installed package"):
        load_specs(root)


def test_a_python_catalog_builds_with_doit_and_a_data_edit_rebuilds_only_the_new_config(tmp_path):
    root = python_project(tmp_path)
    doit(root, "-n", "2")
    assert len(statuses(root, "built")) == 4
    (root / "specs" / "blocks.json").write_text("[128, 512]")
    doit(root, "-n", "2")
    assert statuses(root, "built") == {"scale_fp16:b512@sm_90a", "scale_bf16:b512@sm_90a"}
    assert statuses(root, "up-to-date") == {"scale_fp16:b128@sm_90a", "scale_bf16:b128@sm_90a"}


def test_a_catalog_file_runs_again_only_when_what_it_read_changed_and_its_families_only_when_theirs_did(
        tmp_path, monkeypatch):
    """rules/plan/catalog.py: the saved catalog keeps what each Python catalog file read and declared, and each
    family's own inputs: a kernel's edit does not run the file, and recomputes the families built from it; a
    data file's edit runs it, and recomputes only the families whose declaration changed."""
    from kforge.declare import python_catalog, spec as spec_module
    text = CATALOG.replace('sweep={"dtype": [dtype], "BLOCK": blocks,',
                           'sweep={"dtype": [dtype], "BLOCK": blocks if dtype == "fp16" else [64],')
    root = python_project(tmp_path, text)
    runs, computed = [], []
    real_run, real_spec = python_catalog.declarations, spec_module.spec_from_tables
    monkeypatch.setattr(python_catalog, "declarations", lambda *a, **k: runs.append(1) or real_run(*a, **k))
    monkeypatch.setattr(spec_module, "spec_from_tables",
                        lambda raw, *a, **k: computed.append(raw["kernel"]["name"]) or real_spec(raw, *a, **k))

    def load() -> tuple[int, list[str], list[str]]:
        runs.clear(), computed.clear()
        found = catalog_module.Catalog(root, None, 50_000).load()
        return len(runs), sorted(computed), sorted(t.name for t in found.targets)

    assert load()[:2] == (1, ["scale_bf16", "scale_fp16"])
    time.sleep(0.01)
    (root / "tk" / "scale.py").write_text((root / "tk" / "scale.py").read_text() + "\n# edited\n")
    assert load()[:2] == (0, ["scale_bf16", "scale_fp16"])   # both built from it; the file is not run
    time.sleep(0.01)
    (root / "specs" / "blocks.json").write_text("[512]")
    ran, families, targets = load()
    assert (ran, families) == (1, ["scale_fp16"]) and targets == ["scale_bf16:b64@sm_90a", "scale_fp16:b512@sm_90a"]
    time.sleep(0.01)
    (root / "specs" / "lib.py").write_text("# a line above every family() call\n" + textwrap.dedent(text))
    ran, families, targets = load()
    assert (ran, families) == (1, []) and targets == ["scale_bf16:b64@sm_90a", "scale_fp16:b512@sm_90a"]
    spec_paths = {t.spec_path for t in catalog_module.Catalog(root, None, 50_000).load().targets}
    assert spec_paths == {"specs/lib.py:10: family 'scale_bf16'", "specs/lib.py:10: family 'scale_fp16'"}


def test_a_dtype_object_in_constants_is_told_to_give_the_dtypes_name(tmp_path):
    """`constants={"x": torch.float32}` said only 'expected fixed constexpr value' (an outside review with torchao)."""
    root = python_project(tmp_path, CATALOG.replace("from kforge.declare import family\n",
                                                    "from kforge.declare import family\nimport triton.language as tl\n")
                          .replace('"BLOCK": "constexpr"}', '"BLOCK": "constexpr", "D": "constexpr"}, '
                                                           'constants={"D": tl.float32}'))
    with pytest.raises(SpecError) as e:
        load_specs(root)
    assert str(e.value).startswith("specs/lib.py:10: family 'scale_fp16': [constants] D: expected a fixed constexpr "
                                   "value: a number, a bool or a string (a dtype by its name, 'fp32', its argument "
                                   "declared 'dtype' in [signature]), None only from a Python catalog, got "
                                   "triton.language.float32 (dtype)"), \
        str(e.value)
