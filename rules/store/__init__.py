"""The store under out/ (its paths: base/layout.py): the one guard for writes and removals inside it (guard),
atomic file writes (files), the artifact's on-disk format and its checks (artifact), the one installer of an
artifact from any source (arrival), the observed inputs it was built from (inputs), the run lock and scratch.

May import: base, load, declare."""
