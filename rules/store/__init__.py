"""The store under out/ (its paths: base/layout.py): the one guard for writes and removals inside it, and its
scratch folders (guard), atomic file writes (files), the artifact made, checked and installed from any source,
and read back (artifact), the observed inputs it was built from (inputs), and the run lock (run_lock).

May import: base, load, declare."""
