"""The one guard of every write and delete under out/ (rules/store/guard.py): never through a link leading outside."""
import pytest

from kforge.store import guard
from kforge.store.files import write_inside


@pytest.fixture
def out(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "elsewhere").mkdir()
    return tmp_path / "out"


def test_a_path_under_a_link_leading_outside_out_is_refused_naming_the_link(out, tmp_path):
    (out / "dist").symlink_to(tmp_path / "elsewhere")
    for path in (out / "dist" / "x.whl", out / "dist" / "deeper" / "x.json"):
        with pytest.raises(guard.OutsideOut) as refused:
            guard.guard(out, path)
        message = str(refused.value)
        assert message.startswith(f"{out / 'dist'} (a symbolic link) leads outside out/") and "\n" not in message
        assert "remove the link" in message


def test_paths_inside_out_pass_links_included(out, tmp_path):
    (out / "real").mkdir()
    (out / "alias").symlink_to(out / "real")   # a link that stays inside out/
    (out / "build-report.json").symlink_to(tmp_path / "elsewhere" / "r.json")   # the entry itself: replaced, never followed
    for path in (out / "x.json", out / "alias" / "y.json", out / ".kforge" / "tmp" / "z", out / "build-report.json"):
        assert guard.guard(out, path) == path
    linked = tmp_path / "linked-out"
    linked.symlink_to(out)   # out/ itself a link (onto a bigger disk, say): the user's choice
    assert guard.guard(linked, linked / "dist" / "x.whl")


def test_write_inside_and_remove_file_never_touch_what_a_link_leads_to(out, tmp_path):
    (out / ".kforge").symlink_to(tmp_path / "elsewhere")
    (tmp_path / "elsewhere" / "keep.json").write_text("mine")
    with pytest.raises(guard.OutsideOut):
        write_inside(out, out / ".kforge" / "new.json", b"{}")
    with pytest.raises(guard.OutsideOut):
        guard.remove_file(out, out / ".kforge" / "keep.json")
    assert [p.name for p in (tmp_path / "elsewhere").iterdir()] == ["keep.json"]
    write_inside(out, out / "tune" / "gfx942" / "k.json", b"{}")   # inside: written, its folders made
    assert (out / "tune" / "gfx942" / "k.json").read_bytes() == b"{}"
