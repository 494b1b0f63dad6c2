"""stamps: a digest is a canonical hash of its payload; an identity names one file version on disk."""
import hashlib
import os
import time

from kforge.base import stamps


def test_a_digest_does_not_depend_on_key_order_at_any_depth():
    one = {"a": 1, "b": {"c": [1, 2], "d": "x"}}
    other = {"b": {"d": "x", "c": [1, 2]}, "a": 1}
    assert stamps.digest(one) == stamps.digest(other)


def test_a_digest_treats_tuples_as_the_lists_json_reads_back():
    assert stamps.digest({"pairs": (("a", 1), ("b", (2, 3)))}) == stamps.digest({"pairs": [["a", 1], ["b", [2, 3]]]})


def test_a_digest_differs_for_different_values_and_for_values_of_different_types():
    payloads = [{"x": 1}, {"x": 2}, {"x": True}, {"x": 1.0}, {"x": "1"}, {"x": [1]}, {"y": 1}, {"x": None}]
    assert len({stamps.digest(p) for p in payloads}) == len(payloads)


def test_a_digest_is_a_sha256_hex_string():
    d = stamps.digest({"x": 1})
    assert len(d) == 64 and int(d, 16) >= 0


def test_identity_of_a_missing_file_is_none(tmp_path):
    assert stamps.identity(str(tmp_path / "absent")) is None


def test_replacing_a_file_by_rename_changes_its_identity_even_with_the_same_content_size_and_mtime(tmp_path):
    path = tmp_path / "meta.json"
    path.write_text("same")
    before = stamps.identity(str(path))
    new = tmp_path / "meta.json.tmp"
    new.write_text("same")
    st = path.stat()
    os.utime(new, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.replace(new, path)
    after = stamps.identity(str(path))
    assert before is not None and after is not None
    assert after != before and after[0] != before[0]   # a new inode
    assert after[1] == before[1] and after[3] == before[3]   # same mtime and size


def test_identity_reflects_size_and_mtime_of_the_file(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"12345")
    os.utime(path, ns=(1_000_000_000, 1_000_000_000))
    found = stamps.identity(str(path))
    assert found[1] == 1_000_000_000 and found[3] == 5
    path.write_bytes(b"123")
    found = stamps.identity(str(path))
    assert found[1] == path.stat().st_mtime_ns and found[3] == 3


def test_an_in_place_edit_that_keeps_the_size_and_restores_the_mtime_changes_the_identity(tmp_path):
    """What a user's editor or a careless script can do; only the ctime (which nothing but the clock sets) tells."""
    path = tmp_path / "kernel.py"
    path.write_text("BLOCK = 128\n")
    st = path.stat()
    before = stamps.identity(str(path))
    time.sleep(0.01)   # ctime has nanoseconds on Linux filesystems; a coarse clock still moves in 10 ms
    with open(path, "r+") as f:   # same inode, same size
        f.write("BLOCK = 256\n")
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    after = stamps.identity(str(path))
    assert after[0] == before[0] and after[1] == before[1] and after[3] == before[3]
    assert after != before


def test_identity_through_an_open_fd_equals_the_paths_and_stays_with_the_file_that_was_opened(tmp_path):
    path = tmp_path / "meta.json"
    path.write_text("old")
    with open(path, "rb") as f:
        assert stamps.identity(str(path), f.fileno()) == stamps.identity(str(path))
        opened = stamps.identity(str(path))
        (tmp_path / "new").write_text("new!")
        os.replace(tmp_path / "new", path)
        # the fd decides, not the path: the identity is that of the file being read (whose ctime moved
        # when the rename unlinked it)
        assert stamps.identity(str(path), f.fileno())[0] == opened[0]
        assert stamps.identity("", f.fileno()) == stamps.identity(str(path), f.fileno())
        assert stamps.identity(str(path))[0] != opened[0]


def test_identity_of_a_closed_fd_is_none(tmp_path):
    path = tmp_path / "f"
    path.write_text("x")
    fd = os.open(path, os.O_RDONLY)
    os.close(fd)
    assert stamps.identity(str(path), fd) is None


def test_content_is_a_files_bytes_or_a_folders_names_not_its_identity(tmp_path):
    f = tmp_path / "f.txt"
    f.write_bytes(b"same")
    first = stamps.content(str(f))
    f.unlink()
    f.write_bytes(b"same")   # a new inode and times, the same bytes
    assert stamps.content(str(f)) == first == hashlib.sha256(b"same").hexdigest()
    f.write_bytes(b"other")
    assert stamps.content(str(f)) != first
    folder = stamps.content(str(tmp_path))
    (tmp_path / "g.txt").write_bytes(b"")
    assert stamps.content(str(tmp_path)) != folder
    assert stamps.content(str(tmp_path / "missing")) is None
