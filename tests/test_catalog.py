"""The repository's own catalog loads: every spec in specs/ is valid and gives the targets README promises.
Building it is README's main command, which CI runs once before the tests (.ci/run checks its report);
the tests never build it again."""
from kforge.layout import Layout
from kforge.project import load_specs
from kforge.targets import build_targets
from tests.support import REPO


def test_the_catalog_loads_into_unique_targets_inside_out():
    specs = load_specs(REPO)
    targets = build_targets(specs, REPO, None)
    names = [t.name for t in targets]
    assert len(names) == len(set(names)) > 1000
    assert {"gemm", "rmsnorm", "softmax", "moe_gemm", "fly_gemm", "fly_fp8_gemm", "fly_rmsnorm",
            "fly_softmax", "ep_dispatch", "ep_combine"} <= {t.kernel for t in targets}
    out = Layout(REPO).out
    assert all(out in Layout(REPO).artifact_dir(t.arch, t.kernel, t.config_id).parents for t in targets)
    assert {t.toolchain for t in targets} == {"triton", "flydsl"}
