"""kforge's runner for `doit -n N`: doit's process runner, with the workers' queue kept ahead of them.
doit has no plugin point for its runner: rules/edge/config.py's install_runner puts these classes in its place.

doit's MRunner hands a worker its next task only after the master has taken in that worker's last result:
each task waits for a round trip through the master (unpickle, record, pick the next task, pickle), and on a
machine whose every core compiles, the master waits for a core too. Measured on the 16-CPU host, doit kept
about 1.3% fewer compiles running than a ProcessPoolExecutor, which keeps jobs queued ahead (bench/build_speed.py).
This runner keeps up to `prefetch` tasks queued beyond those running, so a worker that finishes takes the next
one at once. Dependencies hold as in doit: a task is queued only once doit's dispatcher has released it.
An interrupted run never waits on a worker that outlived its SIGTERM (see _stop).
"""
from __future__ import annotations

import os
import queue
import signal
import sys
import time

from doit.exceptions import InvalidTask
from doit.runner import JobHold, MRunner, MThreadRunner



class _CappedWorkers:
    """No more workers than `max_workers`: each worker runs one compile at a time, so this caps the compiles that
    run at once (rules/base/cpus.py says why). The one-line notice says where the cap came from."""
    max_workers: int | None = None   # None: no cap (compiles run elsewhere, e.g. on a Dask cluster)
    cap_reason = ""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.max_workers is not None and self.num_process > self.max_workers:
            sys.stderr.write(f"kforge: -n {self.num_process} is more than {self.cap_reason}: at most "
                             f"{self.max_workers} task{'s run' if self.max_workers > 1 else ' runs'} at once "
                             f"(max_compiles=N on the command line or KFORGE_MAX_COMPILES=N sets the cap)\n")
            self.num_process = self.max_workers


class CappedThreadRunner(_CappedWorkers, MThreadRunner):
    """`doit -n N -P thread`: doit's thread runner, with the cap."""


class PrefetchRunner(_CappedWorkers, MRunner):
    prefetch = None      # tasks queued beyond those running; None: one per worker
    keep_hub_s = 0       # seconds the hub is kept after the run for the project's next one (0: closed with it)

    def run_tasks(self, task_dispatcher):
        self.master_pid = os.getpid()
        result_q, job_q = self.Queue(), self.Queue()
        self._run_tasks_init(task_dispatcher)
        self.unfinished: set[str] = set()   # names of the tasks queued or running, whose result has not come back
        self.dispatcher_done = False
        self._queue_ahead(job_q, None)
        workers = [self.Child(target=self.execute_task_subprocess, args=(job_q, result_q, self.reporter.__class__))
                   for _ in range(min(self.num_process, len(self.unfinished)))]   # no more workers than tasks
        watch = _DeadWorkerWatch(result_q, workers)
        compile_core, kept_for = None, 0
        try:
            if workers:   # the workers' compile servers come from one hub (rules/compile/core.py): it
                from kforge.compile import core as compile_core   # imports each toolchain and library once per build
                compile_core.start_hub(keep=self.keep_hub_s > 0)
            for worker in workers:
                worker.start()
            while self.unfinished:
                result = watch.next_result(self.unfinished)
                if "exit" in result:   # a worker itself broke (not a task): doit's own handling
                    raise result["exit"](result["exception"])
                node = task_dispatcher.nodes[result["name"]]
                if "reporter" in result:
                    getattr(self.reporter, result["reporter"])(node.task)
                    continue
                self.unfinished.discard(node.task.name)
                self._process_result(node, node.task, result)
                self._queue_ahead(job_q, node)
            kept_for = self.keep_hub_s   # an interrupted run keeps nothing
        except (SystemExit, KeyboardInterrupt, Exception):
            job_q.cancel_join_thread()   # no worker will read the jobs still queued: exit without flushing them
            _stop(workers)
            raise
        finally:
            if compile_core is not None:
                compile_core.close_hub(keep_s=kept_for)
        for _ in workers:
            job_q.put(None)   # each worker runs its teardowns and exits
        for worker in workers:
            worker.join()
        while not result_q.empty():   # teardown reports; safe once the workers are joined
            result = result_q.get()
            getattr(self.reporter, result["reporter"])(task_dispatcher.tasks[result["name"]])

    def execute_task_subprocess(self, job_q, result_q, reporter_class):
        # A SIGKILLed master (a CI runner cancelling the job) takes its workers with it, and they their compile
        # servers; orphans would hold hundreds of MB each.
        from kforge.load import isolate   # here: a no-op run forks no worker and never needs it
        isolate.die_with_parent(self.master_pid)
        # The kernel's default action: SIGTERM ends a worker whatever its threads are doing. A Python-level
        # handler (the master's, inherited: rules/edge/config.py) runs only once the main thread next runs Python.
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        super().execute_task_subprocess(job_q, result_q, reporter_class)

    def _queue_ahead(self, job_q, completed) -> None:
        """Tell the dispatcher that `completed` finished, then queue tasks until the queue is full, every task
        is dispatched, or the rest wait on running ones ("hold on")."""
        depth = self.num_process + (self.num_process if self.prefetch is None else self.prefetch)
        while not self.dispatcher_done and len(self.unfinished) < depth:
            job = self.get_next_job(completed)
            completed = None
            if job is None:       # nothing left to dispatch, or a failure stopped the run (no --continue)
                self.dispatcher_done = True
            elif job.type is JobHold.type:
                self.free_proc = 0   # doit's own bookkeeping for a hold; a later result asks again
                break
            elif self._has_nothing_to_run(job.name):   # a group task: done here, with no worker round trip,
                node = self.task_dispatcher.nodes[job.name]   # so a run with nothing to build forks no worker
                self.execute_task(node.task)   # reports it; runs no action
                self.process_task_result(node, None)
                completed = node
            else:
                job_q.put(job)
                self.unfinished.add(job.name)
        if not self.unfinished and not self.dispatcher_done:
            raise RuntimeError("doit's dispatcher holds tasks while none runs (a dependency cycle?)")

    def _has_nothing_to_run(self, name: str) -> bool:
        """A group task (no action, no teardown): finishing it needs no worker."""
        task = self.tasks[name]
        return not task.actions and not task.teardown


class _DeadWorkerWatch:
    """Reads the workers' results; when a worker died instead (killed from outside: doit's own runner then
    waits forever), stops the run through doit's error path: doit saves what finished and the reporter writes
    its summary and out/build-report.json. Liveness is checked before every read, not only when the queue is
    idle, or the other workers' results would keep the run going to its end; the results already sent when
    the death is seen are still taken in, for up to grace_s."""

    def __init__(self, result_q, workers, poll_s: float = 1.0, grace_s: float = 0.5):
        self.result_q, self.workers, self.poll_s, self.grace_s = result_q, workers, poll_s, grace_s
        self.death_seen_at: float | None = None

    def next_result(self, unfinished: set[str]) -> dict:
        while True:
            dead = [w for w in self.workers if not w.is_alive()]
            if dead and self.death_seen_at is None:
                self.death_seen_at = time.monotonic()
            timeout = self.poll_s if not dead else max(0.0, self.death_seen_at + self.grace_s - time.monotonic())
            try:
                return self.result_q.get(timeout=timeout)
            except queue.Empty:
                if dead:
                    how = ", ".join(f"pid {w.pid}, exit code {w.exitcode}" for w in dead)
                    raise InvalidTask(f"a doit worker process died ({how}) while running one of the tasks still "
                                      f"queued or running: {', '.join(sorted(unfinished))}. The run stopped; "
                                      f"everything finished is kept. Run the same command again to build the rest.")


def _stop(workers, grace_s: float = 3.0) -> None:
    """SIGTERM every started worker; SIGKILL any still alive after grace_s. An interrupted master exits only once
    multiprocessing has joined its workers, so one worker that outlived SIGTERM would hang the exit forever."""
    started = [w for w in workers if w.pid is not None]
    for worker in started:
        worker.terminate()
    deadline = time.monotonic() + grace_s
    for worker in started:
        worker.join(max(0.0, deadline - time.monotonic()))
        if worker.is_alive():
            worker.kill()
            worker.join()


def configure(prefetch: int | None = None, max_workers: int | None = None, cap_reason: str = "",
              keep_hub_s: int = 0) -> None:
    """This run's queue depth and cap, for both runners (rules/edge/config.py installs them in doit), and how
    long its hub is kept for the next build (rules/load/kept_hub.py)."""
    PrefetchRunner.prefetch, PrefetchRunner.keep_hub_s = prefetch, keep_hub_s
    for runner in (PrefetchRunner, CappedThreadRunner):
        runner.max_workers, runner.cap_reason = max_workers, cap_reason
