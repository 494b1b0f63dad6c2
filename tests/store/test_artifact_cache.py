"""rules/store/artifact.py's ArtifactCache: every artifact cache declares the interface the installer and the compile
action use."""
import ast

import pytest

from kforge.share.local_cache import Source
from kforge.share.remote_cache import RemoteCache
from kforge.store.artifact import ArtifactCache
from tests.support import REPO

INTERFACE = {"lookup", "refused", "took", "keep", "drain_warnings", "lookup_span", "keep_span"}


@pytest.mark.parametrize("cache", [Source, RemoteCache])
def test_each_cache_is_an_artifact_cache_with_its_own_lookup_refusal_and_keep(cache):
    assert issubclass(cache, ArtifactCache)
    assert {"lookup", "refused", "keep", "lookup_span", "keep_span"} <= set(vars(cache))


def test_a_cache_missing_a_required_method_cannot_be_made():
    class NoKeep(ArtifactCache):
        def lookup(self, target):
            return None

        def refused(self, target, error):
            return []

    with pytest.raises(TypeError, match="keep"):
        NoKeep()


def test_the_installer_and_the_action_ask_a_cache_only_what_the_interface_declares():
    asked = set()
    for path, names in (("rules/store/artifact.py", {"source"}), ("rules/compile/action.py", {"cache", "nearer"})):
        for node in ast.walk(ast.parse((REPO / path).read_text())):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in names:
                asked.add(node.attr)
    assert asked and asked <= INTERFACE and asked <= set(dir(ArtifactCache)) | {"lookup_span", "keep_span"}
