"""A shared build cache over Bazel's HTTP cache protocol: GET / PUT on /cas/<sha256> and /ac/<key>, served by
bazel-remote (with --disable_http_ac_validation: kforge's /ac/ entries are JSON, not ActionResult protos) or nginx
with WebDAV PUT. A target's action key names its /ac/ entry, a JSON list of the artifact's files by sha256, each a
/cas/ blob. A hit is checked (artifact.accept) before it counts; anything else is a miss and the target compiles. A
cache that is down or slow only warns, once per worker, and the build goes on locally.

What a server can cost a build is bounded: each request by `cache_timeout`, the run's waiting on it by
`cache_budget` (summed over every worker), a server whose every entry is refused by REFUSED_LIMIT, and each answer's
size (AC_LIMIT, a blob by the loader's limit on a binary), read a chunk at a time, never held beyond the limit.

With a shared secret (`cache_key=`) writers sign each /ac/ entry and readers refuse one whose tag is missing or
wrong before fetching a blob: whoever can write to the server but lacks the secret cannot make a reader take their
binary for a key.
"""
from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import re
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

from kforge.store import artifact, guard
from kforge.store.artifact import ArtifactCache, Candidate, CompileResult
from kforge_runtime.bundle import MAX_BINARY_BYTES

AC_FORMAT = "kforge-ac-1"
TAG = "hmac_sha256"   # the /ac/ entry's field holding its tag, with a secret configured
SHA256 = re.compile(r"[0-9a-f]{64}")
AC_LIMIT = 64 << 10   # bytes of an /ac/ entry (a real one is ~300)
CHUNK = 1 << 16
# the run's [seconds waited, off, requests, seconds compiling here, compiles, entries answered, entries refused],
# shared by the workers doit's master forks (share_budget)
_shared = None
WAITED, OFF, REQUESTS, COMPILING, COMPILES, ENTRIES, REFUSED = range(7)
SLOW_FLOOR_S = 5.0   # a cache is judged slower than compiling only once the run has waited this long on it
REFUSED_LIMIT = 3   # entries refused in a row from the run's first: a server that answers every key with garbage


def share_budget(build_report: Path | None = None) -> None:
    """In doit's master, before its workers fork: one cache_budget for the whole run. What a compile costs here
    starts from the last run's build-report.json: a run the cache serves whole compiles nothing to compare with."""
    global _shared
    if _shared is None:
        import multiprocessing
        _shared = multiprocessing.Array("d", 7)
        from kforge.base.layout import Layout
        _shared[COMPILING], _shared[COMPILES] = last_compiles(build_report or Layout(Path.cwd()).build_report)


def last_compiles(build_report: Path) -> tuple[float, int]:
    """(seconds, count) of the compiles build-report.json records; (0, 0) where it cannot be read or is of another
    shape (untrusted: out/ may be restored from elsewhere)."""
    import math
    from kforge.store import files
    try:
        tasks = json.loads(files.read_bytes(build_report)).get("tasks")
        times = [t["compile_seconds"] for t in tasks if isinstance(t, dict) and t.get("origin") == "compiled"
                 and type(t.get("compile_seconds")) in (int, float) and math.isfinite(t["compile_seconds"])
                 and t["compile_seconds"] >= 0]
    except (OSError, ValueError, AttributeError, TypeError, RecursionError):
        return 0.0, 0
    return float(sum(times)), len(times)


def _why_off(counts: list, budget: float, timeout: float) -> str | None:
    """Why the run should stop asking the cache (None: it should not): every entry it answered refused (from
    REFUSED_LIMIT of them), its waits past cache_budget, or answers slower on average than twice a compile here,
    once the run has waited SLOW_FLOOR_S on it."""
    waited, requests, compiling, compiles = counts[WAITED], counts[REQUESTS], counts[COMPILING], counts[COMPILES]
    if counts[REFUSED] >= REFUSED_LIMIT and counts[REFUSED] >= counts[ENTRIES]:
        return (f"every entry it answered was refused ({counts[REFUSED]:.0f} of {counts[ENTRIES]:.0f}; each is named "
                f"above): check the server, or its cache_key=")
    if waited > budget:
        return (f"{waited:.1f} s lost waiting on it, past cache_budget={budget:g} s (check the server, or raise "
                f"cache_budget=)")
    if compiles and requests and waited >= SLOW_FLOOR_S and waited / requests > 2 * compiling / compiles:
        return (f"it answers more slowly than compiling here ({waited / requests:.1f} s a request on average, "
                f"cache_timeout={timeout:g} s; {compiling / compiles:.1f} s a compile): check the server or the "
                f"network to it")
    return None


class TooLarge(ValueError):
    """An answer larger than what was asked for can be (a hostile or broken server)."""


@dataclass(frozen=True)
class CacheConfig:
    url: str
    read_only: bool = False
    timeout: float = 10.0   # seconds per request (`cache_timeout=` / KFORGE_CACHE_TIMEOUT, rules/base/settings.py)
    # the signing secret (`cache_key=`), kept out of repr: doit task actions carry this config, a repr may be logged
    key: str | None = field(default=None, repr=False)
    budget: float = 300.0   # seconds the run may wait on the cache in all (`cache_budget=`)


def tag(secret: str, action_key: str, files: list[dict]) -> str:
    """An /ac/ entry's tag: HMAC-SHA256 in hex, keyed by the secret's bytes (UTF-8, surrogateescape: an environment
    value's raw bytes), over json.dumps([AC_FORMAT, action_key, [[name, sha256], ...]], separators=(",", ":")),
    files in the entry's order: an entry cannot be altered, nor moved to another key, without the secret."""
    message = json.dumps([AC_FORMAT, action_key, [[f["name"], f["sha256"]] for f in files]], separators=(",", ":"))
    return hmac.new(secret.encode("utf-8", "surrogateescape"), message.encode(), hashlib.sha256).hexdigest()


class RemoteCache(ArtifactCache):
    """The remote cache as an ArtifactCache."""

    def __init__(self, cfg: CacheConfig):
        self.cfg = cfg
        self.down = False   # after one failure this process stops asking (one warning, not one per target)
        self.warnings: list[str] = []   # handed to the build report with the next target's result
        self.counts = [0.0] * 7   # this process's counts (WAITED ...) where no run shares them (share_budget)
        self.missed: dict[str, float] = {}   # target key -> when its lookup missed: a keep() after it timed a compile

    def drain_warnings(self) -> list[str]:
        drained, self.warnings = self.warnings, []
        return drained

    lookup_span = "cache lookup"   # the build trace's names for its phases
    keep_span = "cache upload"

    def lookup(self, target) -> Candidate | None:
        """The target's entry and its blobs, unchecked but for the entry's own format, tag and blob digests; None
        on a miss or a cache down, ValueError for a bad entry."""
        try:
            entry = self._get(f"/ac/{target.key}", AC_LIMIT)
        except TooLarge:   # an answer all the same: refused() follows
            self._add(ENTRIES, 1.0)
            raise
        if entry is None:
            if not self.down:   # keep() times the compile the cache did not save from here
                self.missed[target.key] = time.monotonic()
            return None
        self._add(ENTRIES, 1.0)
        # a malformed entry is a miss, never a failed build (RecursionError: JSON nested deeper than the parser goes)
        try:
            ac = json.loads(entry)
            if not isinstance(ac, dict) or ac.get("format") != AC_FORMAT:
                raise ValueError(f"not a {AC_FORMAT} entry")
            if self.cfg.key is not None:
                self._check_tag(ac, target.key)
            if not (isinstance(ac["files"], list) and len(ac["files"]) == 2):   # meta.json and its binary
                raise ValueError("it does not list exactly two files (meta.json and one binary)")
            files = {}
            for f in ac["files"]:
                if not (isinstance(f["sha256"], str) and SHA256.fullmatch(f["sha256"])):
                    raise ValueError(f"entry names a blob {artifact._brief(f['sha256'])} that is not a sha256")
                artifact.plain_name(f["name"])   # before any request: the entry is untrusted
                data = self._get(f"/cas/{f['sha256']}", MAX_BINARY_BYTES)
                if data is None and self.down:   # the cache failed or went off just now: said once already
                    return None
                if data is None or hashlib.sha256(data).hexdigest() != f["sha256"]:
                    raise ValueError(f"blob {f['sha256']} for {f['name']} is missing or does not match its sha256")
                files[f["name"]] = data
        except (KeyError, TypeError, RecursionError) as e:
            raise ValueError(str(e)) from None
        return Candidate(files, CompileResult(from_cache=True))

    def refused(self, target, error: Exception) -> list[str]:
        guard.remove_artifact_dir(target.layout.out, Path(target.out_dir))
        self._add(REFUSED, 1.0)
        return [f"cache entry {self.cfg.url}/ac/{target.key} for {target.name} rejected ({error}); compiling it "
                f"here (whoever can write to the cache put it there: check the server, or set cache_key=)"]

    def keep(self, target) -> list[str]:
        """Upload the freshly built artifact: blobs first, then the /ac/ entry that points at them. A failed upload
        warns through drain_warnings."""
        missed = self.missed.pop(target.key, None)
        if missed is not None:   # from its miss to here: the compile the cache did not save (install included)
            self._add(COMPILING, time.monotonic() - missed, COMPILES)
        if self.cfg.read_only or self.down:
            return []
        files = []
        for name, data in artifact.files_of(Path(target.out_dir)).items():
            digest = hashlib.sha256(data).hexdigest()
            if not self._put(f"/cas/{digest}", data):
                return []
            files.append({"name": name, "sha256": digest})
        entry = {"format": AC_FORMAT, "target": target.name, "files": files}
        if self.cfg.key is not None:
            entry[TAG] = tag(self.cfg.key, target.key, files)
        self._put(f"/ac/{target.key}", json.dumps(entry).encode())
        return []

    def _check_tag(self, ac: dict, action_key: str) -> None:
        """ValueError unless the entry carries the tag this cache's secret makes for it (compared in constant time)."""
        given = ac.get(TAG)
        if not (isinstance(given, str) and SHA256.fullmatch(given)):
            raise ValueError(f"it carries no {TAG} tag while cache_key is set: written without a key, or altered; "
                             f"every writer needs the same cache_key")
        if not hmac.compare_digest(given, tag(self.cfg.key, action_key, ac["files"])):
            raise ValueError("its tag does not match cache_key: written with another key, altered, or moved from "
                             "another action key")

    def _get(self, path: str, limit: int) -> bytes | None:
        """The body of a 200 answer, None for any other (or a cache that is off); TooLarge past `limit` bytes."""
        if self._off():
            return None
        try:
            status, body = self._timed(self.cfg, "GET", path, limit=limit)
        except OSError as e:
            self._fail(f"GET {path}: {e}")
            return None
        if status == 200:
            return body
        if status != 404:
            self._fail(f"GET {path}: HTTP {status}")
        return None

    def _put(self, path: str, data: bytes) -> bool:
        if self._off():
            return False
        try:
            status, _ = self._timed(self.cfg, "PUT", path, data, limit=AC_LIMIT)
        except (OSError, TooLarge) as e:
            self._fail(f"PUT {path}: {e}")
            return False
        if status not in (200, 201, 204):
            self._fail(f"PUT {path}: HTTP {status}")
            return False
        return True

    def _timed(self, *args, **kwargs):
        """_request(*args), its time counted against the run's cache_budget."""
        start = time.monotonic()
        try:
            return _request(*args, **kwargs)
        finally:
            self._add(WAITED, time.monotonic() - start, REQUESTS)

    def _add(self, slot: int, amount: float, count: int | None = None) -> None:
        """Add to the run's counts (and one to `count`'s); switch the cache off for the rest of the run, with one
        warning, once _why_off says why."""
        counts = self.counts if _shared is None else _shared
        lock = _shared.get_lock() if _shared is not None else contextlib.nullcontext()
        with lock:
            counts[slot] += amount
            if count is not None:
                counts[count] += 1
            why = None if counts[OFF] else _why_off(list(counts), self.cfg.budget, self.cfg.timeout)
            counts[OFF] = counts[OFF] or why is not None
        if why is not None:
            self.down = True
            self.warnings.append(f"remote cache {self.cfg.url} switched off for the rest of this run: {why}; "
                                 f"building locally")

    def _off(self) -> bool:
        """Whether this process stops asking: the cache failed here, or the run switched it off (any worker)."""
        if not self.down and _shared is not None and _shared[OFF]:
            self.down = True
        return self.down

    def _fail(self, what: str) -> None:
        self.down = True
        self.warnings.append(f"remote cache {self.cfg.url} unusable ({what}); building locally without it")


_caches: dict[CacheConfig, RemoteCache] = {}


def cache_for(cfg: CacheConfig | None) -> RemoteCache | None:
    """One RemoteCache per config per process, so that "down" is remembered across this worker's targets."""
    if cfg is not None and cfg not in _caches:
        _caches[cfg] = RemoteCache(cfg)
    return _caches.get(cfg)


def _request(cfg: CacheConfig, method: str, path: str, data: bytes | None = None,
             limit: int = AC_LIMIT) -> tuple[int, bytes]:
    """(status, body) of one request that takes at most cfg.timeout seconds in all: a socket timeout alone bounds
    each read, so a server trickling a byte every few seconds would hold a build forever; at the deadline a timer
    shuts the socket. OSError (TimeoutError included) for anything that is not an HTTP answer in time; TooLarge
    for a body announced or found to be over `limit` bytes."""
    import http.client   # here, not at the top: every doit start imports this module, few use a cache
    import threading
    import urllib.parse
    url = urllib.parse.urlsplit(cfg.url)
    kind = http.client.HTTPSConnection if url.scheme == "https" else http.client.HTTPConnection
    conn = kind(url.hostname, url.port, timeout=cfg.timeout)
    expired = threading.Event()

    def expire():
        expired.set()
        if conn.sock is not None:
            with contextlib.suppress(OSError):
                conn.sock.shutdown(socket.SHUT_RDWR)
    timer = threading.Timer(cfg.timeout, expire)
    timer.start()
    try:
        conn.request(method, url.path.rstrip("/") + path, body=data)
        response = conn.getresponse()
        body = _read_at_most(response, limit, path)
    except (OSError, http.client.HTTPException) as e:
        if not expired.is_set():   # else the timeout below
            raise OSError(str(e) or type(e).__name__) from None
    finally:
        timer.cancel()
        conn.close()
    if expired.is_set():
        raise TimeoutError(f"timed out: no complete answer within {cfg.timeout:g} s (cache_timeout=)")
    return response.status, body


def _read_at_most(response, limit: int, path: str) -> bytes:
    announced = response.getheader("Content-Length")
    if announced is not None and announced.strip().isdigit() and int(announced) > limit:
        raise TooLarge(f"{path} is announced as {int(announced)} bytes, over the limit of {limit}")
    chunks, size = [], 0
    while chunk := response.read(CHUNK):
        size += len(chunk)
        if size > limit:
            raise TooLarge(f"{path} is over the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)
