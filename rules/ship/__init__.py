"""Shipping: `doit package` writes one deterministic wheel per arch (package, wheel).

May import: base, load, declare, store, share, compile, plan."""
