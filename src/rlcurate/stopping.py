"""Stopping on SIGTERM or SIGINT without losing work (issue #30).

A long command (``rlcurate train``, ``rlcurate runs``) asked to stop should finish what it is doing, save
it and say where it is, not die between two checkpoints. :func:`catch_stop_signals` turns the first
SIGTERM or SIGINT inside its block into a request the command polls at a safe point (the end of a training
step); a second signal acts at once, with the default action, for a user who cannot wait.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from typing import Callable, Iterator

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopRequest:
    """The first stop signal received inside :func:`catch_stop_signals` (``None`` while there is none)."""

    def __init__(self) -> None:
        self.signum: int | None = None

    @property
    def requested(self) -> bool:
        return self.signum is not None

    @property
    def name(self) -> str:
        if self.signum is None:
            return ""
        if self.signum == PARENT_DEATH_SIGNAL and os.environ.get(PARENT_ENV):
            return "the end of `rlcurate runs`"
        return signal.Signals(self.signum).name


@contextlib.contextmanager
def catch_stop_signals(on_signal: Callable[[int], None] | None = None,
                       request: StopRequest | None = None) -> Iterator[StopRequest]:
    """Within the block, the first SIGTERM or SIGINT sets ``request.signum`` (and calls ``on_signal``)
    instead of ending the process; the second calls ``on_signal`` again, restores the handler found before
    and delivers itself again. In a process started by ``rlcurate runs`` the death of that parent
    (:data:`PARENT_DEATH_SIGNAL`, :func:`end_with_parent`) is a request too, but never the second one: the
    kernel may send it several times for one death. The handlers are restored on leaving. Outside the main
    thread (where Python cannot install handlers) the request is never set. ``request``: the object to
    record the signal in (default: a new one), for code outside the block that must see it."""
    request = request if request is not None else StopRequest()
    if threading.current_thread() is not threading.main_thread():
        yield request
        return
    caught = STOP_SIGNALS + ((PARENT_DEATH_SIGNAL,) if os.environ.get(PARENT_ENV) else ())
    previous = {s: signal.getsignal(s) for s in caught}

    def handler(signum, frame):
        if request.requested and signum == PARENT_DEATH_SIGNAL:
            return  # the same death again: the kernel signals once per exiting thread of the parent
        if request.requested:  # asked twice: stop now
            if on_signal is not None:
                on_signal(signum)
            signal.signal(signum, previous[signum] if previous[signum] is not None else signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        request.signum = signum
        if on_signal is not None:
            on_signal(signum)

    for s in caught:
        signal.signal(s, handler)
    try:
        yield request
    finally:
        for s, h in previous.items():
            signal.signal(s, h if h is not None else signal.SIG_DFL)


PARENT_ENV = "RLCURATE_END_WITH_PARENT"
"""Set by ``rlcurate runs`` to its process id in the environment of each ``train`` process it starts."""


PARENT_DEATH_SIGNAL = signal.SIGHUP
"""What a process started by ``rlcurate runs`` receives when ``runs`` dies (:func:`end_with_parent`): not
SIGTERM, because the kernel sends it once for each exiting thread of the parent, and a second SIGTERM
means "stop now" (:func:`catch_stop_signals`); a child that took the repeat that way died mid-step with no
checkpoint."""


def end_with_parent() -> None:
    """In a process started by ``rlcurate runs`` (:data:`PARENT_ENV` holds the parent's pid), ask Linux for
    :data:`PARENT_DEATH_SIGNAL` when the parent dies (``prctl(PR_SET_PDEATHSIG)``): a ``runs`` killed even
    with SIGKILL then leaves no training running on, orphaned; each child checkpoints at the end of its step
    and stops, and the next ``runs`` resumes it. A no-op elsewhere, and outside ``runs``."""
    pid = os.environ.get(PARENT_ENV)
    if not pid or not sys.platform.startswith("linux"):
        return
    import ctypes

    # until the training loop catches it, the parent's death ends this process (a `runs` started under
    # nohup would pass on an ignored SIGHUP)
    signal.signal(PARENT_DEATH_SIGNAL, signal.SIG_DFL)
    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, int(PARENT_DEATH_SIGNAL), 0, 0, 0)
    if os.getppid() != int(pid):  # the parent died before the request took effect
        os.kill(os.getpid(), PARENT_DEATH_SIGNAL)
