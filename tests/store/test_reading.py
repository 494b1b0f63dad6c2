"""rules/store/reading.py: a file kforge wrote under out/, read back as untrusted data."""
import os
from pathlib import Path

import pytest

from kforge.store.reading import NotAFile, read_bytes
from kforge_runtime.bundle import file_kind


@pytest.mark.parametrize("kind", ["fifo", "folder", "device"])
def test_what_is_no_file_is_one_line_in_the_runtimes_words(tmp_path, kind):
    """A FIFO, a folder or a device at a state file's place is refused without a read, and named as the loader
    names it (out/'s reader said "a device" where the loader said "a terminal or character device")."""
    path = Path(os.devnull) if kind == "device" else tmp_path / "built-keys.json"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
    with pytest.raises(NotAFile) as error:
        read_bytes(path)
    said = str(error.value)
    assert f"is {file_kind(os.stat(path).st_mode)}, not a file kforge wrote" in said, said
    assert str(path) in said and "\n" not in said
