"""How an artifact arrives in out/: every source hands over a Candidate, and install() is the one place that
checks one and writes it. The doit action (rules/compile/action.py) tries the sources in order and stops at the first
candidate that installs:

    local_cache.Source(cache).lookup(target)  an entry of this user's local cache (rules/share/local_cache.py)
    remote_cache.RemoteCache.lookup(target)   an entry of the shared remote cache (rules/share/remote_cache.py)
    a compile: compile_core.compile_here (this machine) or dask_executor.compile_remote (a Dask cluster);
               isolate.Outcome whose result is the Candidate

Whatever the source, a candidate is untrusted until install() has checked it (artifact.accept: plain file
names, exactly meta.json and its binary, bound to this target, sealed right, sha256 and the ELF checks for the
TARGET's arch): a cache entry for another arch or key never passes as built. The outcome of the whole action is
one CompileResult, from the compile server to the build report (rules/report/reporter.py, rules/report/trace.py).
"""
from __future__ import annotations

from typing import NamedTuple

from kforge.store import artifact


class CompileResult(NamedTuple):
    """One compile target's outcome: the compile fills what it knows (compile_seconds, sha256, spans, and
    compiled_on on a cluster), the doit action the rest; doit keeps it as the task's values (values()), the
    report reads it back (of())."""
    seconds: float = 0.0                   # the whole action: cache lookups, compile and write
    compile_seconds: float | None = None   # the compiler alone (None: fetched from a cache)
    sha256: str | None = None
    from_cache: bool = False               # installed from the remote cache
    compiled_on: str | None = None         # the Dask worker's address, for a compile that ran on a cluster
    cache_warnings: tuple[str, ...] = ()
    spans: tuple = ()   # (phase, start, end) by the wall clock (comparable across processes): the build trace
    worker: int | None = None              # the pid of the doit worker that ran the action: a row of the trace
    from_local_cache: bool = False         # installed from the local cache (rules/share/local_cache.py)
    unchanged: bool = False                # not compiled: early cutoff (Unchanged), only meta.json's inputs renewed

    def values(self) -> dict:
        """As doit saves a python-action's result: a dict of JSON values, only the fields that are set."""
        return {k: [list(x) if isinstance(x, tuple) else x for x in v] if isinstance(v, tuple) else v
                for k, v in self._asdict().items()
                if v is not None and v is not False and v != ()}   # 0.0 is a value (and 0.0 == False)

    @classmethod
    def of(cls, values: dict | None) -> "CompileResult":
        """A task's saved values (values()'s form) as the result again; keys it does not know are ignored."""
        values = values or {}
        known = {k: values[k] for k in cls._fields if k in values}
        for k in ("cache_warnings", "spans"):
            if k in known:
                known[k] = tuple(tuple(x) if isinstance(x, list) else x for x in known[k])
        return cls(**known)

    @property
    def origin(self) -> str:
        """Where the artifact came from: "compiled", "local cache" or "remote cache" (rules/report/reporter.py's ORIGINS)."""
        return ("local cache" if self.from_local_cache else "remote cache" if self.from_cache else
                "unchanged" if self.unchanged else "compiled")


class Candidate(NamedTuple):
    """An artifact a source offers, not yet checked: its files as artifact.files_of gives them (meta.json and
    the binary it names), and what the source knows of how it was made."""
    files: dict
    result: CompileResult = CompileResult()


class Cutoff(NamedTuple):
    """What a compile server needs to tell whether the target's artifact in out/ is still the one its inputs
    give: that artifact's triton_source_key, its recorded inputs, and the names among them whose content changed
    (the reason the target runs)."""
    source_key: str
    inputs: list
    changed: tuple


class Unchanged(NamedTuple):
    """A compile server's answer instead of a candidate (early cutoff): the kernel's source digest is the one the
    artifact was built from and every changed input was read by the import, whose effect on the kernel that
    digest covers; the artifact stays, and meta.json records these inputs."""
    inputs: list
    result: CompileResult


def restamp(target, unchanged: Unchanged) -> None:
    """Renew what the target's meta.json records of its inputs: the files read, the key and the sources' digests
    (binary untouched; meta.json sealed and written by rename)."""
    meta = artifact.built_meta(target.meta_path)
    if meta is None:   # gone or replaced since the action looked: nothing to renew, the next run builds it
        raise artifact.ArtifactError(f"{target.meta_path} changed during the build")
    artifact.write_meta(target, {**meta, "inputs": unchanged.inputs, "key": target.key,
                                 "source": {**meta["source"], "digests": dict(target.source_digests)}})


def arrive(target, source) -> tuple[Candidate | None, list[str]]:
    """Ask a cache for the target's artifact and install what it offers: (the installed candidate or None,
    warnings). A miss is quiet; an unreadable or refused entry is a miss with the source's warning (the target
    then compiles). An OSError writing out/ is out/'s, not the entry's: the caller's.

    A cache is a rules/share/cache.py ArtifactCache (lookup, refused, took; keep and drain_warnings are the
    compile action's)."""
    try:
        candidate = source.lookup(target)
        if candidate is None:
            return None, []
        accepted = artifact.accept(target, candidate.files)
    except ValueError as e:   # the entry is unreadable, or the checks refused it (artifact.ArtifactError)
        return None, source.refused(target, e)
    _write(target, accepted)   # out/'s errors (a full disk, a link leading out: OutsideOut) are not the entry's
    source.took(target)
    return candidate, []


def install(target, candidate: Candidate) -> dict:
    """Check the candidate for `target` and put it in place, as a build writes (binary, then meta.json, each by
    rename): its meta.json as written, or ArtifactError saying in one line why it was refused (nothing is
    written then). The only way an artifact gets into out/."""
    return _write(target, artifact.accept(target, candidate.files))


def _write(target, accepted: tuple) -> dict:
    meta, binary_name, binary = accepted
    artifact.write(target, binary_name, binary, meta)
    return meta
