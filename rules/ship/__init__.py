"""Shipping: `doit package` writes one deterministic wheel per arch (package).

May import: base, load, declare, store, share, compile, plan."""
