"""`doit package`: per arch, one deterministic wheel in out/dist/ holding every built artifact and a manifest.

The wheel installs a package kforge_kernels_<arch>: manifest.json, the binaries, and kforge's runtime (copied
verbatim), all an application needs to load and launch the kernels. Targets that failed or were not built, and
families that did not load, are listed under "failed". A wheel a rebuild replaced is kept (out/.kforge/wheels/),
so that a revert renames it back instead of compressing every binary again.
"""
from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import stat
import sys
import time
import zipfile
import zlib
from pathlib import Path

from doit.exceptions import TaskFailed

import kforge_runtime

from kforge.store import artifact, guard
from kforge.base import stamps
from kforge.base.archs import ARCHS
from kforge.store.files import read_state, replacing, write_inside
from kforge.base.layout import Layout
from kforge.base.target import Target
from kforge_runtime.bundle import MAX_BINARY_BYTES, MAX_JSON_BYTES, read_member
from kforge_runtime.schema import BUNDLE_FORMAT, BUNDLE_FORMAT_VERSION, MANIFEST, MANIFEST_DIGEST, dist_name, wheel_name

RUNTIME_DIR = Path(kforge_runtime.__file__).resolve().parent   # rules/runtime/ in a checkout, wherever installed
ERROR_LINES = 40   # of a failed target's message, kept in the manifest
KEPT_WHEELS = 4   # per arch, of the wheels rebuilds replaced (out/.kforge/wheels/)
FIXED_TIME = (1980, 1, 1, 0, 0, 0)   # every wheel entry's timestamp: the earliest a zip can store
PUBLIC_VERSION = re.compile(r"[0-9]+(\.[0-9]+)*((a|b|rc)[0-9]+)?(\.post[0-9]+)?(\.dev[0-9]+)?")   # PEP 440, public
INIT = '''"""Precompiled kforge kernels for {arch}: `bundle().load(kernel, config)` (made by `doit package`)."""
from pathlib import Path

from .runtime import Bundle, BundleError, Kernel, LaunchError, Library, NoMatchingKernel

BUNDLE_DIR = Path(__file__).resolve().parent


def bundle() -> Bundle:
    return Bundle(BUNDLE_DIR)
'''


def build_bundle(arch: str, targets: list[Target], root: str, tuned: list[dict] = (), broken: list[dict] = ()):
    """The doit action: the arch's wheel in out/dist/: a recent one made from the same inputs (by their content),
    else one holding the manifest made now, else a new one, every binary checked again. A file that cannot be
    written (a full disk, a read-only out/) fails the task in one line."""
    try:
        return _build_bundle(arch, targets, root, tuned, broken)
    except OSError as e:
        where = f" {e.filename}" if e.filename else ""
        return TaskFailed(f"package:{arch}: cannot write the bundle{where}: {e.strerror or e}; free space, make "
                          f"out/ writable (out/dist a folder), then run `doit package` (every built artifact is kept)")


def _build_bundle(arch: str, targets: list[Target], root: str, tuned: list[dict], broken: list[dict]):
    root_path, layout = Path(root), Layout.of(root)
    try:
        tables = {t.name: check_tuning_table(t, arch) for t in tuning_tables(layout, arch)}
    except ValueError as e:
        return TaskFailed(str(e))
    try:   # out/dist, its wheels and manifests, the kept wheels: never through a link out of out/
        for place in (layout.dist, layout.kept_wheels, layout.state):
            guard.guard(layout.out, place / dist_name(arch))
    except guard.OutsideOut as e:
        return TaskFailed(f"package:{arch}: {e}")
    # stamped before reading: a change while packaging re-packages next time
    stamp = _stamp(arch, targets, root_path, tuned=tuned, broken=broken)
    content = _stamp(arch, targets, root_path, _meta_content, tuned, broken)   # the same inputs, meta.json by its bytes
    recent = _recent(layout, arch)
    found = _recent_wheel(layout, arch, recent.get(content))
    if found is None:
        found = _make_wheel(arch, targets, root_path, tuned, broken, tables)
        if isinstance(found, TaskFailed):
            return found
    wheel, data = found
    _keep_replaced(layout, arch, wheel)
    recent.pop(content, None)
    recent = dict([*recent.items(), (content, wheel.name)][-(KEPT_WHEELS + 1):])   # the newest last
    write_inside(layout.out, layout.manifest_copy(arch), data)
    write_inside(layout.out, layout.package_stamp(arch),   # the wheel's identity: one rewritten since is packaged again
                 json.dumps({"stamp": stamp, "wheel": wheel.name, "identity": stamps.identity(str(wheel)),
                             "recent": recent}).encode())
    manifest = json.loads(data)
    sys.stderr.write(f"kforge: {wheel.relative_to(root_path)}: {len(manifest['artifacts'])} artifacts, "
                     f"{len(manifest['failed'])} failed or not built (listed in its {MANIFEST})\n")


def _make_wheel(arch: str, targets: list[Target], root: Path, tuned, broken, tables: dict[str, bytes]):
    """(the wheel in out/dist/, its manifest's bytes): one holding the manifest made now, else written anew; or
    TaskFailed naming a binary that fails its checks."""
    try:
        project = project_version(root)   # before the manifest, which names it too
    except ValueError as e:
        return TaskFailed(str(e))
    built: list[tuple] = []   # (target, its meta.json as read) of each artifact the manifest lists, in its order
    manifest = make_manifest(arch, targets, root, tuned, built, broken)
    data = manifest_bytes(manifest)
    version = f"{project}+{hashlib.sha256(data).hexdigest()[:12]}"
    layout = Layout(root)
    wheel = layout.dist / wheel_name(dist_name(arch), version)
    layout.dist.mkdir(parents=True, exist_ok=True)
    # every file of a wheel is named by its manifest (sha256s, the runtime's digest, the version) and written in a
    # fixed way, so an intact wheel holding this very manifest is the one a build would write, byte for byte
    if _wheel_holding(layout, arch, wheel.name, data.__eq__) is not None:
        return wheel, data
    (layout.kept_wheels / wheel.name).unlink(missing_ok=True)   # a kept file of this name that is not the wheel
    for f in _temp_wheels(layout, arch):
        guard.remove_file(layout.out, f)
    files = {**runtime_files(arch), **manifest_files(dist_name(arch), data)}
    for name, table in tables.items():
        files[f"{dist_name(arch)}/tune/{name}"] = table
    for (t, meta), entry in zip(built, manifest["artifacts"]):
        try:   # meta.json as read (and sealed) for the manifest: on a GPU host reading it again cost 2 s of 5.8
            artifact.check_bound(t, meta)
            binary = artifact.binary_of(Path(t.out_dir), meta)   # sha256 + ELF checked again
        except artifact.ArtifactError as e:   # changed on disk since its compile task ran, or another target's
            return TaskFailed(f"package:{arch}: {t.name}: {t.meta_path}: {e}; rebuild it: "
                              f"`doit forget {t.name} && doit {t.name}`")
        files[f"{dist_name(arch)}/{entry['binary']}"] = binary
    write_wheel(wheel, dist_name(arch), version, _summary(arch), files)
    return wheel, data


def _summary(arch: str) -> str:
    return f"kforge kernels for {arch}"


def _meta_content(meta_path: str) -> list | None:
    found = stamps.content(meta_path)
    return None if found is None else [found]


def _well_shaped(saved: dict) -> bool:
    """out/.kforge/package-<arch>.json as this kforge writes it (untrusted: dropped with one warning otherwise)."""
    return isinstance(saved.get("stamp"), str) and isinstance(saved.get("wheel"), str) and \
        isinstance(saved.get("recent", {}), dict)


def _recent(layout: Layout, arch: str) -> dict[str, str]:
    """The last bundles' wheels by the content stamp of their inputs."""
    recent = (read_state(layout.package_stamp(arch), _well_shaped) or {}).get("recent", {})
    return {k: v for k, v in recent.items() if isinstance(v, str)}


def _recent_wheel(layout: Layout, arch: str, name) -> tuple[Path, bytes] | None:
    """(the wheel named, its manifest) when it holds the manifest whose digest its version carries; else None.
    No binary is read: the name is kforge's own record of what these inputs made (as is_current trusts)."""
    found = re.fullmatch(re.escape(dist_name(arch)) + r"-[0-9a-z.]+\+([0-9a-f]{12})-py3-none-any\.whl", str(name))
    signed = lambda data: hashlib.sha256(data).hexdigest()[:12] == found[1]   # the digest in its version
    data = found and _wheel_holding(layout, arch, name, signed)
    return None if data is None else (layout.dist / name, data)


def _wheel_holding(layout: Layout, arch: str, name: str, fits) -> bytes | None:
    """The manifest of the wheel `name` in out/dist/, or kept (then moved back), when fits(manifest) and the
    wheel is intact; else None."""
    wheel, kept = layout.dist / name, layout.kept_wheels / name
    for place in (wheel, kept):
        data = _manifest_in(place, arch)
        if data is not None and fits(data) and _intact(place, arch, data):
            if place == kept:
                os.replace(kept, wheel)
            return data
    return None


INFLATION = 32   # what a wheel found in out/dist/ may inflate to, times its size (a cubin deflates to ~1/4)


def _intact(wheel: Path, arch: str, data: bytes) -> bool:
    """Whether the wheel holds what write_wheel writes for the manifest `data`, file for file (the runtime, the
    manifest, each binary and tuning table by its sha256, the dist-info, nothing else): a byte changed anywhere
    and it is written again rather than shipped."""
    dist = dist_name(arch)
    version = wheel.name[len(dist) + 1:-len("-py3-none-any.whl")]
    try:
        manifest = guard.json_of(data)
        named = {f"{dist}/{a['binary']}": a["sha256"] for a in manifest["artifacts"]}
        named.update({f"{dist}/{t['path']}": t["sha256"] for t in manifest["tuned"].values()})
        with zipfile.ZipFile(wheel) as zf:
            budget = INFLATION * wheel.stat().st_size + MAX_JSON_BYTES   # a zip bomb is no wheel this wrote
            held = {}
            for info in zf.infolist():
                held[info.filename] = read_member(zf, info, min(budget, MAX_BINARY_BYTES))
                budget -= len(held[info.filename])
    except (OSError, KeyError, ValueError, TypeError, AttributeError, zipfile.BadZipFile, EOFError, zlib.error):
        return False
    files = {**runtime_files(arch), **manifest_files(dist, data)}
    for name, sha in named.items():
        if name not in held or hashlib.sha256(held[name]).hexdigest() != sha:
            return False
        files[name] = held[name]
    return wheel.name == wheel_name(dist, version) and held == wheel_files(dist, version, _summary(arch), files)


def _manifest_in(wheel: Path, arch: str) -> bytes | None:
    """The manifest.json of a wheel of the arch (its CRC checked as it is read), None if it is not one."""
    try:
        if not stat.S_ISREG(os.lstat(wheel).st_mode):   # never a link, nor a FIFO that would block the read
            return None
        with zipfile.ZipFile(wheel) as zf:
            return read_member(zf, zf.getinfo(f"{dist_name(arch)}/{MANIFEST}"), MAX_JSON_BYTES)
    except (OSError, KeyError, ValueError, zipfile.BadZipFile, EOFError, zlib.error):
        return None


def _keep_replaced(layout: Layout, arch: str, wheel: Path) -> None:
    """The arch's other wheels in out/dist/ move to out/.kforge/wheels/, where the newest KEPT_WHEELS stay."""
    kept = layout.kept_wheels
    for old in layout.dist.glob(f"{dist_name(arch)}-*.whl"):
        if old != wheel:
            kept.mkdir(parents=True, exist_ok=True)
            os.replace(old, kept / old.name)
            now = time.time_ns()   # when it was replaced (to the ns, not the file system's coarser clock)
            os.utime(kept / old.name, ns=(now, now))
    by_age = sorted(kept.glob(f"{dist_name(arch)}-*.whl"), key=lambda f: f.stat().st_mtime_ns, reverse=True)
    for old in by_age[KEPT_WHEELS:]:
        old.unlink(missing_ok=True)


def is_current(arch: str, targets: list[Target], root: str, tuned: list[dict] = (), broken: list[dict] = ()) -> bool:
    """doit uptodate: nothing that goes into the bundle changed, and the wheel is the file written then. From
    stats (meta.json is only ever replaced by rename), not by re-reading every meta.json."""
    root_path, layout = Path(root), Layout.of(root)
    try:
        saved = read_state(layout.package_stamp(arch), _well_shaped) or {}
        # in doit's master, which stat'ed every meta.json while generating the compile tasks (artifact.KeyIndex)
        seen = artifact.KeyIndex.of(layout.built_keys).meta_identity
        return (saved["stamp"] == _stamp(arch, targets, root_path, seen, tuned, broken)
                and saved.get("identity") == stamps.identity(str(layout.dist / saved["wheel"])))
    except (OSError, ValueError, KeyError, TypeError):
        return False


def _stamp(arch: str, targets: list[Target], root: Path, meta_identity=stamps.identity, tuned=(), broken=()) -> str:
    # pyproject.toml by its bytes: a no-op run need not parse TOML. Every part length-prefixed: parts of any
    # bytes joined by a separator they may hold would let two different inputs give one stamp
    h = hashlib.sha256()
    part = lambda data: h.update(b"%d:" % len(data) + data)
    part(_content(root / "pyproject.toml"))
    part(runtime_digest(arch).encode())
    part(json.dumps(list(tuned), sort_keys=True).encode())
    if broken:   # a "[...]" part: no target's name (next) starts so
        part(json.dumps(list(broken), sort_keys=True).encode())
    for table in tuning_tables(Layout(root), arch):
        part(table.name.encode())
        part(table.read_bytes())
    outside = guard.Outside(Layout(root).out)
    for t in sorted(targets, key=lambda t: t.name):
        away = outside.why(t)   # nothing read through a link out of out/
        found = None if away else meta_identity(t.meta_path)
        built = "outside" if away else "-" if found is None else ":".join(map(str, found))
        for text in (t.name, t.key, built):
            part(text.encode())
        if built == "-":   # no artifact: its error.txt (rewritten by every failed run) goes in by content
            part(_content(Path(t.error_path)))
    return h.hexdigest()


def _content(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b"-"


def make_manifest(arch: str, targets: list[Target], root: Path, tuned: list[dict] = (),
                  built: list[Target] | None = None, broken: list[dict] = ()) -> dict:
    """Every target of the arch: its meta.json (binary path bundle-relative) if built from its current key, else
    a "failed" record (its error, what a JIT fallback needs); the autotuners' picks (`tuned`), which serving reads.
    `built` collects (target, its meta.json as read) of the artifacts listed, in order."""
    artifacts, failed = [], []
    outside = guard.Outside(Layout(root).out)
    for t in sorted(targets, key=lambda t: t.name):
        away = outside.why(t)
        if away:   # its compile failed so: listed failed, nothing read through the link
            failed.append(_failure(t, root, away))
            continue
        meta = artifact.current_meta(t.meta_path, t.key)
        if meta is not None:
            if built is not None:
                built.append((t, dict(meta)))
            meta["binary"] = f"{t.kernel}/{t.config_id}/{meta.get('binary')}"
            # what the compile read stays in out/: shipped, it made a manifest of 196 MB for 414 kernels
            meta.pop("inputs", None)
            meta["options"] = dict(t.options)
            artifacts.append(meta)
        elif artifact.skipped(t) is None:   # a library autotuner's config that does not fit the arch: never run there
            failed.append(_failure(t, root))
    failed += [{**b, "arch": arch} for b in broken]   # families that did not load: no targets, listed by name
    tables = {f.stem: {"path": f"tune/{f.name}", "sha256": hashlib.sha256(f.read_bytes()).hexdigest()}
              for f in tuning_tables(Layout(root), arch)}
    return {"format": BUNDLE_FORMAT, "format_version": BUNDLE_FORMAT_VERSION, "arch": arch, "vendor": ARCHS[arch].vendor,
            "kforge_version": project_version(root), "runtime_sha256": runtime_digest(arch),
            "artifacts": artifacts, "failed": failed, "tuned": tables,
            "autotune": sorted(tuned, key=lambda t: json.dumps(t, sort_keys=True))}


def tuning_tables(layout: Layout, arch: str) -> list[Path]:
    """out/tune/<arch>/<kernel>.json: the tuning tables each bundle ships."""
    return sorted(layout.tuning_table(arch, "*").parent.glob("*.json"))


def check_tuning_table(path: Path, arch: str) -> bytes:
    from kforge_runtime.select import NoTunedConfig, check_table
    data = path.read_bytes()
    try:
        table = guard.json_of(data)
        check_table(table, str(path))
    except (ValueError, NoTunedConfig) as e:
        raise ValueError(f"{path}: not a usable tuning table ({e}); re-run the tuning or delete the file") from None
    if table.get("kernel") != path.stem or table.get("arch") != arch:
        raise ValueError(f"{path}: the table says kernel {table.get('kernel')!r} arch {table.get('arch')!r}; "
                         f"its place says {path.stem!r} {arch!r}")
    return data


def manifest_files(dist: str, data: bytes) -> dict[str, bytes]:
    """The manifest and its digest, as the wheel holds them (the loader refuses a manifest its digest does not fit)."""
    return {f"{dist}/{MANIFEST}": data, f"{dist}/{MANIFEST_DIGEST}": hashlib.sha256(data).hexdigest().encode() + b"\n"}


def manifest_bytes(manifest: dict) -> bytes:
    """Compact JSON (the runtime parses it at every cold start), one artifact per line (diffable)."""
    dump = lambda value: json.dumps(value, sort_keys=True, separators=(",", ":"))
    head = dump({k: v for k, v in manifest.items() if k not in ("artifacts", "failed")})[:-1]
    lists = [f'"{k}":[' + "".join(f"\n{dump(e)}," for e in manifest[k]).rstrip(",") + ("\n]" if manifest[k] else "]")
             for k in ("artifacts", "failed")]
    return f"{head},{','.join(lists)}}}\n".encode()


def remove(arch: str, root: str) -> None:
    """`doit clean package` (OutsideOut when out/dist leads outside out/: nothing is deleted there)."""
    layout = Layout.of(root)
    for place in (layout.manifest_copy(arch), layout.kept_wheels / dist_name(arch)):   # before the globs, which
        guard.guard(layout.out, place)                                                # would list a link's target
    for f in [*layout.dist.glob(f"{dist_name(arch)}-*.whl"), *layout.kept_wheels.glob(f"{dist_name(arch)}-*.whl"),
              layout.manifest_copy(arch), *_temp_wheels(layout, arch)]:
        guard.remove_file(layout.out, f)


def _temp_wheels(layout: Layout, arch: str) -> list[Path]:
    """The arch's wheels a killed `doit package` left half-written in out/dist (files.replacing's temp names): a
    task runs under the run lock, so no other run is writing one now."""
    return [f for f in layout.dist.glob(f".{dist_name(arch)}-*.whl.*.tmp") if guard.TEMP_NAME.fullmatch(f.name)]


def runtime_files(arch: str) -> dict[str, bytes]:
    files = {f"{dist_name(arch)}/__init__.py": INIT.format(arch=arch).encode()}
    for f in sorted(RUNTIME_DIR.glob("*.py")):
        files[f"{dist_name(arch)}/runtime/{f.name}"] = f.read_bytes()
    return files


def runtime_digest(arch: str) -> str:
    h = hashlib.sha256()
    for name, data in sorted(runtime_files(arch).items()):
        h.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
    return h.hexdigest()


def project_version(root: Path) -> str:
    """pyproject's [project] version, else "0" (a project that only builds kernels need not be a package)."""
    import tomllib
    try:
        with open(root / "pyproject.toml", "rb") as f:
            version = tomllib.load(f).get("project", {}).get("version")
    except (OSError, tomllib.TOMLDecodeError):
        version = None
    if version is None:
        return "0"
    if not isinstance(version, str) or not PUBLIC_VERSION.fullmatch(version):   # it names a file in out/dist/
        raise ValueError(f"pyproject.toml: [project] version {version!r} is not a public version number such as "
                         f"1.2.3 (digits, dots, a/b/rc/post/dev parts); fix it")
    return version


def did_not_load(broken, root: str) -> list[dict]:
    """The manifest's records of the families that did not load (catalog.broken), by name."""
    return sorted(({"target": b.name, "kernel": b.name, "spec": b.path, "status": "did not load",
                    "error": _rootless(b.error, root)} for b in broken), key=lambda f: f["target"])


def _rootless(error: str, root) -> str:
    """error with the project's folder left out: a bundle is the same bytes wherever the project lies (a
    library's own message may name the file it raised in)."""
    here = str(Path(root).resolve())
    return error.replace(here + os.sep, "").replace(here, ".")


def _failure(t: Target, root, outside: str | None = None) -> dict:
    status, error = "not built", ""
    failure = artifact.read_error(t) if outside is None else None
    if outside is not None:   # its folder leads outside out/ (guard.Outside): as its compile failed
        status, error = "failed", _rootless(f"cannot write in out/: {outside}", root)
    elif failure is not None and failure.key == t.key:
        # not the traceback: its paths are this machine's
        message = failure.message.split(artifact.TRACEBACK.strip(), 1)[0]
        status, error = "failed", _rootless("\n".join(message.strip().splitlines()[:ERROR_LINES]), root)
    return {"target": t.name, "kernel": t.kernel, "config_id": t.config_id, "config": dict(t.config),
            "arch": t.arch, "status": status, "error": error, "toolchain": t.toolchain,
            "source": {"module": t.module, "entry": t.entry, "digests": dict(t.source_digests)},
            "constexprs": dict(t.constexprs),
            "options": dict(t.options)}


def write_wheel(path: Path, dist: str, version: str, summary: str, files: dict[str, bytes]) -> None:
    """A pure-Python wheel of `files` (archive name -> content) and its dist-info, byte for byte the same from the
    same files (fixed order, timestamps and permissions), written atomically."""
    payload = wheel_files(dist, version, summary, files)
    with replacing(path) as tmp, zipfile.ZipFile(tmp, "w") as zf:   # never half a wheel
        for name in sorted(payload):   # dist-info sorts before the package ('-' < '/'): pip reads it either way
            entry = zipfile.ZipInfo(name, FIXED_TIME)
            entry.compress_type = zipfile.ZIP_DEFLATED
            entry.external_attr = 0o644 << 16
            entry.create_system = 3
            zf.writestr(entry, payload[name], compresslevel=6)


def wheel_files(dist: str, version: str, summary: str, files: dict[str, bytes]) -> dict[str, bytes]:
    """Every file of the wheel holding `files`: those, and its dist-info (METADATA, WHEEL, RECORD)."""
    info = f"{dist}-{version}.dist-info"
    payload = dict(files)
    payload[f"{info}/METADATA"] = (f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n"
                                   f"Summary: {summary}\n").encode()
    payload[f"{info}/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: kforge\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    record = [f"{name},sha256={_b64_digest(data)},{len(data)}" for name, data in sorted(payload.items())]
    payload[f"{info}/RECORD"] = ("\n".join(record + [f"{info}/RECORD,,"]) + "\n").encode()
    return payload


def _b64_digest(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
