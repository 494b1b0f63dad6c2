"""Where kforge meets doit: DOIT_CONFIG and the runner (config, runner), the dependency-file backend
(backend), kforge's doit commands (commands), targets as doit tasks (tasks), and what dodo.py yields
(dodo_tasks).

May import: every station below it."""
