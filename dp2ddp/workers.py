"""A pool of forked worker processes that cannot outlive the run.

``concurrent.futures.ProcessPoolExecutor`` alone left its workers running forever
(parent 1, blocked writing a result nobody reads) when the main process was
killed (SIGTERM, SIGKILL: a cancelled CI job, a closed terminal), and on Ctrl-C
it let them finish every queued file before the run stopped.  Here:

* each worker asks the kernel to kill it when its parent dies
  (``prctl(PR_SET_PDEATHSIG, SIGKILL)`` on Linux); elsewhere a thread of the
  worker notices that its parent is gone and ends it;
* workers ignore SIGINT (Ctrl-C reaches the whole foreground process group):
  the main process gets the ``KeyboardInterrupt`` and kills them at once;
* leaving ``worker_pool()`` by an exception kills the workers at once, and lets
  the pool's manager thread end although a worker died in the middle of
  writing a result (the interpreter waits for that thread at exit).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterator, Optional

#: prctl(2)'s option: the signal the kernel sends this process when its parent dies
PR_SET_PDEATHSIG = 1


def _kernel_kills_orphans() -> bool:
    """Ask Linux to SIGKILL this process when its parent dies; False where it cannot."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        arg = ctypes.c_ulong
        return libc.prctl(PR_SET_PDEATHSIG, arg(int(signal.SIGKILL)), arg(0), arg(0), arg(0)) == 0
    except (OSError, AttributeError):
        return False


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(1)


def _start_worker(parent: int, initializer: Optional[Callable], initargs: tuple) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if not _kernel_kills_orphans():
        threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()
    if os.getppid() != parent:  # the parent died before the request took effect
        os._exit(1)
    if initializer is not None:
        initializer(*initargs)


class WorkerPool:
    """A ``ProcessPoolExecutor`` of forked workers (which, unlike a bare
    ``multiprocessing.Pool``, notices a worker killed from outside -- the
    out-of-memory killer -- and raises ``BrokenProcessPool`` instead of waiting
    forever for the job it lost)."""

    def __init__(self, executor) -> None:
        self.executor = executor

    def imap(self, function: Callable, jobs, chunksize: int = 1) -> Iterator:
        """Results in order, as they come."""
        return self.executor.map(function, jobs, chunksize=chunksize)

    def submit(self, function: Callable, *args):
        """A future; wait for it with ``result``."""
        return self.executor.submit(function, *args)

    def result(self, pending):
        return pending.result()


@contextmanager
def worker_pool(workers: int, initializer: Optional[Callable] = None, initargs: tuple = ()) -> Iterator[WorkerPool]:
    """A ``WorkerPool`` of ``workers`` forked processes.  Left normally, it waits
    for them to finish; left by an exception (Ctrl-C, a crash, a worker that
    died), it cancels what is queued and kills the workers at once."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    context = multiprocessing.get_context("fork")
    before = set(multiprocessing.active_children())
    executor = ProcessPoolExecutor(
        workers, mp_context=context, initializer=_start_worker, initargs=(os.getpid(), initializer, initargs)
    )
    try:
        yield WorkerPool(executor)
        # (inside the try: a Ctrl-C while the pool is being shut down -- between two
        # phases of a run -- kills the workers as one during the work does)
        executor.shutdown(wait=True)
    except BaseException:
        # (read before shutdown, which forgets both)
        thread = getattr(executor, "_executor_manager_thread", None)
        result_queue = getattr(executor, "_result_queue", None)
        _forget_at_exit(thread)
        _quiet_while_it_dies(thread)
        executor.shutdown(wait=False, cancel_futures=True)
        mine = [p for p in multiprocessing.active_children() if p not in before]
        for process in mine:
            process.kill()
        for process in mine:
            process.join(1)
        _release_the_manager(result_queue)
        if thread is not None:
            thread.join(0.5)
        raise


def _forget_at_exit(thread) -> None:
    """Drop the pool's manager thread from what ``concurrent.futures`` wakes at
    interpreter exit, before the workers are killed: the exit hook checks that the
    wake-up pipe is open and then writes to it, while the manager thread, seeing
    its workers gone, closes that pipe -- an ``OSError: Bad file descriptor``
    traceback after Ctrl-C (seen on a loaded machine, also when the Ctrl-C came
    while a pool was being shut down between two phases).  The thread ends on its
    own once its workers are gone."""
    from concurrent.futures import process as futures_process

    wakeups = getattr(futures_process, "_threads_wakeups", None)
    if thread is not None and wakeups is not None:
        wakeups.pop(thread, None)


def _release_the_manager(result_queue) -> None:
    """Once the workers are dead, close this process's own copy of the write end of
    the pool's result pipe.  A worker killed while it wrote a result larger than
    the pipe's buffer (a converted file, a chunk of them) leaves half a message in
    the pipe; the pool's manager thread, reading it, waited for the rest forever,
    and the interpreter waits for that thread at exit: Ctrl-C hung the run
    (reproduced with results of a few MB).  With no write end left open the read ends (EOF), the pool counts
    itself broken and its thread ends."""
    writer = getattr(result_queue, "_writer", None)
    if writer is not None:
        try:
            writer.close()
        except OSError:
            pass


def _quiet_while_it_dies(thread) -> None:
    """The pool's manager thread, finding its workers killed, marks every pending
    future broken -- also those the interrupted ``map`` has cancelled meanwhile,
    which raises ``InvalidStateError`` in that thread and printed its traceback
    after Ctrl-C.  Nobody waits for those futures: what that one thread raises
    from now on is not shown (every other thread's errors are, as before)."""
    if thread is None:
        return
    previous = threading.excepthook

    def hook(args) -> None:
        if args.thread is not thread:
            previous(args)

    threading.excepthook = hook
