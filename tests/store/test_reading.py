"""rules/store/reading.py: a file kforge wrote under out/, read back as untrusted data."""
import os
from pathlib import Path

import pytest

from kforge.store.reading import NotAFile, printable, read_bytes
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


def test_text_from_out_reaches_a_terminal_without_its_control_characters():
    """The one wording of untrusted text shown (the guard's names, error.txt, doit info): each control character
    but those kept is U+FFFD; a text with none is returned as it is."""
    assert printable("a\x1b[2Jb\n") == "a\ufffd[2Jb\ufffd"
    assert printable("a\x1b\tb\n", keep="\n\t") == "a\ufffd\tb\n"
    assert printable("plain", keep="\n") == "plain"
