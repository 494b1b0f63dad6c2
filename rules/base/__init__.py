"""The vocabulary every station shares: errors, archs, dtypes, the Target record and the Layout of out/'s paths
it carries, settings and their table, the project's [tool.kforge] table, CPU counts, and the digests that decide
"is it current" (stamps).

May import: nothing of kforge (kforge_runtime's tables only)."""
