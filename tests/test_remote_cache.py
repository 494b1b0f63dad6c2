"""The remote cache against a real server: Debian's nginx with WebDAV PUT on loopback, started per test
module. Hit, miss, upload, a corrupt entry, a server that is down or never answers, read-only mode."""
import hashlib
import json
import socket
import time

import pytest

from bench.nginx import NGINX, free_port, webdav_server
from tests.support import build_report, doit, kernel_text, make_project, spec_text

pytestmark = pytest.mark.skipif(NGINX is None, reason="needs nginx (Debian's nginx-light; .ci/run installs it)")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with webdav_server(tmp_path_factory.mktemp("nginx")) as (url, store):
        yield url, store


def project(tmp_path, name, factor="2"):
    return make_project(tmp_path / name, specs={"scale": spec_text(archs=("sm_90a", "gfx942"), dtypes=("fp16", "bf16"))},
                        kernels={"scale": kernel_text(factor=factor)})


def records(root):
    return json.loads((root / "out" / "build-report.json").read_text())["tasks"]


def binaries(root):
    return {p.relative_to(root / "out"): p.read_bytes() for p in (root / "out").glob("*/scale/*/*_kernel.*")}


def test_a_second_clone_fetches_everything_and_compiles_nothing(server, tmp_path):
    url, store = server
    first = project(tmp_path, "first", factor="5")
    doit(first, "-n", "2", f"cache={url}")
    assert not any(r.get("from_cache") for r in records(first))
    assert len(list((store / "ac").iterdir())) >= 4 and len(list((store / "cas").iterdir())) >= 8
    second = project(tmp_path, "second", factor="5")
    out = doit(second, "-n", "2", f"cache={url}")
    assert all(r.get("from_cache") and r["status"] == "built" for r in records(second)), records(second)
    assert "4 from the remote cache" in out.stdout
    assert binaries(second) == binaries(first)
    assert set(build_report(second).values()) == {"built"}
    doit(second, f"cache={url}")
    assert set(build_report(second).values()) == {"up-to-date"}


def test_a_corrupt_entry_is_rejected_and_rebuilt(server, tmp_path):
    url, store = server
    first = project(tmp_path, "first", factor="6")
    doit(first, f"cache={url}")
    meta = json.loads(next((first / "out" / "sm_90a" / "scale").glob("fp16*/meta.json")).read_text())
    blob = store / "cas" / meta["sha256"]
    damaged = bytearray(blob.read_bytes())
    damaged[100] ^= 0xFF
    blob.write_bytes(bytes(damaged))   # the server now serves a damaged binary
    second = project(tmp_path, "second", factor="6")
    out = doit(second, f"cache={url}")
    assert "rejected" in out.stdout and "does not match its sha256" in out.stdout
    cached = {r["name"]: bool(r.get("from_cache")) for r in records(second)}
    assert cached == {"scale:fp16-b256-w4@sm_90a": False, "scale:bf16-b256-w4@sm_90a": True,
                      "scale:fp16-b256-w4@gfx942": True, "scale:bf16-b256-w4@gfx942": True}
    assert binaries(second) == binaries(first)


def test_a_server_that_is_down_or_never_answers_only_warns(tmp_path, monkeypatch):
    down = project(tmp_path, "down", factor="7")
    out = doit(down, f"cache=http://127.0.0.1:{free_port()}")
    assert out.stdout.count("kforge: warning: remote cache") == 1 and "building locally" in out.stdout   # once
    assert "kforge: 1 warning: remote cache" in out.stdout   # and again in the summary
    assert set(build_report(down).values()) == {"built"}
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)   # accepts connections, never answers
    monkeypatch.setenv("KFORGE_CACHE_TIMEOUT", "0.5")
    slow = project(tmp_path, "slow", factor="7")
    start = time.monotonic()
    out = doit(slow, f"cache=http://127.0.0.1:{silent.getsockname()[1]}")
    assert "timed out" in out.stdout and set(build_report(slow).values()) == {"built"}
    assert time.monotonic() - start < 60
    silent.close()


def test_read_only_mode_never_uploads(server, tmp_path):
    url, store = server
    before = set((store / "ac").iterdir()) if (store / "ac").exists() else set()
    root = project(tmp_path, "ro", factor="8")
    doit(root, f"cache={url}", "cache_readonly=1")
    assert set(build_report(root).values()) == {"built"}
    assert (set((store / "ac").iterdir()) if (store / "ac").exists() else set()) == before


def test_a_cache_that_is_not_an_http_url_is_a_clear_error(tmp_path):
    root = project(tmp_path, "bad")
    out = doit(root, "cache=ftp://example.org/x", check=False)
    assert out.returncode == 2 and "must be an http:// or https:// URL" in out.stderr


def test_an_entry_naming_paths_outside_its_artifact_is_refused_with_a_warning_and_writes_nothing(server, tmp_path):
    """A cache entry whose file names lead out of the artifact directory (relative or absolute), pointing at a real
    binary: refused before anything is written, the target compiles locally, the summary says so."""
    url, store = server
    first = project(tmp_path, "first", factor="8")
    doit(first, "-n", "2", f"cache={url}")
    escape = tmp_path / "escaped.cubin"
    for meta_path in (first / "out").glob("*/scale/*/meta.json"):
        meta = json.loads(meta_path.read_text())
        hostile = "../../../../../escaped.cubin" if meta["arch"] == "sm_90a" else str(escape)
        forged = json.dumps(dict(meta, binary=hostile)).encode()   # a consistent entry: meta.json names it too
        (store / "cas" / hashlib.sha256(forged).hexdigest()).write_bytes(forged)
        files = [{"name": "meta.json", "sha256": hashlib.sha256(forged).hexdigest()},
                 {"name": hostile, "sha256": meta["sha256"]}]   # the real binary's blob
        (store / "ac" / meta["key"]).write_text(json.dumps({"format": "kforge-ac-1", "files": files}))
    second = project(tmp_path, "second", factor="8")
    before = set(tmp_path.rglob("*"))
    out = doit(second, "-n", "2", f"cache={url}", "cache_readonly=1")
    assert not any(r.get("from_cache") for r in records(second)) and set(build_report(second).values()) == {"built"}
    assert "rejected (file name" in out.stdout and "kforge: 4 warnings: cache entry for scale:" in out.stdout
    assert not escape.exists()
    new = {p for p in set(tmp_path.rglob("*")) - before if (second / "out") not in p.parents and p != second / "out"}
    assert not new, sorted(map(str, new))


def test_a_server_that_trickles_bytes_is_cut_off_at_the_deadline(tmp_path, monkeypatch):
    """A byte every 0.2 s keeps each read under any per-read timeout; the whole request still ends at
    cache_timeout, and the build compiles locally."""
    import threading
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    stop = threading.Event()

    def trickle(conn):
        with conn:
            for byte in b"HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\n\r\n" + b"x" * 1000000:
                if stop.wait(0.2):
                    return
                try:
                    conn.sendall(bytes([byte]))
                except OSError:
                    return

    def serve():
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=trickle, args=(conn,), daemon=True).start()
    threading.Thread(target=serve, daemon=True).start()
    root = project(tmp_path, "trickle", factor="9")
    start = time.monotonic()
    out = doit(root, "-n", "2", f"cache=http://127.0.0.1:{listener.getsockname()[1]}", "cache_timeout=1")
    elapsed = time.monotonic() - start
    stop.set()
    listener.close()
    assert "timed out: no complete answer within 1 s" in out.stdout
    assert set(build_report(root).values()) == {"built"} and elapsed < 60
