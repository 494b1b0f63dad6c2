"""kforge, the build system (imported as `kforge`; this folder is rules/): specs -> targets -> artifacts -> bundles.

Its stations, each a package that imports only those before it (tests/repo/test_imports.py holds this):
base, load, declare, store, plan, share, compile, ship, tune, report, edge. The modules at this level are
entry points that nothing in kforge imports: dodo (what a project's dodo.py imports) and the commands
`python -m kforge.timeline`, `kforge.ci_summary` and `kforge.charts`."""
STATIONS = ("base", "load", "declare", "store", "plan", "share", "compile", "ship", "tune", "report", "edge")
