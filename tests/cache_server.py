"""The tests' remote cache: Debian's nginx serving a directory with WebDAV PUT on loopback, its requests logged.

The tests' own launcher (bench/ keeps its own in bench/nginx.py: tests and benchmarks do not import each other).
Needs nginx with the dav module (Debian's nginx-light has it; .ci/run installs it).
"""
from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

# /usr/sbin is often not on a non-root user's PATH
NGINX = shutil.which("nginx") or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None)

# Every temp path inside `root`: nginx's compiled-in defaults lie under /var/lib/nginx, not writable here.
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
    url: str
    store: Path        # what the server serves: store/ac/<key>, store/cas/<sha256>
    access_log: Path

    def requests(self) -> list[str]:
        """Every request so far, as "METHOD /path" in the order served."""
        if not self.access_log.exists():
            return []
        return [" ".join(line.split('"')[1].split()[:2]) for line in self.access_log.read_text().splitlines()]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def webdav_server(root: Path):
    """Yields a CacheServer while nginx serves root/store; stops nginx afterwards."""
    if NGINX is None:
        raise RuntimeError("nginx is not installed (Debian: apt-get install nginx-light)")
    (root / "store").mkdir(parents=True, exist_ok=True)
    port = free_port()
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
