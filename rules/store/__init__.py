"""The store under out/ (its paths: base/layout.py): the one guard for writes and removals inside it (guard),
atomic file writes (files), the artifact made, checked and installed from any source, and read back (artifact),
the observed inputs it was built from (inputs), the run lock and scratch.

May import: base, load, declare."""
