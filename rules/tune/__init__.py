"""Tuning: `doit tune` tasks (tasks) and the GPU half that benchmarks every built config (gpu_bench).

May import: base, load, declare, store, share, compile, plan, ship."""
