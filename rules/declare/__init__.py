"""What a user declares: specs/*.toml and Python catalogs (`from kforge.declare import family`) become
frozen Specs; sweeps make their configs; Triton options a spec may set; record files become families.

May import: base, load."""


def __getattr__(name):
    """`from kforge.declare import family`, a Python catalog's one import, without loading the spec machinery
    for every module of this package."""
    if name == "family":
        from kforge.declare.python_catalog import family
        return family
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
