"""The interface every artifact cache implements, as a source the installer takes artifacts from
(rules/store/artifact.py: arrive(target, cache)) and a store the compile action keeps them in
(rules/compile/action.py). The local cache (local_cache.Source) and the remote cache (remote_cache.RemoteCache)
implement it; a new cache subclasses ArtifactCache and is checked by tests/share/test_cache.py."""
from __future__ import annotations

from abc import ABC, abstractmethod

from kforge.store.artifact import Candidate


class ArtifactCache(ABC):
    lookup_span: str   # the build trace's names for the cache's two phases
    keep_span: str

    @abstractmethod
    def lookup(self, target) -> Candidate | None:
        """The target's entry, unchecked (the installer checks it); None on a miss; ValueError when an entry is
        there but cannot be read."""

    @abstractmethod
    def refused(self, target, error: Exception) -> list[str]:
        """The installer refused what lookup() offered: drop it, and say so (warnings)."""

    @abstractmethod
    def keep(self, target) -> list[str]:
        """Store the target's artifact, as installed in out/, under its key: warnings."""

    def took(self, target) -> None:
        """The installer took what lookup() offered (a cache that ages entries by use marks it)."""

    def drain_warnings(self) -> list[str]:
        """What the cache has to say beyond its calls' own warnings (a server gone slow or down), once."""
        return []
