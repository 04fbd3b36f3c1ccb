"""Reads of the change feed shared by the reads waiting for one (cce_duck.refresher), on real
threads: a read is answered only by a refresh that began after it asked, the reads waiting
together share one, errors reach every read of that refresh, and closing fails the waiting
reads clearly."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import Future
from contextlib import contextmanager

import pytest

from cce_duck.errors import StorageError
from cce_duck.refresher import Refresher


class Gated:
    """A refresh that waits for its gate; each run records that it began."""

    def __init__(self) -> None:
        self.began: list[threading.Event] = [threading.Event() for _ in range(4)]
        self.gates: list[threading.Event] = [threading.Event() for _ in range(4)]
        self.runs = 0
        self.fail: Exception | None = None

    def __call__(self) -> None:
        k = self.runs
        self.runs += 1
        self.began[k].set()
        assert self.gates[k].wait(30)
        if self.fail is not None:
            raise self.fail


@contextmanager
def refresher() -> Iterator[tuple[Gated, Refresher]]:
    run = Gated()
    r = Refresher(run)
    try:
        yield run, r
    finally:
        for g in run.gates:
            g.set()
        r.close()


def test_reads_that_ask_during_a_refresh_wait_for_the_next_and_share_it() -> None:
    with refresher() as (run, r):
        first = r.after_now()
        assert run.began[0].wait(10)
        later: list[Future[None]] = [r.after_now() for _ in range(8)]  # during run 0
        run.gates[0].set()
        first.result(10)
        assert run.began[1].wait(10)  # a second run, for the reads that asked during the first
        assert not any(f.done() for f in later)  # the first run began before they asked
        run.gates[1].set()
        for f in later:
            f.result(10)
        assert run.runs == r.runs == 2
        assert r.answered == 9


def test_an_error_of_a_refresh_reaches_its_reads_and_the_next_refresh_runs() -> None:
    with refresher() as (run, r):
        run.fail = StorageError("the catalog cannot be reached")
        run.gates[0].set()
        with pytest.raises(StorageError, match="cannot be reached"):
            r.after_now().result(10)
        run.fail = None
        run.gates[1].set()
        assert r.after_now().result(10) is None
        assert run.runs == 2


def test_closing_fails_the_reads_still_waiting_and_every_later_one() -> None:
    run = Gated()
    r = Refresher(run)
    first = r.after_now()
    assert run.began[0].wait(10)
    waiting = r.after_now()  # for a run that will never begin
    closer = threading.Thread(target=r.close)
    closer.start()
    with pytest.raises(StorageError, match="closed"):
        waiting.result(10)
    run.gates[0].set()  # the run under way ends; close returns after it
    closer.join(10)
    assert not closer.is_alive()
    first.result(10)
    with pytest.raises(StorageError, match="closed"):
        r.after_now().result(1)
    assert run.runs == 1


def test_a_read_that_gave_up_is_left_out_and_the_others_are_answered() -> None:
    with refresher() as (run, r):
        first = r.after_now()
        assert run.began[0].wait(10)
        gone, kept = r.after_now(), r.after_now()
        assert gone.cancel()  # (what an awaiting task does when its client goes away)
        run.gates[0].set()
        first.result(10)
        run.gates[1].set()
        assert kept.result(10) is None
        assert gone.cancelled()
        run.gates[2].set()
        assert r.after_now().result(10) is None  # the thread lives on
        assert r.answered == 3
