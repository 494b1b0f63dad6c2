"""The remote cache against a real server: Debian's nginx with WebDAV PUT on loopback, started per test
module. Hit, miss, upload, a corrupt entry, a server that is down or never answers, read-only mode, and a
signed cache (cache_key=): a tag missing, forged or moved to another key is refused before any blob is fetched."""
import hashlib
import hmac
import json
import re
import socket
import time

import pytest

from kforge.store import artifact
from kforge.share import remote_cache
from kforge.share.nginx_cache import NGINX, free_port, serve
from kforge.base.layout import Layout
from kforge.share.remote_cache import CacheConfig
from tests.share.test_nginx_cache import served as answered
from tests.support import build_report, doit, kernel_text, make_project, spec_text

needs_nginx = pytest.mark.skipif(NGINX is None, reason="needs nginx (Debian's nginx-light; .ci/run installs it)")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    if NGINX is None:
        pytest.skip("needs nginx (Debian's nginx-light; .ci/run installs it)")
    with serve(tmp_path_factory.mktemp("nginx")) as cache_server:
        yield cache_server


def project(tmp_path, name, factor="2"):
    return make_project(tmp_path / name, specs={"scale": spec_text(archs=("sm_90a", "gfx942"), dtypes=("fp16", "bf16"))},
                        kernels={"scale": kernel_text(factor=factor)})


def records(root):
    return json.loads((root / "out" / "build-report.json").read_text())["tasks"]


def binaries(root):
    return {p.relative_to(root / "out"): p.read_bytes() for p in (root / "out").glob("*/scale/*/*_kernel.*")}


def test_a_second_clone_fetches_everything_and_compiles_nothing(server, tmp_path):
    url, store = server.url, server.store
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
    url, store = server.url, server.store
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


@needs_nginx   # no server needed, but it builds: kept with the builds against nginx that CI runs
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
    url, store = server.url, server.store
    before = set((store / "ac").iterdir()) if (store / "ac").exists() else set()
    root = project(tmp_path, "ro", factor="8")
    doit(root, f"cache={url}", "cache_readonly=1")
    assert set(build_report(root).values()) == {"built"}
    assert (set((store / "ac").iterdir()) if (store / "ac").exists() else set()) == before


@needs_nginx
def test_a_cache_that_is_not_an_http_url_is_a_clear_error(tmp_path):
    root = project(tmp_path, "bad")
    out = doit(root, "cache=ftp://example.org/x", check=False)
    assert out.returncode == 2 and "must be an http:// or https:// URL" in out.stderr


def test_an_entry_naming_paths_outside_its_artifact_is_refused_with_a_warning_and_writes_nothing(server, tmp_path):
    """A cache entry whose file names lead out of the artifact directory (relative or absolute), pointing at a real
    binary: refused before anything is written, the target compiles locally, the summary says so."""
    url, store = server.url, server.store
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
    # three refusals switch the cache off (one more warning); a fourth lookup already under way is refused too
    assert "rejected (file name" in out.stdout and re.search(r"kforge: [45] warnings: cache entry http", out.stdout)
    assert not escape.exists()
    new = {p for p in set(tmp_path.rglob("*")) - before if (second / "out") not in p.parents and p != second / "out"
           and "__pycache__" not in p.parts}   # the interpreter's own, when bytecode is written
    assert not new, sorted(map(str, new))


@needs_nginx
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


SECRET = "kforge-test-secret-7f3a9c51"
OTHER_SECRET = "not-the-secret-0123456789"
FP16 = "scale:fp16-b256-w4@sm_90a"


def tag(secret: str, key: str, files: list) -> str:
    """The tag as rules/share/remote_cache.py documents it: HMAC-SHA256 over the compact JSON of
    ["kforge-ac-1", action key, [[name, sha256], ...]], in hex."""
    message = json.dumps(["kforge-ac-1", key, [[f["name"], f["sha256"]] for f in files]], separators=(",", ":"))
    return hmac.new(secret.encode(), message.encode(), hashlib.sha256).hexdigest()


def two_configs(tmp_path, name, factor):
    """fp16 and bf16 for sm_90a: two targets, two /ac/ entries."""
    return make_project(tmp_path / name, specs={"scale": spec_text(archs=("sm_90a",), dtypes=("fp16", "bf16"))},
                        kernels={"scale": kernel_text(factor=factor)})


def keys_of(root) -> dict[str, str]:
    """target name -> action key (its /ac/ entry's name)."""
    metas = [json.loads(p.read_text()) for p in (root / "out").glob("*/scale/*/meta.json")]
    return {m["target"]: m["key"] for m in metas}


def assert_secret_nowhere(root, out):
    assert SECRET not in out.stdout + out.stderr
    assert not [p for p in root.rglob("*") if p.is_file() and SECRET.encode() in p.read_bytes()]   # report included


def test_a_signed_cache_is_read_with_its_key_and_the_key_shows_nowhere(server, tmp_path):
    first = two_configs(tmp_path, "first", "10")
    wrote = doit(first, "-n", "2", f"cache={server.url}", f"cache_key={SECRET}")   # the form likeliest to be echoed
    for key in keys_of(first).values():
        entry = json.loads((server.store / "ac" / key).read_text())
        assert entry.get("hmac_sha256") == tag(SECRET, key, entry["files"])
    key_file = tmp_path / "cache.key"
    key_file.write_text(SECRET + "\n")   # as `openssl rand -hex 32 > cache.key` writes it
    second = two_configs(tmp_path, "second", "10")
    read = doit(second, "-n", "2", f"cache={server.url}", f"cache_key=@{key_file}")
    assert all(r.get("from_cache") for r in records(second)) and "2 from the remote cache" in read.stdout
    assert "warning" not in read.stdout
    assert binaries(second) == binaries(first)
    assert_secret_nowhere(first, wrote)
    assert_secret_nowhere(second, read)


def test_an_unsigned_reader_reads_a_signed_cache(server, tmp_path):
    doit(two_configs(tmp_path, "signed", "11"), "-n", "2", f"cache={server.url}", env={"KFORGE_CACHE_KEY": SECRET})
    plain = two_configs(tmp_path, "plain", "11")
    out = doit(plain, "-n", "2", f"cache={server.url}")
    assert all(r.get("from_cache") for r in records(plain)) and "warning" not in out.stdout


# What a writer without the secret can do to fp16's entry (key: its action key; other: bf16's signed entry).
def forge(entry: dict, key: str, other: dict) -> dict:
    return dict(entry, hmac_sha256=tag(OTHER_SECRET, key, entry["files"]))


def strip(entry: dict, key: str, other: dict) -> dict:
    return {k: v for k, v in entry.items() if k != "hmac_sha256"}


def swap(entry: dict, key: str, other: dict) -> dict:
    return other   # bf16's valid artifact, with the tag the right secret made for bf16's key


@pytest.mark.parametrize("tamper, why, factor", [(forge, "its tag does not match", "12"),
                                                 (strip, "it carries no hmac_sha256 tag", "13"),
                                                 (swap, "its tag does not match", "14")],
                         ids=["re-signed", "stripped", "swapped"])
def test_a_signed_reader_refuses_an_entry_whose_tag_is_wrong_or_missing_before_fetching_blobs(server, tmp_path,
                                                                                             tamper, why, factor):
    first = two_configs(tmp_path, "first", factor)
    doit(first, "-n", "2", f"cache={server.url}", env={"KFORGE_CACHE_KEY": SECRET})
    keys = keys_of(first)
    fp16, bf16 = keys[FP16], keys["scale:bf16-b256-w4@sm_90a"]
    entry, other = (json.loads((server.store / "ac" / k).read_text()) for k in (fp16, bf16))
    (server.store / "ac" / fp16).write_text(json.dumps(tamper(entry, fp16, other)))
    second = two_configs(tmp_path, "second", factor)
    served = len(answered(server))
    out = doit(second, FP16, f"cache={server.url}", env={"KFORGE_CACHE_KEY": SECRET})
    assert f"/ac/{fp16} for {FP16} rejected ({why}" in out.stdout and "kforge: 1 warning: cache entry" in out.stdout
    assert [bool(r.get("from_cache")) for r in records(second)] == [False] and build_report(second) == {FP16: "built"}
    assert [r for r in answered(server)[served:] if r.startswith("GET /cas/")] == []
    assert_secret_nowhere(second, out)


@needs_nginx
def test_the_cache_config_never_shows_its_key():
    cfg = CacheConfig("http://127.0.0.1:9", False, 10.0, SECRET)
    assert SECRET not in repr(cfg) and SECRET not in str(cfg)


@pytest.mark.parametrize("body, why, factor", [("[]", "not a kforge-ac-1 entry", "15"),
                                               ("[" * 60_000, "maximum recursion depth", "16")],
                         ids=["a-list", "nested-too-deep"])
def test_an_entry_that_is_not_a_json_object_is_refused_not_a_failed_build(server, tmp_path, body, why, factor):
    first = make_project(tmp_path / "first", kernels={"scale": kernel_text(factor=factor)})
    doit(first, f"cache={server.url}")
    (server.store / "ac" / keys_of(first)[FP16]).write_text(body)
    second = make_project(tmp_path / "second", kernels={"scale": kernel_text(factor=factor)})
    out = doit(second, f"cache={server.url}")
    assert f"/ac/{keys_of(first)[FP16]} for {FP16} rejected ({why}" in out.stdout
    assert build_report(second) == {FP16: "built"}


def test_an_unsigned_entry_listing_more_files_than_an_artifact_has_is_refused_before_fetching_blobs(server, tmp_path):
    """A hostile server cannot stretch one lookup over hundreds of blob requests: an artifact is two files."""
    first = make_project(tmp_path / "first", kernels={"scale": kernel_text(factor="17")})
    doit(first, f"cache={server.url}")
    path = server.store / "ac" / keys_of(first)[FP16]
    entry = json.loads(path.read_text())
    # 500 more (~50 kB): within AC_LIMIT, so it is the file count that refuses it
    entry["files"] = entry["files"] + [{"name": f"x{i}.cubin", "sha256": "0" * 64} for i in range(500)]
    path.write_text(json.dumps(entry))
    second = make_project(tmp_path / "second", kernels={"scale": kernel_text(factor="17")})
    served = len(answered(server))
    out = doit(second, f"cache={server.url}")
    assert f"/ac/{path.name} for {FP16} rejected (it does not list exactly two files" in out.stdout
    assert build_report(second) == {FP16: "built"}
    assert [r for r in answered(server)[served:] if r.startswith("GET /cas/")] == []


# Requests answered in memory (no server): what an entry holds, and what the cache makes of it.

def served(monkeypatch, answers: dict[str, bytes]):
    """The cache's requests answered from `answers` (path -> body; 404 for the rest); returns the paths asked."""
    asked = []

    def request(cfg, method, path, data=None, **_):
        asked.append(f"{method} {path}")
        return (200, answers[path]) if method == "GET" and path in answers else (404 if method == "GET" else 201, b"")
    monkeypatch.setattr(remote_cache, "_request", request)
    return asked


def entry_serving(files: dict[str, bytes]) -> tuple[bytes, dict[str, bytes]]:
    """An unsigned /ac/ entry listing `files`, and the /cas/ blobs it names."""
    blobs = {f"/cas/{hashlib.sha256(data).hexdigest()}": data for data in files.values()}
    listed = [{"name": name, "sha256": hashlib.sha256(data).hexdigest()} for name, data in files.items()]
    return json.dumps({"format": "kforge-ac-1", "files": listed}).encode(), blobs


def test_an_entry_holding_another_archs_build_is_a_miss_naming_the_entry_not_a_file(built, tmp_path, monkeypatch):
    """gfx942's genuine meta.json and binary served for the gfx950 target, meta.json's key, target and arch
    rewritten and its seal recomputed: a miss (the target compiles here), nothing written, and the warning names
    the cache entry, not a file in out/."""
    from types import SimpleNamespace
    wanted = json.loads((built / "out/gfx950/scale/fp16-b256-w4/meta.json").read_text())
    files = artifact.files_of(built / "out/gfx942/scale/fp16-b256-w4")
    meta = {**json.loads(files["meta.json"]), "key": wanted["key"], "target": wanted["target"], "arch": "gfx950"}
    files["meta.json"] = json.dumps({**meta, "seal": artifact.seal(meta)}).encode()
    entry, blobs = entry_serving(files)
    served(monkeypatch, {f"/ac/{wanted['key']}": entry, **blobs})
    out_dir = tmp_path / "out/gfx950/scale/fp16-b256-w4"
    layout = Layout(tmp_path)
    target = SimpleNamespace(name=wanted["target"], kernel="scale", config_id="fp16-b256-w4", arch="gfx950",
                             key=wanted["key"], config=tuple(wanted["config"].items()), layout=layout,
                             out_dir=layout.artifact_path("gfx950", "scale", "fp16-b256-w4"), recorded_code=())
    cache = remote_cache.RemoteCache(CacheConfig("http://cache.example:8080"))
    hit, [warning] = artifact.arrive(target, cache)
    assert hit is None and not out_dir.exists() and cache.drain_warnings() == []
    assert warning.startswith(f"cache entry http://cache.example:8080/ac/{wanted['key']} for {wanted['target']} "
                              f"rejected (its binary is refused: the binary is for gfx942, expected gfx950)")
    assert "meta.json" not in warning and "doit forget" not in warning


def fake_target(tmp_path, i: int):
    from types import SimpleNamespace
    layout = Layout(tmp_path)
    return SimpleNamespace(name=f"scale:c{i}@sm_90a", key=f"{i:064x}", layout=layout,
                           out_dir=layout.artifact_path("sm_90a", "scale", f"c{i}"))


def test_a_slow_cache_is_switched_off_once_the_runs_budget_is_spent_saying_so_once(tmp_path, monkeypatch):
    """Every answer just under cache_timeout: the run waits no more than cache_budget in all (then no request
    at all), with one warning naming the server and the time lost."""
    asked = []

    def slow(cfg, method, path, data=None, **_):
        asked.append(path)
        time.sleep(0.15)
        return 404, b""
    monkeypatch.setattr(remote_cache, "_request", slow)
    monkeypatch.setattr(remote_cache, "_shared", None)
    cache = remote_cache.RemoteCache(CacheConfig("http://slow.example:8080", budget=0.25))
    assert [artifact.arrive(fake_target(tmp_path, i), cache) for i in range(5)] == [(None, [])] * 5
    assert len(asked) == 2
    [warning] = cache.drain_warnings()
    assert warning.startswith("remote cache http://slow.example:8080 switched off for the rest of this run: 0.3 s "
                              "lost waiting on it, past cache_budget=0.25 s")


def test_a_cache_slower_than_compiling_is_switched_off_after_its_first_miss_saying_so_once(tmp_path, monkeypatch):
    """Every answer just under cache_timeout and compiles far faster: 4 targets took 73 s with a cache that
    answered in 9 s. Once the run has waited SLOW_FLOOR_S on it and it answers more slowly than twice a compile
    here, no request more."""
    asked = []

    def slow(cfg, method, path, data=None, **_):
        asked.append(method)
        time.sleep(0.15)
        return (404, b"") if method == "GET" else (200, b"")
    monkeypatch.setattr(remote_cache, "_request", slow)
    monkeypatch.setattr(remote_cache, "_shared", None)
    monkeypatch.setattr(remote_cache, "SLOW_FLOOR_S", 0.2)
    monkeypatch.setattr(remote_cache.artifact, "files_of", lambda d: {"meta.json": b"{}", "k.cubin": b"x"})
    cache = remote_cache.RemoteCache(CacheConfig("http://slow.example:8080", timeout=10.0))
    for i in range(4):
        target = fake_target(tmp_path, i)
        assert artifact.arrive(target, cache) == (None, [])
        time.sleep(0.01)   # the compile here
        cache.keep(target)
    assert asked == ["GET", "PUT"]   # the first miss and the first blob's upload, then nothing
    [warning] = cache.drain_warnings()
    assert re.fullmatch(r"remote cache http://slow\.example:8080 switched off for the rest of this run: it answers "
                        r"more slowly than compiling here \(0\.\d s a request on average, cache_timeout=10 s; 0\.\d s "
                        r"a compile\): check the server or the network to it; building locally", warning), warning


def test_the_budget_is_one_for_the_whole_run_across_forked_workers(monkeypatch):
    import os
    monkeypatch.setattr(remote_cache, "_shared", None)
    remote_cache.share_budget()   # doit's master, before it forks its workers
    cfg = CacheConfig("http://slow.example:8080", budget=1.0)
    pid = os.fork()
    if pid == 0:   # a worker that spends the budget
        remote_cache.RemoteCache(cfg)._add(remote_cache.WAITED, 1.5, remote_cache.REQUESTS)
        os._exit(0)
    os.waitpid(pid, 0)
    other = remote_cache.RemoteCache(cfg)   # another worker: off, without a warning of its own
    assert other._off() and other.drain_warnings() == []


@pytest.fixture
def answering():
    """A local HTTP server answering every GET with what the test sets: (status, headers, body chunks)."""
    import http.server
    import threading

    class Handler(http.server.BaseHTTPRequestHandler):
        answer = (200, {}, [b""])

        def do_GET(self):
            status, headers, chunks = Handler.answer
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.end_headers()
            try:
                for chunk in chunks:
                    self.wfile.write(chunk)
            except OSError:   # the client stopped reading
                pass

        def log_message(self, *args):
            pass
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield Handler, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_an_answer_announced_over_its_limit_is_refused_before_it_is_read(answering):
    handler, url = answering
    handler.answer = (200, {"Content-Length": str(8 << 30)}, (b"\0" * (1 << 20) for _ in range(8 << 10)))
    with pytest.raises(remote_cache.TooLarge, match="announced as 8589934592 bytes"):
        remote_cache._request(CacheConfig(url, timeout=5), "GET", "/cas/" + "0" * 64, limit=1 << 20)


def test_an_answer_growing_past_its_limit_is_cut_at_the_limit(answering, tmp_path):
    """A padded /ac/ entry with no Content-Length (read until the server closes): refused at AC_LIMIT, a miss."""
    import tracemalloc
    handler, url = answering
    entry = json.dumps({"format": "kforge-ac-1", "files": [], "pad": " " * (50 << 20)}).encode()
    handler.answer = (200, {"Connection": "close"}, (entry[i:i + (1 << 16)] for i in range(0, len(entry), 1 << 16)))
    cache = remote_cache.RemoteCache(CacheConfig(url, timeout=5))
    tracemalloc.start()
    try:
        hit, [warning] = artifact.arrive(fake_target(tmp_path, 1), cache)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert hit is None
    assert f"/ac/{1:064x} is over the limit of 65536 bytes" in warning and peak < 4 << 20, (warning, peak)


def test_a_remote_hit_is_kept_in_the_local_cache_which_is_asked_first(server, tmp_path):
    """Local cache, then remote cache, then compile: what the remote cache gave is kept locally, so a third
    checkout of this user finds it there without asking the server."""
    url = server.url
    doit(project(tmp_path, "first", factor="12"), f"cache={url}")   # uploads; no local cache (tests' default)
    local = {"KFORGE_LOCAL_CACHE": str(tmp_path / "local")}
    second = project(tmp_path, "second", factor="12")
    out = doit(second, f"cache={url}", env=local).stdout
    assert {r["origin"] for r in records(second)} == {"remote cache"} and "4 from the remote cache" in out
    third = project(tmp_path, "third", factor="12")
    out = doit(third, "cache=http://127.0.0.1:9", env=local).stdout   # a server that is down is never asked
    assert {r["origin"] for r in records(third)} == {"local cache"} and "warning" not in out, out
    assert binaries(third) == binaries(second)


def test_a_cache_whose_every_entry_is_refused_is_switched_off_after_a_few_saying_so_once(tmp_path, monkeypatch):
    """A server answering every key with garbage (or with a body over the limit) was one warning per target, the
    whole run through: after REFUSED_LIMIT refused entries and none taken, it is asked nothing more."""
    asked = []

    def liar(cfg, method, path, data=None, **_):
        asked.append(path)
        if len(asked) % 2:
            raise remote_cache.TooLarge(f"{path} is over the limit of 65536 bytes")
        return 200, b"[1, 2"
    monkeypatch.setattr(remote_cache, "_request", liar)
    monkeypatch.setattr(remote_cache, "_shared", None)
    cache = remote_cache.RemoteCache(CacheConfig("http://liar.example:8080"))
    warnings = [w for i in range(8) for w in artifact.arrive(fake_target(tmp_path, i), cache)[1]]
    assert len(asked) == remote_cache.REFUSED_LIMIT and len(warnings) == remote_cache.REFUSED_LIMIT
    [off] = cache.drain_warnings()
    assert off.startswith("remote cache http://liar.example:8080 switched off for the rest of this run: every entry "
                          "it answered was refused (3 of 3; each is named above)"), off


def test_a_cache_that_gives_a_good_entry_among_refused_ones_stays_on(tmp_path, monkeypatch):
    monkeypatch.setattr(remote_cache, "_shared", None)
    cache = remote_cache.RemoteCache(CacheConfig("http://mixed.example:8080"))
    for _ in range(4):
        cache._add(remote_cache.ENTRIES, 1.0)
    for _ in range(3):
        cache._add(remote_cache.REFUSED, 1.0)   # 3 refused of 4 answered: one was taken
    assert not cache._off() and cache.drain_warnings() == []


def test_a_cache_that_serves_every_target_slowly_is_compared_with_the_last_runs_compiles(tmp_path, monkeypatch):
    """A cache serving hits at 3 s a request: 4 targets of 0.3 s took 18.4 s, without a word, since the run
    compiled nothing to compare it with. The last run's build-report.json says what a compile costs here."""
    report = tmp_path / "out" / "build-report.json"
    report.parent.mkdir()
    report.write_text(json.dumps({"tasks": [{"name": f"k:{i}@sm_90a", "origin": "compiled", "compile_seconds": 0.3}
                                            for i in range(4)] + [{"origin": "compiled", "compile_seconds": "x"}, 7]}))
    monkeypatch.setattr(remote_cache, "_shared", None)
    remote_cache.share_budget(report)
    cache = remote_cache.RemoteCache(CacheConfig("http://slow.example:8080"))
    cache._add(remote_cache.WAITED, 3.0, remote_cache.REQUESTS)
    cache._add(remote_cache.WAITED, 3.0, remote_cache.REQUESTS)   # two slow requests: 6 s waited, past SLOW_FLOOR_S
    assert cache._off()
    [warning] = cache.drain_warnings()
    assert "it answers more slowly than compiling here (3.0 s a request on average, cache_timeout=10 s; 0.3 s a " \
           "compile)" in warning, warning


@pytest.mark.parametrize("text", ["", "[1]", '{"tasks": 7}', '{"tasks": [{"origin": "compiled", "compile_seconds": '
                                  '-1}]}', "\x00" * 10])
def test_a_last_report_that_says_nothing_usable_leaves_no_compile_time(tmp_path, text):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "build-report.json").write_text(text)
    assert remote_cache.last_compiles(tmp_path / "out" / "build-report.json") == (0.0, 0)
    assert remote_cache.last_compiles(tmp_path / "missing.json") == (0.0, 0)


@pytest.mark.parametrize("sha256", ["../../etc/passwd", "x" * 60_000])
def test_an_entry_naming_a_blob_that_is_not_a_sha256_is_refused_in_one_short_line(tmp_path, monkeypatch, sha256):
    """remote_cache.py 152 (an /ac/ entry whose file names no sha256): reachable from whoever writes to the cache,
    never run in the whole suite's coverage. No /cas/ request is made for it."""
    target = fake_target(tmp_path, 1)
    entry = json.dumps({"format": "kforge-ac-1", "files": [{"name": "meta.json", "sha256": sha256},
                                                           {"name": "k.cubin", "sha256": "0" * 64}]}).encode()
    asked = served(monkeypatch, {f"/ac/{target.key}": entry})
    hit, [warning] = artifact.arrive(target, remote_cache.RemoteCache(CacheConfig("http://cache.example:8080")))
    assert hit is None and asked == [f"GET /ac/{target.key}"]
    assert warning.startswith(f"cache entry http://cache.example:8080/ac/{target.key} for scale:c1@sm_90a rejected "
                              f"(entry names a blob '{sha256[:20]}")
    assert "\n" not in warning and len(warning) < 600, warning[:300]


def test_a_cache_answering_an_http_error_is_one_warning_and_asked_no_more(tmp_path, monkeypatch):
    """remote_cache.py 212 (a GET answered neither 200 nor 404): never run in the whole suite's coverage."""
    asked = []

    def request(cfg, method, path, data=None, **_):
        asked.append(path)
        return 500, b"oops"
    monkeypatch.setattr(remote_cache, "_request", request)
    monkeypatch.setattr(remote_cache, "_shared", None)
    cache = remote_cache.RemoteCache(CacheConfig("http://cache.example:8080"))
    assert [artifact.arrive(fake_target(tmp_path, i), cache) for i in range(3)] == [(None, [])] * 3
    assert asked == [f"/ac/{fake_target(tmp_path, 0).key}"]
    assert cache.drain_warnings() == [f"remote cache http://cache.example:8080 unusable (GET /ac/{0:064x}: HTTP 500); "
                                      f"building locally without it"]


@pytest.mark.parametrize("answer, said", [
    ((403, b""), "HTTP 403"),
    (OSError("Connection reset by peer"), "Connection reset by peer"),
    (remote_cache.TooLarge("the answer is over 65536 bytes"), "the answer is over 65536 bytes"),
])
def test_an_upload_the_cache_refuses_or_breaks_is_one_warning_and_uploads_no_more(tmp_path, monkeypatch, answer,
                                                                                  said):
    """remote_cache.py 220-225 (a PUT failing or answered other than 2xx): never run in the whole suite's
    coverage. The build keeps its artifact; the cache is asked nothing more."""
    from pathlib import Path
    asked = []

    def request(cfg, method, path, data=None, **_):
        asked.append(f"{method} {path}")
        if isinstance(answer, Exception):
            raise answer
        return answer
    monkeypatch.setattr(remote_cache, "_request", request)
    monkeypatch.setattr(remote_cache, "_shared", None)
    targets = [fake_target(tmp_path, i) for i in range(2)]
    for target in targets:
        Path(target.out_dir).mkdir(parents=True)
        (Path(target.out_dir) / "k.cubin").write_bytes(b"\x7fELF")
        (Path(target.out_dir) / "meta.json").write_text('{"binary": "k.cubin"}')
    cache = remote_cache.RemoteCache(CacheConfig("http://cache.example:8080"))
    assert [cache.keep(t) for t in targets] == [[], []]
    [put] = asked
    assert put.startswith("PUT /cas/")
    assert cache.drain_warnings() == [f"remote cache http://cache.example:8080 unusable ({put}: {said}); building "
                                      f"locally without it"]
    assert all((Path(t.out_dir) / "k.cubin").exists() for t in targets)
