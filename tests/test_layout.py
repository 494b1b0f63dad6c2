"""Layout: every path kforge reads or writes lies under <root>/out, in the shapes the rest of kforge expects."""
from pathlib import Path

import pytest

from kforge.base.layout import Layout
from kforge_runtime import schema

ARGS = {"artifact_dir": ("sm_90a", "scale", "fp16-b256-w4"), "family_dir": ("sm_90a", "scale"), "manifest_copy": ("gfx942",),
        "package_stamp": ("gfx942",), "tuning_table": ("gfx942", "scale")}


def every_path(layout: Layout) -> dict[str, Path]:
    """Each property and path method of Layout (found by introspection: a new one is checked too)."""
    paths = {}
    for name, member in vars(Layout).items():
        if isinstance(member, property):
            paths[name] = getattr(layout, name)
        elif callable(member) and not name.startswith("_") and name != "of":
            paths[name] = getattr(layout, name)(*ARGS[name])
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
    assert (Layout(tmp_path).artifact_dir("sm_90a", "scale", "fp16-b256-w4")
            == tmp_path / "out" / "sm_90a" / "scale" / "fp16-b256-w4")


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


@pytest.mark.parametrize("root", ["/some/project", "relative/project", "."])
def test_a_layout_of_a_string_equals_the_layout_of_its_path(root):
    assert Layout.of(root) == Layout(Path(root)) == Layout.of(Path(root))
    assert hash(Layout.of(root)) == hash(Layout(Path(root)))
    assert isinstance(Layout.of(root).root, Path)
    assert Layout.of(root).out == Path(root) / "out"
