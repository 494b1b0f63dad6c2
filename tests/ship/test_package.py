"""`doit package`: one wheel per arch, manifest contents, failed targets listed, determinism, incrementality; and
the wheel writer on its own: byte-identical wheels from the same files, a RECORD pip can check, atomic writes."""
import base64
import csv
import hashlib
import io
import json
import shutil
import subprocess
import sys
import zipfile

import pytest
from packaging.tags import Tag
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

from kforge.ship import package
from kforge.ship.package import write_wheel
from kforge_runtime.schema import arch_of_bundle_file, dist_name, wheel_name
from tests.support import REPO, doit, kernel_text, make_project, spec_text

ARCHS = ("sm_90a", "gfx942")


def project(tmp_path):
    return make_project(tmp_path, specs={"scale": spec_text(archs=ARCHS, dtypes=("fp16", "bf16")),
                                         "bad": spec_text(name="bad", module="bad")},
                        kernels={"scale": kernel_text(), "bad": kernel_text(factor="no_such_name")})


@pytest.fixture(scope="module")
def packaged(tmp_path_factory):
    root = project(tmp_path_factory.mktemp("pkg"))
    proc = doit(root, "-n", "2", check=False)
    assert proc.returncode != 0, "a failed target must still fail the run"
    return root


def wheel(root, arch):
    found = sorted((root / "out" / "dist").glob(f"kforge_kernels_{arch}-*.whl"))
    assert len(found) == 1, found
    return found[0]


def manifest(root, arch):
    with zipfile.ZipFile(wheel(root, arch)) as zf:
        return json.loads(zf.read(f"kforge_kernels_{arch}/manifest.json"))


def test_one_wheel_per_arch_with_every_artifact_and_its_fields(packaged):
    for arch in ARCHS:
        m = manifest(packaged, arch)
        assert m["arch"] == arch and m["format"] == "kforge-bundle"
        assert sorted(e["config_id"] for e in m["artifacts"]) == ["bf16-b256-w4", "fp16-b256-w4"]
        with zipfile.ZipFile(wheel(packaged, arch)) as zf:
            names = set(zf.namelist())
            for e in m["artifacts"]:
                assert {"target", "kernel", "config", "arch", "binary", "sha256", "signature", "constexprs",
                        "toolchain_versions", "source"} <= set(e)
                assert e["source"]["digests"] and e["toolchain_versions"]["triton"] == "3.6.0"
                assert f"kforge_kernels_{arch}/{e['binary']}" in names
            assert not [n for n in names if n.endswith((".pkl", ".pickle"))]
        assert (packaged / "out" / "dist" / f"kforge_kernels_{arch}.manifest.json").read_bytes() == \
            package.manifest_bytes(m)


def test_the_manifest_ships_what_serving_matches_and_not_what_each_compile_read(packaged):
    """On a GPU host a library's import reads thousands of files: with each artifact's observed inputs in it,
    liger-kernel's 414 recorded kernels made a 196 MB manifest, over the loader's limit, and every served call
    of the test suite failed. meta.json in out/ keeps them; the bundle carries Triton's source key instead."""
    for arch in ARCHS:
        for e in manifest(packaged, arch)["artifacts"]:
            meta = json.loads((packaged / "out" / arch / e["kernel"] / e["config_id"] / "meta.json").read_text())
            assert meta["inputs"] and "inputs" not in e
            assert len(e["triton_source_key"]) == 64 and e["triton_source_key"] == meta["triton_source_key"]


def test_failed_targets_are_listed_with_their_error(packaged):
    failed = manifest(packaged, "sm_90a")["failed"]
    assert [(f["target"], f["status"]) for f in failed] == [("bad:fp16-b256-w4@sm_90a", "failed")]
    assert "no_such_name" in failed[0]["error"]
    # the message without the compiler's traceback: its paths are this machine's and virtualenv's, and a bundle
    # is the same bytes wherever it is built (error.txt keeps the traceback)
    error_txt = (packaged / "out/sm_90a/bad/fp16-b256-w4/error.txt").read_text()
    assert "Traceback in the compiler's process" in error_txt and str(packaged) not in failed[0]["error"]
    assert "Traceback" not in failed[0]["error"] and ".py\"" not in failed[0]["error"]
    # what a JIT fallback needs, and may compile only if the source is still this one (kforge_runtime.jit)
    digest = lambda path: hashlib.sha256((packaged / path).read_bytes()).hexdigest()
    assert failed[0]["source"] == {"module": "tk.bad", "entry": "scale_kernel",
                                   "digests": {p: digest(p) for p in ("tk/__init__.py", "tk/bad.py")}}
    assert manifest(packaged, "gfx942")["failed"] == []
    report = json.loads((packaged / "out" / "build-report.json").read_text())
    assert {p["name"]: p["status"] for p in report["packages"]} == {"package:gfx942": "built",
                                                                    "package:sm_90a": "built"}


def test_a_family_that_did_not_load_is_listed_as_failed_in_every_bundle(tmp_path):
    """A spec that cannot be read and a family whose source is missing: counted failed by the build, and listed
    under "failed" in the manifest, so that a consumer of the wheel sees the family is missing. Those, and a
    target whose compile failed on a library's message naming its own file, are the same bytes wherever the
    project lies."""
    specs = {"scale": spec_text(archs=ARCHS), "torn": "[kernel\nname = ", "gone": spec_text(name="gone", module="gone"),
             "raises": spec_text(name="raises", module="raises")}
    kernels = {"scale": kernel_text(), "raises": kernel_text() + 'raise RuntimeError(f"no backend for {__file__}")\n'}
    root, elsewhere = (make_project(tmp_path / "a", specs=specs, kernels=kernels),
                       make_project(tmp_path / "other" / "b", specs=specs, kernels=kernels))
    for project in (root, elsewhere):
        assert doit(project, "-n", "2", check=False).returncode != 0
    raised = manifest(root, "sm_90a")["failed"]
    assert [f["error"] for f in raised if f["kernel"] == "raises"][0].count("no backend for tk/raises.py") == 1
    for arch in ARCHS:   # the same bytes wherever the project lies (an error named the folder it was in)
        assert manifest(root, arch)["failed"] == manifest(elsewhere, arch)["failed"]
        failed = {f["target"]: f for f in manifest(root, arch)["failed"] if f["kernel"] != "raises"}
        assert set(failed) == {"torn", "gone"}, failed
        assert {(f["kernel"], f["arch"], f["status"]) for f in failed.values()} == \
            {("torn", arch, "did not load"), ("gone", arch, "did not load")}
        assert failed["torn"]["spec"] == "specs/torn.toml" and "specs/torn.toml" in failed["torn"]["error"]
        assert "tk/gone.py" in failed["gone"]["error"]
    report = json.loads((root / "out" / "build-report.json").read_text())
    assert report["counts"]["failed"] == 3   # torn, gone and raises' one target


def test_the_package_stamp_is_unambiguous(tmp_path):
    """Two sets of tuning tables whose names and bytes, joined by a separator, give the same bytes stamp
    differently: {a.json: "\\0b.json\\0c"} against {a.json: "", b.json: "c"} was one stamp."""
    from kforge.base.layout import Layout
    from kforge.ship import package
    root = make_project(tmp_path / "p", specs={})
    folder = Layout(root).tuning_table("sm_90a", "a").parent
    folder.mkdir(parents=True)
    stamps = []
    for tables in ({"a.json": "\0b.json\0c"}, {"a.json": "", "b.json": "c"}):
        for old in folder.iterdir():
            old.unlink()
        for name, text in tables.items():
            (folder / name).write_text(text)
        stamps.append(package._stamp("sm_90a", [], root))
    assert stamps[0] != stamps[1]


def test_a_target_never_built_is_listed_as_not_built(packaged, tmp_path):
    from kforge.plan.catalog import load_specs
    from kforge.plan.targets import build_targets
    copy = shutil.copytree(packaged, tmp_path / "p")
    shutil.rmtree(copy / "out" / "sm_90a" / "scale" / "fp16-b256-w4")
    targets = [t for t in build_targets(load_specs(copy), copy, None) if t.arch == "sm_90a"]
    m = package.make_manifest("sm_90a", targets, copy)
    assert {f["target"]: f["status"] for f in m["failed"]} == {"bad:fp16-b256-w4@sm_90a": "failed",
                                                               "scale:fp16-b256-w4@sm_90a": "not built"}


def test_same_inputs_give_byte_identical_wheels_in_another_checkout(packaged, tmp_path):
    other = project(tmp_path / "other")
    doit(other, "-n", "1", check=False)
    for arch in ARCHS:
        assert wheel(other, arch).name == wheel(packaged, arch).name
        assert wheel(other, arch).read_bytes() == wheel(packaged, arch).read_bytes()


def test_package_is_rebuilt_only_when_its_content_changes(tmp_path):
    root = make_project(tmp_path, specs={"scale": spec_text(archs=ARCHS)})
    doit(root)
    first = {a: wheel(root, a) for a in ARCHS}
    stamp = {a: first[a].stat().st_mtime_ns for a in ARCHS}
    doit(root, "package")
    report = json.loads((root / "out" / "build-report.json").read_text())
    assert {p["status"] for p in report["packages"]} == {"up-to-date"}
    (root / "tk" / "scale.py").touch()
    doit(root)
    assert all(wheel(root, a).stat().st_mtime_ns == stamp[a] for a in ARCHS)
    (root / "tk" / "scale.py").write_text(kernel_text(factor="3"))
    doit(root)
    for a in ARCHS:   # new binaries: a new wheel version, and the old wheel is gone
        assert wheel(root, a).name != first[a].name and not first[a].exists()


def test_wheel_installs_and_loads_without_doit_triton_or_kforge(packaged, tmp_path):
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(site),
                    str(wheel(packaged, "sm_90a"))], check=True)
    code = f"""
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('doit', 'triton', 'flydsl', 'rules', 'torch', 'pickle'):
            raise ImportError('blocked: ' + name)
sys.meta_path.insert(0, Block())
sys.path.insert(0, {str(site)!r})
import kforge_kernels_sm_90a as k
b = k.bundle()
e = b.find('scale', {{'dtype': 'bf16'}})
assert len(b.binary(e)) == e['size']
print(e['target'])
"""
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "scale:bf16-b256-w4@sm_90a"


def test_clean_removes_the_bundles_and_the_kept_wheels(tmp_path):
    root = make_project(tmp_path, specs={"scale": spec_text()})
    doit(root)
    assert list((root / "out" / "dist").glob("*.whl"))
    rebundle(root, "sm_90a", PICK)   # another manifest: the first wheel is kept
    assert list(kept(root))
    doit(root, "clean", "package")
    assert not list((root / "out" / "dist").glob("*")) and not list(kept(root))


def test_a_wheel_a_killed_package_left_half_written_goes_with_the_next_wheel_and_with_clean(tmp_path):
    """Hostile review, round three: `doit package` killed with SIGKILL left .kforge_kernels_<arch>-*.whl.<pid>.<hex>.tmp
    in out/dist, one a kill, which neither the next package nor `doit clean` removed."""
    root = make_project(tmp_path, specs={"scale": spec_text()})
    doit(root)
    dist = root / "out" / "dist"
    left = [dist / f".{w.name}.4194304.0badcafe.tmp" for w in dist.glob("*.whl")]
    for f in left:
        f.write_bytes(b"PK half a wheel")
    other = dist / ".notes.txt.1.0badcafe.tmp"   # no wheel's: left alone
    other.write_text("a user's")
    assert rebundle(root, "sm_90a", PICK) is None   # another manifest: a wheel is written
    assert not left[0].exists() and other.exists()
    doit(root, "clean", "package")
    assert not any(f.exists() for f in left) and other.exists()


PICK = [{"kernel": "scale", "key": ["4096"], "config": {"BLOCK": 256}}]   # an autotuner's pick: a new manifest


def kept(root):
    return (root / "out" / ".kforge" / "wheels").glob("*.whl")


def rebundle(root, arch, tuned=()):
    """build_bundle in this process, as `doit package` runs it (its TaskFailed, or None)."""
    from kforge.edge.dodo_tasks import load_catalog
    return package.build_bundle(arch, [t for t in load_catalog(root).targets if t.arch == arch], str(root), tuned)


def no_binary_read(monkeypatch, root, arch, found_by):
    """Fail the test if a binary is read; found by the inputs' content, also if the manifest is made; found by
    the manifest, the record of recent bundles is deleted first (the package stamp: a fresh out/, say)."""
    def refuse(what):
        raise AssertionError(f"{what}: read, though the wheel was there to use")
    monkeypatch.setattr(package.artifact, "load", refuse)
    if found_by == "inputs' content":
        monkeypatch.setattr(package, "make_manifest", lambda *a, **k: refuse("every meta.json"))
    else:
        (root / "out" / ".kforge" / f"package-{arch}.json").unlink()


FOUND_BY = pytest.mark.parametrize("found_by", ["inputs' content", "manifest"])


@FOUND_BY
def test_a_wheel_already_there_for_the_inputs_is_used_without_reading_a_binary(built, tmp_path, monkeypatch,
                                                                              found_by):
    root = shutil.copytree(built, tmp_path / "p", symlinks=True)
    before = wheel(root, "sm_90a")
    inode, data = before.stat().st_ino, before.read_bytes()
    no_binary_read(monkeypatch, root, "sm_90a", found_by)
    assert rebundle(root, "sm_90a") is None
    assert wheel(root, "sm_90a") == before and before.stat().st_ino == inode and before.read_bytes() == data


@FOUND_BY
def test_a_replaced_wheel_is_kept_and_comes_back_by_rename_when_its_inputs_do(built, tmp_path, monkeypatch,
                                                                             found_by):
    """A revert, or a branch switch back: the inputs are those of a recent wheel (the same content of every
    meta.json, or failing that the same manifest), so that file is moved back into out/dist/ (no binary read,
    nothing compressed), the one it replaces kept in its turn."""
    root = shutil.copytree(built, tmp_path / "p", symlinks=True)
    first = wheel(root, "sm_90a")
    inode, data = first.stat().st_ino, first.read_bytes()
    assert rebundle(root, "sm_90a", PICK) is None
    second = wheel(root, "sm_90a")
    assert second != first and not first.exists()
    assert [k.name for k in kept(root)] == [first.name]
    no_binary_read(monkeypatch, root, "sm_90a", found_by)
    assert rebundle(root, "sm_90a") is None   # back to the first inputs
    assert wheel(root, "sm_90a") == first and first.stat().st_ino == inode and first.read_bytes() == data
    assert [k.name for k in kept(root)] == [second.name]
    assert json.loads((root / "out" / "dist" / "kforge_kernels_sm_90a.manifest.json").read_text()) == \
        manifest(root, "sm_90a")
    from kforge.edge.dodo_tasks import load_catalog
    assert package.is_current("sm_90a", [t for t in load_catalog(root).targets if t.arch == "sm_90a"], str(root))


def test_a_wheel_recorded_for_the_inputs_is_used_only_if_it_holds_the_manifest_its_name_says(built, tmp_path):
    """The record of recent bundles names a wheel whose manifest is not the one its version's digest names (a
    hand copy under its name): the manifest is made and the wheel written again, byte for byte the first."""
    root = shutil.copytree(built, tmp_path / "p", symlinks=True)
    first = wheel(root, "sm_90a")
    data = first.read_bytes()
    assert rebundle(root, "sm_90a", PICK) is None
    shutil.copy(wheel(root, "sm_90a"), root / "out" / ".kforge" / "wheels" / first.name)   # PICK's, misnamed
    assert rebundle(root, "sm_90a") is None
    assert wheel(root, "sm_90a") == first and first.read_bytes() == data


def spoil(path, how: str) -> None:
    """Damage a wheel: another manifest inside, cut short, a binary left out or swapped for another (its manifest
    as it was), one byte of the runtime changed, a file added."""
    data = path.read_bytes()
    if how == "cut short":
        path.write_bytes(data[:1000])
        return
    with zipfile.ZipFile(path) as zf:
        held = {name: zf.read(name) for name in zf.namelist()}
    cubins = sorted(n for n in held if n.endswith(".cubin"))
    if how == "another manifest":
        held = {"kforge_kernels_sm_90a/manifest.json": b"{}"}
    elif how == "a binary left out":
        del held[cubins[0]]
    elif how == "a binary swapped":
        held[cubins[0]] = held[cubins[1]]
    elif how == "a runtime byte changed":
        name = next(n for n in held if n.endswith("runtime/launch.py"))
        held[name] = held[name].replace(b"def ", b"def  ", 1)
    else:
        held["kforge_kernels_sm_90a/extra.py"] = b"import os\n"
    with zipfile.ZipFile(path, "w") as zf:
        for name, content in held.items():
            zf.writestr(name, content)


SPOILS = ["another manifest", "cut short", "a binary left out", "a binary swapped", "a runtime byte changed",
          "a file added"]


def test_a_kept_file_that_is_not_the_wheel_for_the_manifest_is_not_used(built, tmp_path):
    """A damaged kept wheel, found again by a revert: the bundle is written again, every binary checked, and the
    bytes are the ones the first build wrote."""
    root = shutil.copytree(built, tmp_path / "p", symlinks=True)
    first = wheel(root, "sm_90a")
    data = first.read_bytes()
    spoiled = root / "out" / ".kforge" / "wheels" / first.name
    for how in SPOILS:
        assert rebundle(root, "sm_90a", PICK) is None and spoiled.exists()
        spoil(spoiled, how)
        assert rebundle(root, "sm_90a") is None
        assert wheel(root, "sm_90a") == first and first.read_bytes() == data, how


@pytest.mark.parametrize("how", SPOILS[2:])
def test_a_wheel_damaged_in_out_dist_after_it_was_written_is_packaged_again(built, tmp_path, how):
    """The package task was up to date while its wheel was there, whatever the wheel held: a damaged one was
    shipped with "0 failed". Now its identity is in the stamp, and a wheel is used only once every file checks."""
    from kforge.edge.dodo_tasks import load_catalog
    root = shutil.copytree(built, tmp_path / "p", symlinks=True)
    first = wheel(root, "sm_90a")
    data = first.read_bytes()
    assert rebundle(root, "sm_90a") is None   # the stamp as this kforge writes it
    targets = [t for t in load_catalog(root).targets if t.arch == "sm_90a"]
    assert package.is_current("sm_90a", targets, str(root))
    spoil(first, how)
    assert not package.is_current("sm_90a", targets, str(root))
    assert rebundle(root, "sm_90a") is None
    assert wheel(root, "sm_90a") == first and first.read_bytes() == data
    assert package.is_current("sm_90a", targets, str(root))


def test_a_zip_bomb_in_out_dist_is_packaged_again_without_inflating_it(built, tmp_path):
    """A wheel of the right name and manifest with a 2 GiB member of zeros (2 MB on disk) took 4.2 GB while `doit
    package` read every member whole (a hostile-input review); members are inflated a chunk at a time within a
    bound of the wheel's own size now."""
    import tracemalloc
    root = shutil.copytree(built, tmp_path / "p", symlinks=True)
    first = wheel(root, "sm_90a")
    data = first.read_bytes()
    with zipfile.ZipFile(first, "a", compression=zipfile.ZIP_DEFLATED) as zf:
        with zf.open("kforge_kernels_sm_90a/zeros.bin", "w", force_zip64=True) as member:
            for _ in range(256):
                member.write(bytes(1 << 20))   # 256 MiB, about 256 kB deflated
    tracemalloc.start()
    try:   # the check alone: reading a file kforge wrote asks os.read for its limit at once (untouched pages)
        assert not package._intact(first, "sm_90a", package._manifest_in(first, "sm_90a"))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 << 20, peak
    assert rebundle(root, "sm_90a") is None
    assert wheel(root, "sm_90a") == first and first.read_bytes() == data


def test_at_most_kept_wheels_per_arch_stay_the_newest(built, tmp_path, monkeypatch):
    root = shutil.copytree(built, tmp_path / "p", symlinks=True)
    monkeypatch.setattr(package, "KEPT_WHEELS", 2)
    rebundle(root, "gfx942", PICK)   # another arch's kept wheel: never counted against sm_90a's
    names = [wheel(root, "sm_90a").name]
    for n in range(1, 5):
        rebundle(root, "sm_90a", [{**PICK[0], "key": [str(n)]}])
        names.append(wheel(root, "sm_90a").name)
    assert sorted(k.name for k in kept(root) if "sm_90a" in k.name) == sorted(names[2:4])
    assert len([k for k in kept(root) if "gfx942" in k.name]) == 1


def test_runtime_imports_nothing_outside_itself():
    """It is copied into every wheel, and loading must not need a compiler, doit or kforge, or unpickle."""
    import ast
    for f in (REPO / "rules" / "runtime").glob("*.py"):
        banned = {"rules", "doit", "flydsl", "pickle", "marshal", "shelve", "triton", "torch"}
        if f.name == "jit.py":   # the opt-in JIT fallback may use torch for a caller's stream
            banned.discard("torch")
        if f.name in ("record.py", "serve.py", "specializer.py", "pytest_plugin.py", "source_key.py"):   # they
            # hook Triton's JIT
            banned -= {"triton", "torch"}   # (serve.py: with torch's device and stream, as Triton's driver does) in
            # a process that runs it; loading a bundle imports none of them (test_the_runtime_package_does_not_...)
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom):
                names = {node.module.split(".")[0]} if node.level == 0 else set()
            elif isinstance(node, ast.Import):
                names = {a.name.split(".")[0] for a in node.names}
            else:
                continue
            assert not names & banned, f"{f.name} imports {names & banned}"


def test_the_runtime_package_does_not_import_record():
    import subprocess
    import sys
    code = ("import sys, kforge_runtime; from kforge_runtime import Bundle; "
            "print(any(m.endswith(('.record', '.serve')) for m in sys.modules))")
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert found.strip() == "False"


def test_tuning_tables_ship_in_the_bundle_and_drive_selection(tmp_path):
    from kforge_runtime import Bundle
    from kforge_runtime.select import NoTunedConfig
    root = make_project(tmp_path, specs={"scale": spec_text(dtypes=("fp16",), blocks=(256, 1024))})
    doit(root)
    with pytest.raises(NoTunedConfig, match="no tuning table for 'scale'"):
        Bundle(wheel(root, "sm_90a")).tuned("scale")
    table = {"format": "kforge-tune-1", "kernel": "scale", "arch": "sm_90a", "shape_args": ["n"], "shapes": [
        {"shape": [1000], "ranking": [{"config_id": "fp16-b256-w4", "us": 3.0}, {"config_id": "fp16-b1024-w4", "us": 4.0}]},
        {"shape": [1000000], "ranking": [{"config_id": "fp16-b1024-w4", "us": 30.0}]}]}
    tables = root / "out" / "tune" / "sm_90a"
    tables.mkdir(parents=True)
    (tables / "scale.json").write_text(json.dumps(table))
    before = wheel(root, "sm_90a").name
    doit(root, "package")
    assert wheel(root, "sm_90a").name != before   # a new table is new content: a new bundle
    bundle = Bundle(wheel(root, "sm_90a"))
    assert bundle.find_for_shape("scale", {"n": 1000})[0]["config_id"] == "fp16-b256-w4"
    entry, why = bundle.find_for_shape("scale", {"n": 700000})
    assert entry["config_id"] == "fp16-b1024-w4" and "nearest tuned shape [1000000]" in why
    (tables / "scale.json").write_text("{broken")
    out = doit(root, "package", check=False)
    assert out.returncode != 0 and "scale.json: not a usable tuning table" in out.stdout + out.stderr


def test_a_non_editable_install_of_kforge_packages_the_runtime_too(tmp_path):
    """Installed from its wheel, kforge's build system (kforge) and runtime (kforge_runtime) are two folders:
    `doit package` must still copy the runtime into every bundle."""
    wheels, site = tmp_path / "wheels", tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                    str(wheels), str(REPO)], check=True, capture_output=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site),
                    *map(str, wheels.glob("kforge-*.whl"))], check=True, capture_output=True)
    root = make_project(tmp_path / "p", specs={"scale": spec_text()})
    env = {"PYTHONPATH": str(site)}   # ahead of the checkout's editable install
    where = subprocess.run([sys.executable, "-c", "import kforge, kforge_runtime; print(kforge.__file__, "
                            "kforge_runtime.__file__)"], env={**__import__("os").environ, **env},
                           capture_output=True, text=True, check=True).stdout.split()
    assert all(path.startswith(str(site)) for path in where), where
    doit(root, "-n", "1", env=env)
    with zipfile.ZipFile(wheel(root, "sm_90a")) as zf:
        names = set(zf.namelist())
    runtime = {f"kforge_kernels_sm_90a/runtime/{p.name}" for p in (REPO / "rules" / "runtime").glob("*.py")}
    assert runtime <= names


@pytest.mark.parametrize("pyproject, expected", [
    ("[tool.kforge]\ncatalog = ['specs']\n", "0"),   # a project that is not itself a Python package
    ("[project]\nname = 'k'\nversion = '2.1.post1'\n", "2.1.post1"),
    ("[project]\nname = 'k'\nversion = '../../x'\n", ValueError),
    ("[project]\nname = 'k'\nversion = 3\n", ValueError),
])
def test_the_bundle_version_is_the_projects_public_version_or_0(tmp_path, pyproject, expected):
    (tmp_path / "pyproject.toml").write_text(pyproject)
    if expected is ValueError:
        with pytest.raises(ValueError, match=r"pyproject.toml: \[project\] version .* is not a public version"):
            package.project_version(tmp_path)
    else:
        assert package.project_version(tmp_path) == expected


def test_a_version_that_is_not_public_fails_the_package_task_in_one_line(tmp_path):
    """The manifest names the version too: it was read there first, and raised past the package task's one line."""
    from doit.exceptions import TaskFailed
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'k'\nversion = '../../x'\n")
    failed = package._make_wheel("sm_90a", [], tmp_path, [], [], {})
    assert isinstance(failed, TaskFailed) and "[project] version '../../x' is not a public version" in str(failed)
    assert not (tmp_path / "out").exists()


def test_a_foreign_meta_json_fails_the_package_task_in_one_line_naming_the_target(built, tmp_path):
    """gfx942's meta.json and binary in gfx950's artifact directory, its key set to the gfx950 target's and its
    seal recomputed (a poisoned out/ from an older kforge, or a hand copy): one line naming the target and the fix,
    never a traceback."""
    from kforge.edge.dodo_tasks import load_catalog
    root = tmp_path / "p"
    shutil.copytree(built, root, symlinks=True)
    real, planted = (root / "out" / arch / "scale" / "fp16-b256-w4" for arch in ("gfx942", "gfx950"))
    key = json.loads((planted / "meta.json").read_text())["key"]
    shutil.rmtree(planted)
    shutil.copytree(real, planted)
    meta = json.loads((planted / "meta.json").read_text())
    meta["key"] = key
    meta.pop("seal")
    (planted / "meta.json").write_text(json.dumps(meta))
    targets = [t for t in load_catalog(root).targets if t.arch == "gfx950"]
    failed = package.build_bundle("gfx950", targets, str(root))
    message = failed.message
    assert len(message.strip().splitlines()) == 1, message
    assert message.startswith("package:gfx950: scale:fp16-b256-w4@gfx950: ") and "says target" in message
    assert "doit forget scale:fp16-b256-w4@gfx950" in message


def test_out_dist_as_a_link_outside_out_is_refused_by_package_and_clean_in_one_line(built, tmp_path):
    """out/dist pointing at a folder elsewhere: `doit package` writes nothing there and deletes no older wheel;
    `doit clean package` deletes nothing there; each says so in one line."""
    root = tmp_path / "p"
    shutil.copytree(built, root, symlinks=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for name in ("kforge_kernels_sm_90a-0+000000000000.whl", "kforge_kernels_sm_90a.manifest.json"):
        (elsewhere / name).write_text("someone else's")
    shutil.rmtree(root / "out" / "dist")
    (root / "out" / "dist").symlink_to(elsewhere)
    before = sorted((p.name, p.read_text()) for p in elsewhere.iterdir())
    clean = doit(root, "clean", "package")
    assert f"kforge: refused: {root / 'out' / 'dist'} (a symbolic link) leads outside out/" in clean.stdout
    assert "Traceback" not in clean.stdout + clean.stderr
    packaged = doit(root, "package", "archs=sm_90a", check=False)
    assert packaged.returncode != 0 and "Traceback" not in packaged.stdout + packaged.stderr
    assert f"package:sm_90a: {root / 'out' / 'dist'} (a symbolic link) leads outside out/" in packaged.stdout
    assert sorted((p.name, p.read_text()) for p in elsewhere.iterdir()) == before


def test_a_bundle_that_cannot_be_written_fails_the_package_task_in_one_line_and_keeps_every_artifact(built, tmp_path):
    """out/dist a file where its folder belongs (as a full disk or a read-only out/ would, an OSError on the way):
    one line naming the path and the fix, no traceback, and every artifact still in place."""
    from kforge.edge.dodo_tasks import load_catalog
    root = shutil.copytree(built, tmp_path / "p", symlinks=True)
    shutil.rmtree(root / "out" / "dist")
    (root / "out" / "dist").write_text("not a folder")
    (root / "out" / ".kforge" / "package-sm_90a.json").unlink()   # no recent bundle to take: the wheel is made
    artifacts = sorted(p for p in (root / "out" / "sm_90a").rglob("*") if p.is_file())
    targets = [t for t in load_catalog(root).targets if t.arch == "sm_90a"]
    message = package.build_bundle("sm_90a", targets, str(root)).message
    assert len(message.strip().splitlines()) == 1, message
    assert message.startswith(f"package:sm_90a: cannot write the bundle {root / 'out' / 'dist'}")
    assert "free space" in message
    assert sorted(p for p in (root / "out" / "sm_90a").rglob("*") if p.is_file()) == artifacts


# the wheel writer on its own

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

    monkeypatch.setattr(package.zipfile.ZipFile, "writestr", disk_full_on_the_third_entry)
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


@pytest.mark.parametrize("altered", [True, False], ids=["binary-altered", "copied-as-is"])
def test_an_artifact_folder_linked_outside_out_is_never_read_and_is_listed_failed_as_the_build_says(
        built, tmp_path, monkeypatch, altered):
    """An artifact folder replaced by a link to a copy outside out/: the target failed ("leads outside out/"), yet
    package kept the wheel listing it built (failed: []); without out/dist it hashed the binary through the link.
    A copy as it was built passed the compile task's check through the link: the build said nothing failed."""
    from kforge.edge.dodo_tasks import load_catalog
    root = shutil.copytree(built, tmp_path / "p", symlinks=True)
    doit(root, "package", "archs=sm_90a")
    folder = root / "out" / "sm_90a" / "scale" / "fp16-b256-w4"
    outside = shutil.copytree(folder, tmp_path / "outside")
    shutil.rmtree(folder)
    folder.symlink_to(outside)
    if altered:
        binary = next(outside.glob("*.cubin"))
        data = bytearray(binary.read_bytes())
        data[2000] ^= 0xff
        binary.write_bytes(bytes(data))
    proc = doit(root, "-n", "1", "archs=sm_90a", check=False)
    assert proc.returncode != 0 and "kforge: built 0, up to date 1, failed 1" in proc.stdout, proc.stdout
    assert f"scale:fp16-b256-w4@sm_90a failed with: cannot write in out/: {folder} (a symbolic link) leads outside " \
           f"out/" in proc.stdout

    def listed(m):
        return [a["config_id"] for a in m["artifacts"]], [(f["target"], f["status"]) for f in m["failed"]]
    expected = (["bf16-b256-w4"], [("scale:fp16-b256-w4@sm_90a", "failed")])
    assert listed(manifest(root, "sm_90a")) == expected
    assert "cannot write in out/: out/sm_90a/scale/fp16-b256-w4 (a symbolic link) leads outside out/" in \
        manifest(root, "sm_90a")["failed"][0]["error"]
    shutil.rmtree(root / "out" / "dist")   # a bundle made anew: nothing of the folder is read

    def refuse(real):
        def read(*args, **kwargs):
            assert not any(str(folder) in str(a) for a in (*args, *kwargs.values())), args
            return real(*args, **kwargs)
        return read
    for name in ("current_meta", "read_error", "binary_of", "skipped"):
        monkeypatch.setattr(package.artifact, name, refuse(getattr(package.artifact, name)))
    monkeypatch.setattr(package.stamps, "content", refuse(package.stamps.content))
    monkeypatch.setattr(package.stamps, "identity", refuse(package.stamps.identity))
    targets = [t for t in load_catalog(root).targets if t.arch == "sm_90a"]
    assert package.build_bundle("sm_90a", targets, str(root)) is None
    assert listed(manifest(root, "sm_90a")) == expected
