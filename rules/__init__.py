"""kforge, the build system (imported as `kforge`; this folder is rules/): specs -> targets -> artifacts -> bundles."""
