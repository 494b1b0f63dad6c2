"""Running a project's and a library's code, bounded and observed: guarded child processes (load_guard,
isolate), reading sources without importing them (sources, installed), the autotune/heuristics probe
(entry_probe), the device model a CPU builder answers GPU queries with, and what a process read (observe).

May import: base."""
