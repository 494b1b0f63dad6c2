"""rules/share/nginx_cache.py: the loopback nginx cache serves back what is PUT, logs each request, and keeps all its
files (temp paths included) in its own folder. The remote cache's protocol against it: tests/share/test_remote_cache.py."""
import contextlib
import itertools
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from kforge.share import nginx_cache

MARKER = "/.kforge-log-marker/"   # served() asks for these (a 404) to know the log has caught up
_markers = itertools.count()


def served(server, timeout: float = 10.0) -> list[str]:
    """Every request the server answered so far, as "METHOD /path" in the order served. nginx logs a request after
    its answer; its one worker serves and logs in order: once a marker request is logged, all answered before it
    are."""
    marker = f"{MARKER}{next(_markers)}"
    with contextlib.suppress(urllib.error.HTTPError):   # a 404 is the expected answer
        urllib.request.urlopen(f"{server.url}{marker}", timeout=timeout).close()
    deadline = time.monotonic() + timeout
    while True:
        lines = server.access_log.read_text().splitlines() if server.access_log.exists() else []
        answered = [" ".join(line.split('"')[1].split()[:2]) for line in lines]
        if f"GET {marker}" in answered:
            return [r for r in answered if not r.startswith(f"GET {MARKER}")]
        if time.monotonic() > deadline:
            raise RuntimeError(f"nginx did not log {marker} within {timeout:g} s ({server.access_log})")
        time.sleep(0.01)

needs_nginx = pytest.mark.skipif(nginx_cache.NGINX is None, reason="needs nginx (Debian's nginx-light)")


def test_every_path_the_configuration_names_lies_inside_the_servers_folder():
    conf = nginx_cache.CONF.format(root="/srv/kc", port=1, user="")
    paths = dict(re.findall(r"^\s*(\w+)\s+(/\S*);", conf, re.MULTILINE))   # directive -> the path it names
    assert {"pid", "error_log", "access_log", "root", "client_body_temp_path"} <= set(paths), paths
    assert all(p.startswith("/srv/kc/") for p in paths.values()), paths


@needs_nginx
def test_what_is_put_is_served_back_and_each_request_is_logged(tmp_path):
    with nginx_cache.serve(tmp_path) as server:
        put = urllib.request.Request(f"{server.url}/cas/abc", data=b"blob", method="PUT")
        urllib.request.urlopen(put, timeout=10).close()
        with urllib.request.urlopen(f"{server.url}/cas/abc", timeout=10) as got:
            assert got.read() == b"blob"
        assert (server.store / "cas" / "abc").read_bytes() == b"blob"
        assert served(server) == ["PUT /cas/abc", "GET /cas/abc"]
        assert served(server) == ["PUT /cas/abc", "GET /cas/abc"]   # its own log-marker requests are not listed


@needs_nginx
def test_the_command_line_says_the_url_to_give_cache_and_stops_nginx_when_killed(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "kforge.share.nginx_cache", str(tmp_path)], stdout=subprocess.PIPE,
                            text=True)
    try:
        line = proc.stdout.readline()
    finally:
        proc.terminate()
        proc.wait(10)
    assert line.startswith(f"serving {tmp_path / 'store'}: doit cache=http://127.0.0.1:")
    with pytest.raises(OSError):   # nginx is gone with it
        urllib.request.urlopen(line.split("cache=")[1].split()[0], timeout=5)


@pytest.mark.parametrize("nginx, said", [
    (None, "kforge: nginx is not installed (Debian: apt-get install nginx-light)"),
    ("#!/bin/sh\necho 'nginx: [emerg] bind() to 127.0.0.1:1 failed (98: Address already in use)' >&2\nexit 1\n",
     "kforge: nginx did not start: nginx: [emerg] bind() to 127.0.0.1:1 failed (98: Address already in use)"),
    ("#!/bin/sh\nexit 1\n", "kforge: nginx did not start: it said nothing"),
])
def test_the_command_line_without_nginx_or_with_one_that_fails_to_start_says_so_in_one_line(tmp_path, monkeypatch,
                                                                                            nginx, said):
    """nginx_cache.py 94 and 110-111 (no nginx; an nginx that exits at once): reachable by `python -m
    kforge.share.nginx_cache DIR` on a machine without nginx or with its port taken, never run in the whole suite's
    coverage. A stand-in script for nginx: no server is started."""
    if nginx is not None:
        (tmp_path / "nginx").write_text(nginx)
        (tmp_path / "nginx").chmod(0o755)
        nginx = str(tmp_path / "nginx")
    monkeypatch.setattr(nginx_cache, "NGINX", nginx)
    monkeypatch.setattr(nginx_cache.signal, "signal", lambda *args: None)   # main's SIGTERM handler: not pytest's
    with pytest.raises(SystemExit) as e:
        nginx_cache.main([str(tmp_path / "cache"), "--port", "1"])
    assert str(e.value) == said


def test_a_port_another_server_listens_on_is_refused_not_served_as_the_cache(tmp_path, monkeypatch):
    """`--port N` where another server listens: nginx could not bind and exited, but the wait for the port got that
    server's answer, and the command printed `serving ... cache=http://127.0.0.1:N`: a cache= URL to a stranger.
    Refused before nginx starts (a stand-in script for nginx; nothing is written)."""
    import socket
    (tmp_path / "nginx").write_text("#!/bin/sh\nexit 1\n")
    (tmp_path / "nginx").chmod(0o755)
    monkeypatch.setattr(nginx_cache, "NGINX", str(tmp_path / "nginx"))
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        with pytest.raises(RuntimeError) as e:
            with nginx_cache.serve(tmp_path / "cache", port):
                pass
    assert str(e.value) == (f"port {port} on 127.0.0.1 is taken (Address already in use); give another --port, or "
                            f"none for a free one")
    assert not (tmp_path / "cache").exists()
