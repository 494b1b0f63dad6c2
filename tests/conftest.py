import pytest

from tests.support import doit, make_project, spec_text

ALL_ARCHS = ("sm_80", "sm_90a", "sm_100a", "gfx90a", "gfx942", "gfx950")


@pytest.fixture(scope="session")
def built(tmp_path_factory):
    """A project whose scale kernel was really compiled for every arch kforge knows (doit -n 2)."""
    root = make_project(tmp_path_factory.mktemp("built"),
                        specs={"scale": spec_text(archs=ALL_ARCHS, dtypes=("fp16", "bf16"))})
    doit(root, "-n", "2")
    return root
