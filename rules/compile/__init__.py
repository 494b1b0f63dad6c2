"""Compiling one target: the doit action (action: out/, the caches, Dask, or a compile here), the core that
runs a backend in a warm child process and writes the artifact (core), the Triton and FlyDSL backends, and
what AMD code objects need (ld.lld, their metadata). Toolchains are imported only in compiling processes.

May import: base, load, declare, store, share."""
