"""A build's hub, kept for the project's next build: the toolchain is not imported again (Triton, and torch for a
library that requires it: 1.0-1.7 s on the dev machine, however few targets the build has).

At the end of a build that forked its own hub (the keep_hub setting), doit's master asks it for a keeper (Keep): a
copy of the hub in a session of its own, holding the toolchain and nothing of the build. The next build connects
to it (attach) and it forks that build's hub, which dies with the build. The keeper ends after `idle_s` seconds
with no build, or as soon as a build finds it stale (identity(), or a changed file it imported); that build says
why and forks its own hub (docs/correctness.md). Only its own user connects (SO_PEERCRED), at an address in Linux's
abstract socket namespace: nothing on disk, and the name goes with the process.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import select
import signal
import socket
import struct
import sys
import time
from typing import Any, Callable, NamedTuple

from kforge.base import stamps
from kforge.load import isolate, observe

KEEPER_NAME = b"kforge-keeper"   # what ps and /proc/PID/comm show for a keeper
MAX_KEEPERS = 2   # a user's keepers at once (each holds a toolchain: 170 MB with torch and Triton): the oldest go first
ATTACH_TIMEOUT_S = 1.0   # a keeper answers at once (it stats the files it imported): a slower one is ended
MAX_MESSAGE = 1 << 20
# what a shell sets for itself, which no compile reads: two runs of one command differ in them (`cd` sets
# OLDPWD, `time doit` sets `_`, a subshell SHLVL; PWD names the folder a link led to, and cwd is compared), and the
# rest of the session's variables, which are no compile's inputs either (observe.SESSION: another terminal's TERM)
SHELL_BOOKKEEPING = ("_", *observe.SESSION)


class Keep(NamedTuple):
    """The master's request to its hub, at the end of a build: fork a keeper for `root`'s next builds. `since`:
    when the master first imported kforge (kforge.IMPORTED_NS): a file changed after it keeps none (_become_keeper)."""
    root: str
    identity: dict
    idle_s: float
    since: int = 0


def address(root: str) -> bytes:
    """The keeper's abstract socket name: one per user and project folder."""
    named = f"{os.getuid()}\0{os.path.realpath(root)}".encode()
    return b"\0kforge-hub-" + hashlib.sha256(named).hexdigest()[:32].encode()


def identity(root: str) -> dict:
    """What a kept hub must share with the build that uses it, as JSON holds it: interpreter, command line, module
    path, working folder, environment (but a shell's bookkeeping), and the module path's folders outside the project."""
    project = os.path.realpath(root)
    folders = {}
    for entry in sys.path:
        where = os.path.realpath(entry or ".")
        if where != project and not where.startswith(project + os.sep):   # the project's own files are no
            folders[entry] = stamps.identity(entry)                        # hub's: servers import them fresh
    environ = {k: v for k, v in os.environ.items() if k not in SHELL_BOOKKEEPING}
    return {"uid": os.getuid(), "executable": sys.executable, "version": sys.version, "argv": list(sys.argv),
            "cwd": os.getcwd(), "path": list(sys.path), "environ": environ, "folders": folders}


def attach(root: str, asked: dict) -> tuple[socket.socket, int] | None:
    """In doit's master: (the socket to a hub forked for this build by the project's keeper, its pid), or None
    where there is no keeper, it is another user's, or it is stale for `asked` (identity())."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        sock.settimeout(ATTACH_TIMEOUT_S)
        try:
            sock.connect(address(root))
        except OSError:   # none listens: the usual case, nothing to say
            sock.close()
            return None
        peer, uid = _peer(sock)
        if uid != os.getuid():
            raise OSError("it is another user's")
        sock.send(json.dumps(asked).encode())
        try:
            answer = json.loads(sock.recv(MAX_MESSAGE))
        except TimeoutError:   # stopped, or stuck: it would hold the address for ever, each build waiting on it
            _end_stuck(peer)
            raise OSError(f"it did not answer within {ATTACH_TIMEOUT_S:g} s and was ended") from None
        if not isinstance(answer, dict) or not isinstance(answer.get("pid"), int):
            raise OSError(answer.get("stale", "no answer") if isinstance(answer, dict) else "no answer")
        sock.settimeout(None)
        return sock, answer["pid"]
    except Exception as e:   # one that answers nothing usable: the build forks its own hub, and says why
        sock.close()
        sys.stderr.write(f"kforge: the kept hub was not used ({e}); this build's hub imports the toolchain\n")
        return None


def _end_stuck(pid: int) -> None:
    """SIGKILL the keeper `pid` (this user's: the caller checked) that does not answer, if it is named as one."""
    with contextlib.suppress(OSError), open(f"/proc/{pid}/comm", "rb") as f:
        if f.read().strip() == KEEPER_NAME:
            os.kill(pid, signal.SIGKILL)


def ask_to_keep(hub: isolate.Hub, request: Keep, timeout: float = 10.0) -> bool:
    """In doit's master, before it closes the hub it forked: whether the hub forked a keeper. Sent on the hub's
    socket as a request is; a hub that has gone is not replaced."""
    try:
        with hub.ask(request, replace=False) as conn:   # the hub holds the only other end: its death ends the wait
            return conn.poll(timeout) and "kept" in conn.recv()
    except (OSError, EOFError):
        return False


def fork_keeper(request: Keep, handle: Callable[[Any, int], dict], forget: Callable[[], None]) -> dict:
    """In a hub, asked at the end of its build: fork the keeper (it serves the project's next builds with
    `handle`, as this hub did); {"kept": its pid} once it listens, or {"error": ...}."""
    ready, told = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(ready)
            _become_keeper(request, handle, forget, told)
        finally:
            os._exit(0)
    os.close(told)
    with os.fdopen(ready, "rb") as f:
        # to its end: the keeper closes its end right after "k", so once read it holds nothing of the build's
        # (nothing read: the keeper could not listen, another keeps the project)
        listening = f.read() == b"k"
    if not listening:
        os.waitpid(pid, 0)
        return {"error": "no keeper: the project's address is taken"}
    return {"kept": pid}


def _become_keeper(request: Keep, handle, forget, told: int) -> None:
    os.setsid()   # out of the build's process group (closing the hub kills that group) and off its terminal
    forget()   # the build's servers: they go with the hub
    isolate._leave_hub()
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.closerange(3, told)   # the build's files, sockets and pipes: none is held beyond it
    os.closerange(told + 1, min(os.sysconf("SC_OPEN_MAX"), 65536))
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        listener.bind(address(request.root))
    except OSError:
        return
    listener.listen(8)
    _make_room()
    isolate._name_process(KEEPER_NAME)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.write(told, b"k")   # the build ends now; what follows is the keeper's own time
    os.close(told)
    loaded = _loaded_files()
    # a file changed since the build's master first imported kforge may have been imported before the change: what
    # this process holds is then not what the file says, and no stat taken now could tell; so none is kept
    if not request.since or any(found is None or found[2] >= request.since   # [2]: its ctime
                                 for found in loaded.values()):
        return
    _keep(listener, request._replace(identity=json.loads(json.dumps(request.identity))), loaded, handle)


def _keep(listener: socket.socket, request: Keep, loaded: dict, handle) -> None:
    """The keeper's loop: a hub forked for each build that connects and is not refused. Idle for request.idle_s,
    stale, or told to end (SIGTERM): it listens no more, and ends once the hubs it forked (builds in progress) have."""
    hubs: set[int] = set()
    last = time.monotonic()
    ending: list = []
    signal.signal(signal.SIGTERM, lambda *_: ending.append(True))
    while True:
        hubs = {pid for pid in hubs if not isolate.reaped(pid)}
        if hubs:
            last = time.monotonic()
        elif ending or time.monotonic() - last > request.idle_s:
            return
        if ending:
            listener.close()   # its name is free for the keeper of the build that found it stale
            time.sleep(0.2)
            continue
        if select.select([listener], [], [], 1.0)[0]:
            last = time.monotonic()
            _serve_one(listener, request, loaded, handle, hubs, ending)


def _serve_one(listener: socket.socket, request: Keep, loaded: dict, handle, hubs: set, ending: list) -> None:
    """One build that connected: a hub forked for it, or why not."""
    conn, _ = listener.accept()
    with conn, contextlib.suppress(Exception):   # a build that went, or sent what no build sends: the keeper goes on
        conn.settimeout(ATTACH_TIMEOUT_S)
        if ending or _peer(conn)[1] != os.getuid():   # told to end (SIGTERM) since it last looked: it serves no more
            return
        asked = json.loads(conn.recv(MAX_MESSAGE))
        if not isinstance(asked, dict):   # no build's: dropped, the keeper stays for the builds
            return
        stale = _stale(request.identity, asked, loaded)
        if stale:
            conn.send(json.dumps({"stale": stale}).encode())
            ending.append(True)
            return
        conn.settimeout(None)
        keeper = os.getpid()
        pid = os.fork()
        if pid == 0:   # this build's hub: never returns
            listener.close()
            try:   # the folder by its name now (the one the keeper started in may have been removed and made again)
                os.chdir(request.identity["cwd"])
            except OSError:
                os._exit(1)   # the build's requests find no hub, and it forks one of its own
            isolate._run_hub(conn, handle, keeper)
        hubs.add(pid)
        conn.send(json.dumps({"pid": pid}).encode())


def _stale(kept: dict, asked: dict, loaded: dict) -> str:
    """Why a kept hub may not serve this build ("" where it may)."""
    for key in sorted(kept.keys() | asked.keys()):
        if kept.get(key) != asked.get(key):
            if key == "environ" and isinstance(asked.get(key), dict):   # named, never shown (a value may be secret)
                names = sorted(n for n in kept[key].keys() | asked[key].keys() if kept[key].get(n) != asked[key].get(n))
                return f"the environment differs in {', '.join(names[:3])}{' ...' if len(names) > 3 else ''}"
            return f"the build's {key} differs"
    for path, stat in loaded.items():
        if stamps.identity(path) != stat:
            return f"{path} changed"
    return ""


def _make_room() -> None:
    """End this user's oldest keepers (of other projects, or other environments) beyond MAX_KEEPERS - 1."""
    mine = []
    for pid, name, fields in isolate.processes():
        with contextlib.suppress(OSError, ValueError, IndexError):
            if name == KEEPER_NAME and os.stat(f"/proc/{pid}").st_uid == os.getuid():
                mine.append((int(fields[19]), pid))   # starttime, in clock ticks
    for _, pid in sorted(mine)[:max(0, len(mine) - MAX_KEEPERS + 1)]:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGTERM)


def _loaded_files() -> dict:
    """{file: its stat now} of each module this process imported by an absolute path (torch's made modules are
    named `_ops.py` and `_classes.py`: no file of theirs is read)."""
    files = {}
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if isinstance(path, str) and os.path.isabs(path):
            files[path] = stamps.identity(path)
    return files


def _peer(sock: socket.socket) -> tuple[int, int]:
    """(pid, uid) of the process at the other end of a connected Unix socket, as the kernel knows it."""
    pid, uid, _ = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    return pid, uid
