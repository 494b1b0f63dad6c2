"""Layout: every path kforge reads or writes lies under <root>/out, in the shapes the rest of kforge expects."""
import ast
from pathlib import Path

import pytest

from kforge.base.layout import Layout
from kforge_runtime import schema
from tests.support import REPO

TARGET = ("sm_90a", "scale", "fp16-b256-w4")
ARGS = {"artifact_dir": TARGET, "artifact_path": TARGET, "meta_path": TARGET, "error_path": TARGET,
        "arch_dir": ("sm_90a",), "manifest_copy": ("gfx942",),
        "package_stamp": ("gfx942",), "tuning_table": ("gfx942", "scale")}
STRINGS = {"artifact_path", "meta_path", "error_path"}   # a Target's paths: strings, cheap for a no-op run
LISTINGS = {"artifact_dirs"}   # what is in out/, not a path


def every_path(layout: Layout) -> dict[str, Path]:
    """Each property and path method of Layout (found by introspection: a new one is checked too)."""
    paths = {}
    for name, member in vars(Layout).items():
        if isinstance(member, property):
            paths[name] = getattr(layout, name)
        elif callable(member) and not name.startswith("_") and name not in ("of", "holding", *LISTINGS):
            found = getattr(layout, name)(*ARGS[name])
            assert isinstance(found, str) == (name in STRINGS), name
            paths[name] = Path(found) if name in STRINGS else found
    return paths


def test_every_path_lies_under_the_projects_out(tmp_path):
    layout = Layout(tmp_path)
    paths = every_path(layout)
    assert len(paths) >= 14   # the introspection found them
    for name, path in paths.items():
        assert isinstance(path, Path), name
        assert path.is_relative_to(tmp_path / "out"), f"{name}: {path}"


def test_out_is_the_out_folder_at_the_project_root(tmp_path):
    assert Layout(tmp_path).out == tmp_path / "out"


def test_kforge_private_state_is_in_out_dot_kforge(tmp_path):
    layout = Layout(tmp_path)
    state = tmp_path / "out" / ".kforge"
    assert layout.state == state
    for path in (layout.scratch, layout.built_keys, layout.tool_versions, layout.package_stamp("sm_80")):
        assert path.parent == state or path.parent.parent == state


def test_artifact_dir_is_arch_then_kernel_then_config_id(tmp_path):
    assert (Path(Layout(tmp_path).artifact_path("sm_90a", "scale", "fp16-b256-w4"))
            == tmp_path / "out" / "sm_90a" / "scale" / "fp16-b256-w4")


@pytest.mark.parametrize("root", ["/some/project", "relative/project", "."])
def test_a_targets_string_paths_are_the_artifact_dir_and_its_files(root):
    layout = Layout.of(root)
    directory = Path(layout.artifact_path(*TARGET))
    assert Path(layout.meta_path(*TARGET)) == directory / schema.META
    assert Path(layout.error_path(*TARGET)) == directory / schema.ERROR


def test_artifact_dirs_lists_three_levels_down_links_included_and_never_enters_a_linked_arch(tmp_path):
    layout = Layout(tmp_path)
    built = Path(layout.artifact_path(*TARGET))
    built.mkdir(parents=True)
    (built.parent / "a-link").symlink_to(tmp_path)
    (built.parent / "a-file").write_text("")   # not an artifact directory
    layout.out.joinpath("elsewhere", "k", "c").mkdir(parents=True)
    layout.arch_dir("sm_80").symlink_to(layout.out / "elsewhere")
    assert sorted(layout.artifact_dirs(["sm_90a", "sm_80", "gfx942"])) == [
        str(built.parent / "a-link"), str(built)]


def test_manifest_copy_sits_beside_the_wheels_in_dist_named_after_the_arch_distribution(tmp_path):
    path = Layout(tmp_path).manifest_copy("gfx942")
    assert path == tmp_path / "out" / "dist" / "kforge_kernels_gfx942.manifest.json"
    assert path.name.startswith(schema.dist_name("gfx942"))


def test_package_stamp_and_tuning_table_are_one_file_per_arch_and_per_kernel(tmp_path):
    layout = Layout(tmp_path)
    assert layout.package_stamp("gfx942") == tmp_path / "out" / ".kforge" / "package-gfx942.json"
    assert layout.tuning_table("gfx942", "scale") == tmp_path / "out" / "tune" / "gfx942" / "scale.json"
    assert layout.package_stamp("gfx942") != layout.package_stamp("gfx950")
    assert layout.tuning_table("gfx942", "scale") != layout.tuning_table("gfx950", "scale")


def test_the_layout_holding_a_file_is_found_from_its_nearest_out_folder(tmp_path):
    project = tmp_path / "out" / "proj"   # a project inside a folder named out: the nearest one counts
    layout = Layout.of(project)
    for path in (layout.observed_inputs, layout.tuning_table("sm_90a", "gemm"),
                 Path(layout.artifact_path("gfx942", "k", "c"))):
        assert Layout.holding(path) == layout
    with pytest.raises(ValueError, match="not inside an out/ folder"):
        Layout.holding(tmp_path / "elsewhere" / "x.json")


@pytest.mark.parametrize("root", ["/some/project", "relative/project", "."])
def test_a_layout_of_a_string_equals_the_layout_of_its_path(root):
    assert Layout.of(root) == Layout(Path(root)) == Layout.of(Path(root))
    assert hash(Layout.of(root)) == hash(Layout(Path(root)))
    assert isinstance(Layout.of(root).root, Path)
    assert Layout.of(root).out == Path(root) / "out"


# --- the artifact directory is spelled in base/layout.py alone -------------------------------------------------------

PARTS = {"arch", "kernel", "config_id", "cid", "out_dir"}   # what an out/<arch>/<kernel>/<config_id> path is made of
BUNDLE_PATH = ("ship/package.py", "make_manifest")   # a bundle's own <kernel>/<config_id>/ inside the wheel, not out/
# out/ paths other than an artifact directory that are still climbed by counting levels (not yet asked of Layout)
CLIMBS = {("store/inputs.py", "__init__"), ("tune/gpu_bench.py", "save_progress")}


def _part(node) -> bool:
    """`arch`, `t.config_id`, `self.out_dir`, ...: a name or attribute that is one of PARTS (not a call of one)."""
    return ((isinstance(node, ast.Name) and node.id in PARTS) or
            (isinstance(node, ast.Attribute) and node.attr in PARTS))


def _functions(tree):
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for child in ast.walk(node):
                yield node.name, child


def artifact_path_spellings(source: str, module: str) -> list[str]:
    """Where code builds a path from an artifact directory's parts itself, instead of asking Layout: an f-string
    joining one with "/", `x / arch` (or kernel, config id, out_dir), or climbing out of an artifact directory
    by counting its levels (`.parents[2]`)."""
    found = []
    for function, node in _functions(ast.parse(source)):
        if (module, function) == BUNDLE_PATH:
            continue
        if isinstance(node, ast.JoinedStr):
            parts = node.values
            for i, part in enumerate(parts):
                if isinstance(part, ast.FormattedValue) and _part(part.value):
                    near = [p.value for p in parts[max(i - 1, 0):i + 2] if isinstance(p, ast.Constant)]
                    if any("/" in str(text) for text in near):
                        found.append(f"{module}:{node.lineno} f-string")
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div) and _part(node.right):
            found.append(f"{module}:{node.lineno} path / {ast.unparse(node.right)}")
        elif (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute)
              and node.value.attr == "parents" and isinstance(node.slice, ast.Constant) and node.slice.value >= 2
              and (module, function) not in CLIMBS):
            found.append(f"{module}:{node.lineno} .parents[{node.slice.value}]")
    return found


def test_the_artifact_directory_is_spelled_in_layout_py_alone():
    rules = REPO / "rules"
    modules = {path.relative_to(rules).as_posix(): path for path in sorted(rules.rglob("*.py"))
               if "runtime" not in path.relative_to(rules).parts}
    assert {"base/layout.py", *(module for module, _ in CLIMBS), BUNDLE_PATH[0]} <= set(modules)   # really read
    found = [hit for module, path in modules.items() if module != "base/layout.py"
             for hit in artifact_path_spellings(path.read_text(), module)]
    assert found == []


@pytest.mark.parametrize("code", ['out_dir=f"{shared.family_dir}/{cid}"', 'p = f"{self.out_dir}/meta.json"',
                                  "d = out / arch", "out = directory.parents[2]"])
def test_the_spelling_check_finds_each_old_spelling(code):
    """The old spellings (plan/targets.py, base/target.py, store/guard.py, store/artifact.py before one Layout)
    are each found."""
    assert artifact_path_spellings(f"def f():\n    {code}\n", "x.py") != []


def test_a_target_asks_its_layout_for_every_path():
    from kforge.base.target import Target
    assert "layout" in Target._fields and not {"out", "out_dir"} & set(Target._fields)
    target = Target(*([""] * Target._fields.index("layout")), Layout.of("/p"), key="k")._replace(
        arch="sm_90a", kernel="scale", config_id="c1")
    assert Path(target.out_dir) == Path(Layout.of("/p").artifact_path("sm_90a", "scale", "c1"))
    assert Path(target.meta_path) == Path(target.out_dir) / schema.META
    assert Path(target.error_path) == Path(target.out_dir) / schema.ERROR
