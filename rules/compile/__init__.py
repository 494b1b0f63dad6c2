"""Compiling one target: the doit action (action: out/ itself, the caches, Dask, or a compile here), the table
backends register their lowering in (lowering), the core that lowers in a warm child process and checks what it
lowered (core), the Triton and FlyDSL backends, and the AMD code objects' metadata.
Toolchains are imported only in compiling processes.

May import: base, load, declare, store, plan, share."""
