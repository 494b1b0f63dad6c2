"""kforge, the build system (imported as `kforge`; this folder is rules/): specs -> targets -> artifacts -> bundles.

Its stations, each a package that imports only those before it (tests/repo/test_imports.py holds this):
base, load, declare, store, plan, share, compile, ship, tune, report, edge. The modules at this level are
entry points that nothing in kforge imports: dodo (what a project's dodo.py imports) and the commands
`python -m kforge.timeline`, `kforge.ci_summary` and `kforge.charts`."""
import time as _time

STATIONS = ("base", "load", "declare", "store", "plan", "share", "compile", "ship", "tune", "report", "edge")
# when this process first imported kforge: every module of kforge's and of the toolchain a build holds was read
# after it, so a file changed after it may be held as it was (rules/load/kept_hub.py keeps no hub then)
IMPORTED_NS = _time.time_ns()

# modules an older kforge had at its top level, before the stations: a dodo.py or script of that time imports them
RETIRED = frozenset("""amd_linker amdgpu_metadata archs arrival artifact build catalog compile_core cpus cuda_driver
    dask_executor declare device_model doit_backend doit_edge doit_runner dtypes elf entry_probe errors files
    flydsl_compile inputs installed isolate keys layout load_guard local_cache lowering nginx_cache observe out_dir
    package project project_config records remote_cache report run_lock scratch settings sources spec spec_model
    stamps sweep target targets tasks trace triton_compile triton_lld triton_options tune tune_gpu tuner
    wheel""".split()) - set(STATIONS)


class _RetiredNames:
    """The last finder on sys.meta_path: importing a module an older kforge had at its top level (`from
    kforge.doit_edge import *`) is one line saying what to import now, not doit's traceback."""

    @staticmethod
    def find_spec(fullname, path=None, target=None):
        package, _, name = fullname.partition(".")
        if fullname == f"{__name__}.doit_commands":   # where the doit commands were: a pyproject.toml may name it
            _sys.stderr.write("kforge: pyproject.toml's [tool.doit.plugins.command] names kforge.doit_commands, which "
                              "is now kforge.edge.commands: write `forget = \"kforge.edge.commands:Forget\"` (and "
                              "info, clean, prune, cache the same way), as kforge's own pyproject.toml does\n")
            raise SystemExit(2)
        if package != __name__ or name not in RETIRED:
            return None
        from doit.exceptions import InvalidDodoFile

        class Retired(ModuleNotFoundError, InvalidDodoFile):
            pass
        # name=None: `from kforge import doit_edge` re-raises it (a ModuleNotFoundError naming the module it
        # looked for is taken as "no such submodule", and Python then says only "cannot import name")
        raise Retired(f"{fullname} was a module of an older kforge (its modules now lie in the stations "
                      f"{', '.join(STATIONS)}); a project's dodo.py is one line, `from kforge.dodo import *` "
                      f"(README.md)", name=None)

    @staticmethod
    def invalidate_caches():
        pass


import sys as _sys   # noqa: E402  (after the finder it installs)
if not any(type(f).__name__ == "_RetiredNames" for f in _sys.meta_path):
    _sys.meta_path.append(_RetiredNames())
