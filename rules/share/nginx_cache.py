"""A remote cache to try kforge's `cache=` with: nginx serving a directory over WebDAV PUT on loopback.

    python -m kforge.share.nginx_cache DIR [--port N]    # serves DIR/store until Ctrl-C; prints the cache= URL

nginx's dav module (Debian's nginx-light) is the smallest server that stores what is PUT under /ac/ and /cas/ and
serves it back. For a shared server, keep CONF's `location` block (and `client_max_body_size 0`) behind the access
control your network needs (docs/caching.md). The tests' and the benchmarks' cache server is this one.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

# /usr/sbin is often not on a non-root user's PATH
NGINX = shutil.which("nginx") or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None)

# Every temp path inside `root`: nginx's compiled-in defaults lie under /var/lib/nginx, often not writable. One worker:
# the access log lists requests in the order they were answered.
CONF = """
{user}
daemon off;
worker_processes 1;
pid {root}/nginx.pid;
error_log {root}/error.log;
events {{ worker_connections 64; }}
http {{
    access_log {root}/access.log;
    client_body_temp_path {root}/body;
    proxy_temp_path {root}/proxy;
    fastcgi_temp_path {root}/fastcgi;
    uwsgi_temp_path {root}/uwsgi;
    scgi_temp_path {root}/scgi;
    client_max_body_size 0;
    server {{
        listen 127.0.0.1:{port};
        root {root}/store;
        location / {{
            dav_methods PUT;
            create_full_put_path on;
        }}
    }}
}}
"""


@dataclass(frozen=True)
class CacheServer:
    url: str           # what `cache=` takes
    store: Path        # what the server serves: store/ac/<key>, store/cas/<sha256>
    access_log: Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serve(root: Path, port: int | None = None):
    """Yields a CacheServer while nginx serves root/store on 127.0.0.1 (a free port unless given); stops it after."""
    if NGINX is None:
        raise RuntimeError("nginx is not installed (Debian: apt-get install nginx-light)")
    root = Path(root).absolute()
    if port:   # another server listening there would answer the wait below: "serving" while nginx had exited
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)   # as nginx binds it
            try:
                s.bind(("127.0.0.1", port))
            except OSError as e:
                raise RuntimeError(f"port {port} on 127.0.0.1 is taken ({e.strerror}); give another --port, or none "
                                   f"for a free one") from None
    (root / "store").mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    conf = root / "nginx.conf"
    conf.write_text(CONF.format(root=root, port=port, user="user root;" if os.geteuid() == 0 else ""))
    with open(root / "stderr.log", "wb") as stderr:   # errors before nginx opens error.log (a bad conf) go here
        proc = subprocess.Popen([NGINX, "-c", str(conf), "-p", str(root)], stderr=stderr)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    said = "".join(p.read_text() for p in (root / "stderr.log", root / "error.log") if p.exists())
                    raise RuntimeError(f"nginx did not start: {said.strip() or 'it said nothing'}") from None
                time.sleep(0.05)
        yield CacheServer(f"http://127.0.0.1:{port}", root / "store", root / "access.log")
    finally:
        proc.terminate()
        proc.wait(5)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m kforge.share.nginx_cache", description=__doc__.splitlines()[0])
    ap.add_argument("dir", type=Path, help="nginx's files and the cache's store/ go here (created if missing)")
    ap.add_argument("--port", type=int, default=None, help="on 127.0.0.1 (default: a free one)")
    a = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))   # `kill` stops nginx too (the with block's exit)
    try:
        with serve(a.dir, a.port) as server:
            print(f"serving {server.store}: doit cache={server.url} (Ctrl-C stops it)", flush=True)
            while True:
                time.sleep(3600)
    except KeyboardInterrupt:
        pass
    except RuntimeError as e:
        raise SystemExit(f"kforge: {e}") from None


if __name__ == "__main__":
    main()
