"""rules/runtime/specializer.py: Triton's specializer's first call imports no code generator once primed, and
Gluon imported afterwards is the same Gluon (its descriptors specialized as without priming). In fresh
processes: the native specializer takes its classes once per process."""
import json
import subprocess
import sys

from tests.support import REPO

CHILD = """
import json, os, sys, traceback
import torch, triton


def run(mode):
    if mode == "prime":
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
    return {"how": how, "first": str(first), "imported_at_first_call": compiler,
            "gluon_descriptor": str(native_specialize_impl(CUDABackend, desc, False, True, True)),
            "package_attributes": [gluon.nvidia.hopper.TensorDescriptor is TensorDescriptor,
                                   gluon.language._layouts is sys.modules[gl.__name__ + "._layouts"],
                                   gluon.amd.gfx1250 is sys.modules["triton.experimental.gluon.amd.gfx1250"]]}


failed = 0
for mode in sys.argv[1:]:   # each mode in a fork of this process, which has called nothing of Triton's yet
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        try:
            print(json.dumps({mode: run(mode)}))
            code = 0
        except BaseException:
            traceback.print_exc()
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    failed |= os.waitpid(pid, 0)[1]
sys.exit(1 if failed else 0)
"""


def children(*modes: str) -> dict:
    """mode -> what CHILD found in a fresh process (a fork, made before the first specialization, of one process
    that imported torch and Triton once for all the modes: 2 s of CPU each)."""
    proc = subprocess.run([sys.executable, "-c", CHILD, *modes], capture_output=True, text=True, cwd=REPO,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = {}
    for line in proc.stdout.splitlines():
        if line.startswith("{"):
            found.update(json.loads(line))
    assert list(found) == list(modes), proc.stdout[-3000:] + proc.stderr[-3000:]
    return found


def test_primed_the_first_specialization_imports_no_compiler_and_gluon_stays_gluon():
    found = children("prime", "usual")
    primed, usual = found["prime"], found["usual"]
    assert primed["how"] == "light" and primed["imported_at_first_call"] == []
    assert usual["imported_at_first_call"] == ["triton.compiler.code_generator", "triton.experimental.gluon"]
    for key in ("first", "gluon_descriptor", "package_attributes"):
        assert primed[key] == usual[key]
    assert primed["gluon_descriptor"].startswith("('tensordesc<fp16[32, 32],NVMMASharedLayout(")
    assert primed["package_attributes"] == [True, True, True]
