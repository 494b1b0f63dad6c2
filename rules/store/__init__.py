"""The store under out/: every path in it (layout), the one guard for writes and removals inside it
(guard), atomic file writes (files), the artifact's on-disk format and its checks (artifact), the observed
inputs it was built from (inputs), the run lock and scratch space.

May import: base, load, declare."""
