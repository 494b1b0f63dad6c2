"""rules/runtime/specializer.py: Triton's specializer's first call imports no code generator once primed, and
Gluon imported afterwards is the same Gluon (its descriptors specialized as without priming). In fresh
processes: the native specializer takes its classes once per process."""
import json
import subprocess
import sys

from tests.support import REPO

CHILD = """
import json, sys
import torch, triton
if sys.argv[1] == "prime":
    from kforge_runtime import specializer
    how = specializer.prime()
else:
    how = None
from triton._C.libtriton import native_specialize_impl
from triton.backends.nvidia.compiler import CUDABackend
first = native_specialize_impl(CUDABackend, 32, False, True, True)   # the first call: the classes imported
compiler = sorted(m for m in sys.modules if m in ("triton.compiler.code_generator", "triton.experimental.gluon"))
import triton.experimental.gluon as gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
desc = TensorDescriptor.from_tensor(torch.zeros(64, 64, dtype=torch.float16), [32, 32],
                                    gl.NVMMASharedLayout.get_default_for([32, 32], gl.float16))
print(json.dumps({"how": how, "first": str(first), "imported_at_first_call": compiler,
                  "gluon_descriptor": str(native_specialize_impl(CUDABackend, desc, False, True, True)),
                  "package_attributes": [gluon.nvidia.hopper.TensorDescriptor is TensorDescriptor,
                                         gluon.language._layouts is sys.modules[gl.__name__ + "._layouts"],
                                         gluon.amd.gfx1250 is sys.modules["triton.experimental.gluon.amd.gfx1250"]]}))
"""


def child(mode: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", CHILD, mode], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


def test_primed_the_first_specialization_imports_no_compiler_and_gluon_stays_gluon():
    primed, usual = child("prime"), child("usual")
    assert primed["how"] == "light" and primed["imported_at_first_call"] == []
    assert usual["imported_at_first_call"] == ["triton.compiler.code_generator", "triton.experimental.gluon"]
    for key in ("first", "gluon_descriptor", "package_attributes"):
        assert primed[key] == usual[key]
    assert primed["gluon_descriptor"].startswith("('tensordesc<fp16[32, 32],NVMMASharedLayout(")
    assert primed["package_attributes"] == [True, True, True]
