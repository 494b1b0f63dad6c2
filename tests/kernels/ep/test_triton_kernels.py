"""The op's kernels run on the CPU by Triton's interpreter, against kernels/ep/routing.py.

The interpreter is chosen when Triton is imported (TRITON_INTERPRET=1), so the kernels run in a child
process, with simulate.interpreter_patches() (less wasted work per step, the same results). Several ranks
are simulated in that one process: their receive buffers are CPU tensors reached through the same pointer
tables the GPUs use. What needs real GPUs (the flag barriers, ordering across
devices, bf16 rounding exactly as the GPU does it) is left to the verify sweep.

Each check runs in a process of its own, forked from one child that imported torch and the kernels under the
interpreter once (FORK_SERVER): a Python start importing torch is most of a check's CPU time.
"""
import json
import os
import select
import subprocess
import sys

import pytest

from tests.support import REPO

ROUTE_CHECK = """
import torch
from kernels.ep import launch, simulate, triton_kernels as tk

simulate.interpreter_patches()
from kernels.ep.routing import destinations, positions

BLOCK_T = launch.CONSTANTS["ep_route"]["BLOCK_T"]
g = torch.Generator().manual_seed(0)
for T, K, W, E in [(1, 1, 2, 3), (BLOCK_T, 8, 4, 32), (2 * BLOCK_T + 37, 6, 8, 4), (BLOCK_T - 1, 2, 3, 5)]:
    idx = torch.randint(-1, E * W + 2, (T, K), generator=g, dtype=torch.int32)   # -1 and past-the-end ids too
    blocks = -(-T // BLOCK_T)
    pos = torch.full((T, W), -9, dtype=torch.int32)
    counts = torch.full((blocks, W), -9, dtype=torch.int32)
    tk.route_kernel[(blocks,)](idx, pos, counts, T, E, K=K, W=W, BLOCK_T=BLOCK_T, PDL=False)
    mask = destinations(idx, E, W)
    base = torch.zeros(blocks, W, dtype=torch.int32)   # what dispatch_kernel adds to each block
    base[1:] = torch.cumsum(counts, 0)[:-1]
    landed = torch.where(pos >= 0, pos + base.repeat_interleave(BLOCK_T, 0)[:T], -1)
    assert torch.equal(landed, torch.where(mask, positions(mask), -1)), (T, K, W, E)
    assert counts.sum(0).tolist() == mask.sum(0).tolist(), (T, K, W, E)
print("ok")
"""


DISPATCH_COMBINE_CHECK = """
import os
import threading

import torch
from kernels.ep import simulate, triton_kernels as tk

simulate.interpreter_patches()
from kernels.ep.routing import destinations

# blocks of 16 tokens (the kernels take any power of two; the specs' 256 would make this a 300-token case, five
# times the interpreted programs): M spans four blocks of the route, H two BLOCK_H chunks per row
BLOCK_T, BLOCK_H = 16, 32
# epochs past int32's range: this dispatch's is 2^31 - 2 and the waiter's below 2^31, combine's 2^32 + 7
BASE = 2**31 - 3


def tag(epoch):   # a count cell's tag: the epoch's low 32 bits in the upper half of a signed 64-bit word
    bits = (epoch & 0xFFFFFFFF) << 32
    return bits - (1 << 64) if bits >= 1 << 63 else bits


g = torch.Generator().manual_seed(1)
W, E, K, H, M = 3, 2, 3, 64, 3 * BLOCK_T + 12
R = W * M
T = [M, 0, 17]   # tokens per rank: four blocks of the route, none, two
x = [torch.randn(t, H, generator=g) for t in T]   # f32 rows: the interpreter rounds bf16 unlike the GPU
idx = [torch.randint(-1, E * W, (t, K), generator=g, dtype=torch.int32) for t in T]
w = [torch.rand(t, K, generator=g) for t in T]
recv = {name: [torch.full(shape, -5, dtype=dt) for _ in range(W)] for name, shape, dt in
        [("x", (R, H), torch.float32), ("idx", (R, K), torch.int32), ("w", (R, K), torch.float32),
         ("src", (R,), torch.int32), ("scale", (R, 4), torch.float32)]}
table = {name: torch.tensor([b.data_ptr() for b in bufs], dtype=torch.int64) for name, bufs in recv.items()}
pos, counts = [], []
for r in range(W):   # route_kernel
    nb = max(-(-T[r] // BLOCK_T), 1)
    p, c = torch.empty(max(T[r], 1), W, dtype=torch.int32), torch.zeros(nb, W, dtype=torch.int32)
    if T[r]:
        tk.route_kernel[(nb,)](idx[r], p, c, T[r], E, K=K, W=W, BLOCK_T=BLOCK_T, PDL=False)
    pos.append(p), counts.append(c)
matrices = [torch.zeros(W, W, dtype=torch.int64) for _ in range(W)]
matrix_table = torch.tensor([m.data_ptr() for m in matrices], dtype=torch.int64)
epochs = [torch.tensor([BASE], dtype=torch.int64) for _ in range(W)]
num_recv = [torch.zeros((), dtype=torch.int32) for _ in range(W)]
overflow = [torch.full((), 9, dtype=torch.uint8) for _ in range(W)]
recv_start = [torch.full((W + 1,), -9, dtype=torch.int32) for _ in range(W)]
handles = [torch.full((T[r], W), -9, dtype=torch.int32) for r in range(W)]


def dispatch(r, roles, grid):   # 2 blocks of the route's counts a step: T[0]'s four blocks take two
    tk.dispatch_kernel[grid](
        x[r] if T[r] else x[0], idx[r] if T[r] else idx[0], w[r] if T[r] else w[0], recv["scale"][r], pos[r],
        counts[r], -(-T[r] // BLOCK_T), matrix_table, epochs[r], num_recv[r], overflow[r], recv_start[r],
        handles[r] if T[r] else pos[r], table["x"], table["idx"], table["w"], table["scale"], table["src"], r, T[r], H,
        M, R, 0, 4, roles, W=W, K=K, HAS_W=True, HAS_SCALES=False, BLOCK_H=BLOCK_H, BLOCK_T=BLOCK_T, BLOCKS=2,
        PDL=False, STORE_SIGNAL=False)


for r in range(W):   # every rank's program (0, 0) sends its tagged counts (roles 1)
    dispatch(r, 1, (1, 1))
totals = torch.stack([c.sum(0) for c in counts]).to(torch.int64)   # [s, d]: rows rank s sends to rank d
for r in range(W):
    assert torch.equal(matrices[r], tag(BASE + 1) | totals), r   # every row tagged with the call's epoch
for r in range(W):   # then every rank's grid, whose wait for the counts passes (roles 2); T = 0 runs one program
    dispatch(r, 2, (max(T[r], 1), -(-H // BLOCK_H)))
    assert epochs[r].item() == BASE, r   # dispatch_done's barrier advances the epoch, not dispatch
matrix = totals.to(torch.int32)
for d in range(W):   # rank d got every token with an expert on d, once, in (source rank, source token) order
    sent = [(s, t) for s in range(W) for t in range(T[s]) if destinations(idx[s], E, W)[t, d]]
    n = len(sent)
    assert torch.equal(recv["x"][d][:n], torch.stack([x[s][t] for s, t in sent])), d
    assert torch.equal(recv["idx"][d][:n], torch.stack([idx[s][t] for s, t in sent])), d
    assert torch.equal(recv["w"][d][:n], torch.stack([w[s][t] for s, t in sent])), d
    assert recv["src"][d][:n].tolist() == [s * M + t for s, t in sent], d
    assert (recv["x"][d][n:] == -5).all(), d   # nothing written past the rows sent here
back = [torch.full((M, W, H), -7.0) for _ in range(W)]   # combine: rows pushed back to their source rank
arrived = [torch.zeros(M, W, dtype=torch.int64) for _ in range(W)]
epoch = torch.tensor([2**32 + 7], dtype=torch.int64)   # the op's barrier count, the same on every rank
back_table = torch.tensor([b.data_ptr() for b in back], dtype=torch.int64)
arrived_table = torch.tensor([a.data_ptr() for a in arrived], dtype=torch.int64)
for d in range(W):   # what dispatch derived from the counts it waited for
    assert recv_start[d].tolist() == [0] + torch.cumsum(matrix[:, d], 0).tolist(), d
    assert num_recv[d].item() == matrix[:, d].sum().item() and overflow[d].item() == 0, d
outs = [torch.full((T[r], H), -3.0) for r in range(W)]
for roles in (1, 2):   # every rank's pushers, then every rank's reducers (one launch each on GPUs)
    for r in range(W):
        grid = M if roles == 1 else T[r]   # a pusher a row of each source, then a reducer a token
        if grid:
            tk.combine_kernel[(grid,)](outs[r], recv["x"][r], R, handles[r], recv["src"][r], recv_start[r], back_table,
                                       arrived_table, epoch, r, T[r], H, M, R, roles, W=W, BLOCK_H=BLOCK_H, QB=4, LAG=1,
                                       STORE_SIGNAL=False)
for r in range(W):   # the received rows as expert outputs: each token comes back times its destinations
    assert torch.allclose(outs[r], x[r] * destinations(idx[r], E, W).sum(1, keepdim=True).float()), r
    # each row pushed back flagged its arrival with the epoch at its source: arrived[r][t, d] for rank d's row
    flagged = torch.zeros(M, W, dtype=torch.int64)
    flagged[:T[r]] = torch.where((handles[r] >= 0) & (torch.arange(W) != r), 2**32 + 7, 0)
    assert torch.equal(arrived[r], flagged), r
# dispatch's wait holds while a peer's row carries an older epoch: rank 0's next call (epoch 2^31), with rank 1's
# counts of epoch 2^31 - 1 still in its matrix, must send no row (it spins in a thread left running at exit). The
# tags as int32 are 0x80000000 and 0x7FFFFFFF: the older is the larger, so a wait for `tag >= epoch` would pass
epochs[0].fill_(2**31 - 1)
counts_only = matrices[0] & 0xFFFFFFFF
matrices[0].copy_(counts_only | tag(2**31 - 1))
matrices[0][[0, 2]] = counts_only[[0, 2]] | tag(2**31)   # rank 0's and rank 2's rows of the next call are in
for d in range(W):
    recv["x"][d].fill_(-5)
handles[0].fill_(-9)   # program (0, 0) writes the handle of route block 0 once it is past the wait
waiter = threading.Thread(daemon=True, target=lambda: dispatch(0, 2, (1, 1)))
waiter.start()
waiter.join(1.0)
assert waiter.is_alive() and all((recv["x"][d] == -5).all() for d in range(W)) and (handles[0] == -9).all()
print("ok", flush=True)
os._exit(0)
"""


EXCHANGE_TOTALS_CHECK = """
import torch
from kernels.ep import simulate, triton_kernels as tk

simulate.interpreter_patches()
# over capacity; a world that is not a power of two. The call's epochs, 2^31 and 2^32, past int32's range: their tags'
# low 32 bits are 0x80000000 (negative as an int32) and 0
for W, rank, R, epoch in ((4, 2, 20, 2**31 - 1), (3, 1, 100, 2**32 - 1)):
    # matrix[s, d]: rows s sent to d, in the low 32 bits, tagged with this call's epoch above: the wait passes
    bits = ((epoch + 1) & 0xFFFFFFFF) << 32
    tag = bits - (1 << 64) if bits >= 1 << 63 else bits
    matrix = torch.arange(1, W * W + 1, dtype=torch.int64).reshape(W, W) | tag
    epoch = torch.tensor([epoch], dtype=torch.int64)
    num_recv, overflow = torch.zeros((), dtype=torch.int32), torch.zeros((), dtype=torch.uint8)
    recv_start = torch.full((W + 1,), -9, dtype=torch.int32)
    one = torch.zeros(1, W, dtype=torch.int32)   # a rank with no tokens: one program, which sends no row
    f, i = torch.zeros(1, 16), torch.zeros(1, 1, dtype=torch.int32)
    tables = torch.tensor([f.data_ptr()] * W)
    tk.dispatch_kernel[(1, 1)](f, i, f, f, one, one, 0, torch.tensor([matrix.data_ptr()] * W), epoch, num_recv,
                               overflow, recv_start, one, tables, tables, tables, tables, tables, rank, 0, 16, 1, R, 0,
                               4, 2, W=W, K=1, HAS_W=True, HAS_SCALES=False, BLOCK_H=16, BLOCK_T=16, BLOCKS=2,
                               PDL=False, STORE_SIGNAL=False)
    column = (matrix[:, rank] & 0xFFFFFFFF).tolist()
    assert recv_start.tolist() == [sum(column[:s]) for s in range(W + 1)], (W, recv_start)
    assert num_recv.item() == min(sum(column), R) and overflow.item() == (sum(column) > R), (W, num_recv, overflow)
print("ok")
"""


BARRIER_WRAP_CHECK = """
import os
import threading

import torch
from kernels.ep import simulate, triton_kernels as tk

simulate.interpreter_patches()
# rank 0 of 3 at the barrier that takes the epoch to e, past int32's range; its peers' flags hold e - 1 (not yet
# there), e or e + 1 (there, one a barrier ahead): flags or a comparison of 32 bits would wait forever at e = 2^31
# (whose low 32 bits are negative as an int32) or at e = 2^32 (0), or pass e - 1 there
W = 3
KEPT = []   # a waiter left spinning reads its flags by address (the table): they must outlive barrier()'s call


def barrier(e, peers, wait):
    flags = torch.tensor([0] + [e + d for d in peers], dtype=torch.int64)
    KEPT.append(flags)   # freed, the next call's tensors took their memory and the old waiter read and wrote them
    epoch = torch.tensor([e - 1], dtype=torch.int64)
    table = torch.tensor([flags.data_ptr()] * W)   # every signal lands in this rank's own slot 0
    run = threading.Thread(daemon=True, target=lambda: tk.barrier_kernel[(1,)](table, epoch, 0, W=W,
                                                                            STORE_SIGNAL=False))
    run.start()
    run.join(wait)
    return run.is_alive(), epoch.item(), flags[0].item()


for e in (2**31, 2**32):
    for peers in ((0, 0), (0, 1), (1, 1)):
        assert barrier(e, peers, 60.0) == (False, e, e), (e, peers)   # passed, advanced the epoch, signalled
# a waiter is left spinning in its thread (the process exits under it); each pass above took well under a second
for e, peers in ((2**31, (-1, 0)), (2**32, (1, -1))):
    waiting, epoch, _ = barrier(e, peers, 1.0)
    assert waiting and epoch == e - 1, (e, peers)   # still waiting, the epoch untouched
print("ok", flush=True)
os._exit(0)
"""


# one request a line: [script, stdout file, stderr file]; one reply a line: the exit status of the fork that ran
# it as __main__, with its output in those files (a check that runs past 300 s is ended by SIGALRM)
FORK_SERVER = """
import json, os, signal, sys, traceback
import torch, triton
from kernels.ep import routing, simulate, triton_kernels
for line in sys.stdin:
    script, out, err = json.loads(line)
    pid = os.fork()
    if pid == 0:
        signal.alarm(300)
        os.dup2(os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 1)
        os.dup2(os.open(err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 2)
        try:
            exec(compile(script, "<check>", "exec"), {"__name__": "__main__"})
            code = 0
        except BaseException:
            traceback.print_exc()
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)
"""


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory):
    """run(script): the script run as __main__ in a fork of the server; asserts it exits 0 printing "ok"."""
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(REPO))
    server = subprocess.Popen([sys.executable, "-c", FORK_SERVER], cwd=REPO, env=env, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    folder = tmp_path_factory.mktemp("interpreted")

    def run(script: str) -> None:
        out, err = folder / "stdout", folder / "stderr"
        server.stdin.write(json.dumps([script, str(out), str(err)]) + "\n")
        server.stdin.flush()
        answered = select.select([server.stdout], [], [], 330)[0]
        code = server.stdout.readline() if answered else ""
        assert code, f"the fork server gave no answer (exit status {server.poll()})"
        assert int(code) == 0 and out.read_text().strip() == "ok", (code, err.read_text()[-3000:])

    yield run
    server.stdin.close()
    try:
        server.wait(timeout=30)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()


def test_route_kernel_gives_each_token_its_place_per_destination(interpreted):
    interpreted(ROUTE_CHECK)


def test_dispatch_and_combine_kernels_move_each_token_to_its_ranks_and_back(interpreted):
    interpreted(DISPATCH_COMBINE_CHECK)


def test_dispatch_gives_the_receiver_its_row_starts_and_overflow_from_the_counts_it_waited_for(interpreted):
    interpreted(EXCHANGE_TOTALS_CHECK)


def test_barrier_passes_at_a_peer_at_or_one_ahead_and_waits_at_one_behind_across_32_bit_wraps(interpreted):
    interpreted(BARRIER_WRAP_CHECK)
