"""pyproject.toml as kforge reads it: a file the user owns, read as one; anything else at its place is one line."""
import os
import threading

import pytest

from kforge.base.errors import SpecError
from kforge.base.project_config import kforge_table
from kforge_runtime.bundle import file_kind


def test_table_read(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[tool.kforge]\ncatalog = ["specs"]\n')
    assert kforge_table(tmp_path) == {"catalog": ["specs"]}
    (tmp_path / "pyproject.toml").unlink()
    assert kforge_table(tmp_path) == {}


@pytest.mark.parametrize("text", ["tool = 5\n", "[tool]\nkforge = [1]\n"])
def test_table_of_another_type_is_one_line(tmp_path, text):
    """`tool` or `tool.kforge` that is no table was an AttributeError traceback."""
    (tmp_path / "pyproject.toml").write_text(text)
    with pytest.raises(SpecError, match="not a table"):
        kforge_table(tmp_path)


def _read_in_thread(root):
    """kforge_table(root) in a daemon thread: (what it returned or raised, or None while it still blocks)."""
    result = []

    def read():
        try:
            result.append(kforge_table(root))
        except SpecError as e:
            result.append(e)
    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    thread.join(5)
    return result[0] if result else None


@pytest.mark.parametrize("kind", ["fifo", "folder", "device"])
def test_not_a_file_is_one_line(tmp_path, kind):
    """A FIFO at pyproject.toml hung every command that read it (`doit -f PROJ/dodo.py` from another folder); a
    folder or a device is no file either: each is one SpecError naming the file and the fix."""
    path = tmp_path / "pyproject.toml"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
    else:
        path.symlink_to("/dev/null")   # a link to a device (/dev/zero read whole would never end)
    error = _read_in_thread(tmp_path)
    if kind == "fifo" and error is None:   # unblock the reader so that the test process can end
        with open(os.open(path, os.O_WRONLY | os.O_NONBLOCK), "w"):
            pass
    assert isinstance(error, SpecError), f"kforge_table on a {kind} returned {error!r} (None: still blocked)"
    assert str(path) in str(error) and "not a file" in str(error) and "\n" not in str(error)
    assert f"({file_kind(os.stat(path).st_mode)})" in str(error), "not in the runtime's words (file_kind)"


def test_huge_file_is_one_line(tmp_path):
    """A pyproject.toml far past any project's (a file written by mistake) is refused, not read whole."""
    path = tmp_path / "pyproject.toml"
    with open(path, "wb") as f:
        f.truncate(64 << 20)
    with pytest.raises(SpecError, match="too large"):
        kforge_table(tmp_path)


def test_an_unknown_key_is_one_line_naming_it_and_the_allowed_ones(tmp_path):
    """`catalogue = [...]` was ignored without a word: the project built from specs/ as if it were not there."""
    (tmp_path / "pyproject.toml").write_text('[tool.kforge]\ncatalogue = ["kernels"]\n')
    with pytest.raises(SpecError) as e:
        kforge_table(tmp_path)
    assert str(e.value) == ("pyproject.toml: [tool.kforge] 'catalogue': unknown key (did you mean catalog?); "
                            "allowed: catalog, record_archs, setup")


@pytest.mark.parametrize("value, said", [("[" * 600 + "]" * 600, "nested too deeply"),
                                         ("9" * 5000, "Exceeds the limit (4300 digits)")])
def test_a_value_tomllib_cannot_read_is_one_line(tmp_path, value, said):
    """A RecursionError (arrays 600 deep) or a ValueError (an integer of 5,000 digits) out of tomllib was a
    traceback."""
    (tmp_path / "pyproject.toml").write_text(f"[tool.kforge]\ncatalog = [\"specs\"]\nq = {value}\n")
    with pytest.raises(SpecError) as e:
        kforge_table(tmp_path)
    assert str(e.value).startswith(f"{tmp_path / 'pyproject.toml'}: cannot read it") and said in str(e.value)
    assert "\n" not in str(e.value)
