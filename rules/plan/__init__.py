"""The plan: specs -> targets, one per (kernel, config, arch), each with its action key (keys, targets), kept
between runs as the catalog (catalog), and the toolchains a key names: which ld.lld FlyDSL links with
(amd_linker; triton_lld when it is Triton's own).

May import: base, load, declare, store."""
