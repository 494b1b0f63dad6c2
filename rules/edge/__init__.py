"""Where kforge meets doit: DOIT_CONFIG and the runner (config), the dependency-file backend
(backend), kforge's doit commands (commands), and what dodo.py yields: the catalog and its targets as doit tasks
(dodo_tasks).

May import: every station below it."""
