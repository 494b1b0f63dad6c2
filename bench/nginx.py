"""A throw-away remote cache: Debian's nginx serving a directory with WebDAV PUT on loopback.

Used by bench/remote_cache.py (the tests have their own, tests/cache_server.py: tests and benchmarks do not
import each other). Needs nginx with the dav module (Debian's nginx-light has it; .ci/run installs it).
"""
from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

NGINX = shutil.which("nginx") or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None)
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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def webdav_server(root: Path):
    """Yields (url, store directory) while nginx serves root/store; stops it afterwards."""
    if NGINX is None:
        raise RuntimeError("nginx is not installed (Debian: apt-get install nginx-light)")
    (root / "store").mkdir(parents=True, exist_ok=True)
    port = free_port()
    conf = root / "nginx.conf"
    conf.write_text(CONF.format(root=root, port=port, user="user root;" if os.geteuid() == 0 else ""))
    proc = subprocess.Popen([NGINX, "-c", str(conf), "-p", str(root)], stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError(f"nginx did not start: {(root / 'error.log').read_text()}") from None
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}", root / "store"
    finally:
        proc.terminate()
        proc.wait(5)
