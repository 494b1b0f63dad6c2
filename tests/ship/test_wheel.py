"""kforge.ship.wheel on its own: byte-identical wheels from the same files, a RECORD pip can check, atomic writes."""
import base64
import csv
import hashlib
import io
import zipfile

import pytest
from packaging.tags import Tag
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

from kforge.ship import wheel as wheel_mod
from kforge.ship.wheel import write_wheel
from kforge_runtime.schema import arch_of_bundle_file, dist_name, wheel_name

DIST, VERSION = "kforge_kernels_gfx942", "0.1.0+0123456789ab"   # as rules/ship/package.py names them
INFO = f"{DIST}-{VERSION}.dist-info"
FILES = {
    f"{DIST}/__init__.py": b"from kforge_kernels_gfx942._runtime import x\n",
    f"{DIST}/manifest.json": b'{"format": 1}\n',
    f"{DIST}/scale/fp16-b256-w4/scale_kernel.hsaco": bytes(range(256)) * 40,   # binary, not text
    f"{DIST}/empty.txt": b"",
}


def write(path, files=FILES, summary="kforge kernels for gfx942"):
    write_wheel(path, DIST, VERSION, summary, files)
    return path


def test_the_same_files_give_byte_identical_wheels_again_in_another_directory_and_in_any_order(tmp_path):
    (tmp_path / "a").mkdir()
    first = write(tmp_path / "a" / wheel_name(DIST, VERSION))
    again = write(tmp_path / "a" / "again.whl")
    (tmp_path / "elsewhere").mkdir()
    moved = write(tmp_path / "elsewhere" / wheel_name(DIST, VERSION),
                  files=dict(reversed(list(FILES.items()))))   # the caller's dict order does not matter
    assert first.read_bytes() == again.read_bytes() == moved.read_bytes()
    other = write(tmp_path / "a" / "other.whl", files={**FILES, f"{DIST}/empty.txt": b"\n"})
    assert other.read_bytes() != first.read_bytes()   # the bytes do follow the content


def test_the_archive_is_a_wheel_whose_record_matches_every_member(tmp_path):
    with zipfile.ZipFile(write(tmp_path / "w.whl")) as zf:
        assert zf.testzip() is None
        names = zf.namelist()
        assert sorted(names) == sorted([*FILES, f"{INFO}/METADATA", f"{INFO}/WHEEL", f"{INFO}/RECORD"])
        assert len(set(names)) == len(names)
        metadata = zf.read(f"{INFO}/METADATA").decode()
        wheel_info = zf.read(f"{INFO}/WHEEL").decode()
        rows = list(csv.reader(io.StringIO(zf.read(f"{INFO}/RECORD").decode())))
        members = {n: zf.read(n) for n in names}
    assert "Metadata-Version: 2.1\n" in metadata and f"Name: {DIST}\n" in metadata
    assert f"Version: {VERSION}\n" in metadata and "Summary: kforge kernels for gfx942\n" in metadata
    assert "Wheel-Version: 1.0\n" in wheel_info and "Root-Is-Purelib: true\n" in wheel_info
    assert "Tag: py3-none-any\n" in wheel_info
    assert all(len(row) == 3 for row in rows)
    recorded = {name: (digest, size) for name, digest, size in rows}
    assert len(recorded) == len(rows) and recorded.keys() == members.keys()   # each member once, no other
    assert recorded[f"{INFO}/RECORD"] == ("", "")   # RECORD cannot hold its own hash
    for name, data in members.items():
        if name == f"{INFO}/RECORD":
            continue
        digest, size = recorded[name]
        expected = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        assert (digest, size) == (f"sha256={expected}", str(len(data))), name


def test_entries_have_a_fixed_time_permission_order_and_compression(tmp_path):
    with zipfile.ZipFile(write(tmp_path / "w.whl")) as zf:
        infos = zf.infolist()
    assert [i.filename for i in infos] == sorted(i.filename for i in infos)
    for info in infos:
        assert info.date_time == (1980, 1, 1, 0, 0, 0), info.filename
        assert (info.external_attr >> 16) & 0o7777 == 0o644, info.filename   # no exec bit, nothing group-writable
        assert info.create_system == 3 and info.compress_type == zipfile.ZIP_DEFLATED, info.filename


@pytest.mark.parametrize("arch", ["sm_90a", "gfx942", "sm_100a"])
def test_pip_accepts_the_wheel_name_and_the_runtime_finds_its_arch(arch):
    name = wheel_name(dist_name(arch), "0.1.0+abcdef012345")
    project, version, build, tags = parse_wheel_filename(name)   # what pip runs on a wheel's file name
    assert project == canonicalize_name(dist_name(arch))
    assert version == Version("0.1.0+abcdef012345") and build == ()
    assert tags == frozenset({Tag("py3", "none", "any")})
    assert arch_of_bundle_file(name) == arch


def test_the_dist_info_directory_names_the_same_project_and_version_as_the_file(tmp_path):
    path = write(tmp_path / wheel_name(DIST, VERSION))
    with zipfile.ZipFile(path) as zf:
        info_dirs = {n.split("/")[0] for n in zf.namelist() if n.split("/")[0].endswith(".dist-info")}
    assert len(info_dirs) == 1   # pip refuses a wheel with none or several
    project, version = info_dirs.pop().removesuffix(".dist-info").split("-")
    wheel_project, wheel_version, _, _ = parse_wheel_filename(path.name)
    assert canonicalize_name(project) == wheel_project and Version(version) == wheel_version


def test_a_failure_while_writing_leaves_the_old_wheel_and_no_temp_file(tmp_path, monkeypatch):
    target = tmp_path / wheel_name(DIST, VERSION)
    target.write_bytes(b"the previous wheel")
    (tmp_path / "neighbour.txt").write_text("kept")
    written = []
    real_writestr = zipfile.ZipFile.writestr

    def disk_full_on_the_third_entry(self, info, data, *args, **kwargs):
        if len(written) == 2:
            raise OSError(28, "No space left on device")
        written.append(info.filename)
        return real_writestr(self, info, data, *args, **kwargs)

    monkeypatch.setattr(wheel_mod.zipfile.ZipFile, "writestr", disk_full_on_the_third_entry)
    with pytest.raises(OSError, match="No space left"):
        write(target)
    assert len(written) == 2   # the failure did come in the middle of the archive
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([target.name, "neighbour.txt"])
    assert target.read_bytes() == b"the previous wheel"
    assert (tmp_path / "neighbour.txt").read_text() == "kept"


def test_a_payload_that_is_not_bytes_is_refused_and_writes_nothing(tmp_path):
    (tmp_path / "neighbour.txt").write_text("kept")
    target = tmp_path / wheel_name(DIST, VERSION)
    with pytest.raises(TypeError):
        write(target, files={**FILES, f"{DIST}/bad.py": "text, not bytes"})
    with pytest.raises(TypeError):
        write(target, files={**FILES, f"{DIST}/bad.bin": None})
    assert [p.name for p in tmp_path.iterdir()] == ["neighbour.txt"]
    assert (tmp_path / "neighbour.txt").read_text() == "kept"
