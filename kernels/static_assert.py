"""A kernel that refuses some of its configs at compile time (tl.static_assert): such a config fails to build,
and kforge reports that failure again from its record, without compiling, until the target's inputs change
(docs/correctness.md). No spec here builds it: the tests and bench/failure_memo.py copy it into a throw-away
project, and count through COUNT_IMPORTS_IN the compile servers that import it (0: nothing was compiled)."""
import os

import triton
import triton.language as tl

if os.environ.get("COUNT_IMPORTS_IN"):
    with open(os.environ["COUNT_IMPORTS_IN"], "a") as f:
        f.write("imported\n")


@triton.jit
def scale_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    tl.static_assert(BLOCK <= 256, "BLOCK too large for this kernel")
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    tl.store(y_ptr + i, tl.load(x_ptr + i, mask=m) * 2, mask=m)
