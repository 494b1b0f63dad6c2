"""Artifacts shared beyond one out/: the local cache (every checkout of this user), the remote cache (Bazel's
HTTP protocol) and a loopback nginx to try it with (nginx_cache), and compiles on a Dask cluster.

May import: base, load, declare, store, plan."""
