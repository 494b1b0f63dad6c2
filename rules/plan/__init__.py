"""The plan: specs -> targets, one per (kernel, config, arch), each with its action key (keys, targets), kept
between runs as the catalog (catalog).

May import: base, load, declare, store, share, compile."""
