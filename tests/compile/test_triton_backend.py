"""rules/compile/triton_backend.py: what a Triton compile writes into meta.json beyond the binary."""
import json

from tests.support import doit, kernel_text, make_project, spec_text, statuses

ON_CLASS = """
import triton
import triton.language as tl

from tk.scale import scale_kernel as kernel   # re-exported under another name


class Kernels:   # a library that keeps its kernels on a class
    @triton.jit
    def add(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = i < n
        tl.store(y_ptr + i, tl.load(x_ptr + i, mask=m) + 1, mask=m)
"""


def test_a_kernel_named_where_it_is_re_exported_or_kept_on_a_class_builds_and_names_its_def(tmp_path):
    """Serving matches a call by the function Triton's JIT names (its def's module and qualified name); a spec
    may name the kernel elsewhere. Class.kernel reached the catalog but failed to compile (no such attribute)."""
    specs = {name: spec_text(name=name, module="public").replace('entry = "scale_kernel"', f'entry = "{entry}"')
             for name, entry in (("reexported", "kernel"), ("on_class", "Kernels.add"))}
    root = make_project(tmp_path / "p", specs=specs, kernels={"scale": kernel_text(), "public": ON_CLASS})
    doit(root, "-n", "1", env={"KFORGE_LOCAL_CACHE": "off"})
    assert statuses(root, "built") == {"reexported:fp16-b256-w4@sm_90a", "on_class:fp16-b256-w4@sm_90a"}
    for name, function in (("reexported", "tk.scale:scale_kernel"), ("on_class", "tk.public:Kernels.add")):
        meta = json.loads((root / f"out/sm_90a/{name}/fp16-b256-w4/meta.json").read_text())
        assert meta["triton_function"] == function and meta["source"]["module"] == "tk.public"
