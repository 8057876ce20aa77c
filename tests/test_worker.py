"""The daemon's worker thread (receivewal.daemon.worker), which the uploads and the local
copy's rule are built on: a pass at once, then one when an event makes it due or the timer
runs out; the stop ends every wait; a failed try waits as the uploads' retry policy says."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

import receivewal
from receivewal.archive.objectstore import RetryPolicy
from receivewal.daemon.events import ChangeFileCompleted, Event, EventStream, SegmentCompleted
from receivewal.daemon.uploadpolicy import retry_delay
from receivewal.daemon.worker import Worker
from receivewal.errors import StoreError, StoreRefused


class Counting(Worker):
    """Counts its passes; a completed change file makes one due."""

    def __init__(self, events: EventStream, interval: float | None) -> None:
        super().__init__("counting", events, clock=lambda: 42.0)
        self.interval = interval
        self.passes = 0
        self.passed = threading.Semaphore(0)

    def follow(self, event: Event) -> None:
        if isinstance(event, ChangeFileCompleted):
            self.due()

    def run(self) -> None:
        while self.await_due(self.interval):
            self.passes += 1
            self.passed.release()


def started(interval: float | None) -> tuple[Counting, EventStream]:
    events = EventStream()
    worker = Counting(events, interval)
    worker.follow_events()
    worker.start_thread()
    return worker, events


def test_the_first_pass_comes_at_once_and_the_next_when_an_event_makes_it_due() -> None:
    worker, events = started(interval=None)
    try:
        assert worker.passed.acquire(timeout=10)
        events(SegmentCompleted("000000010000000000000001", 1, 0, 0x1000000))  # not one it follows
        assert not worker.passed.acquire(timeout=0.3)
        events(ChangeFileCompleted("0000000000002000.jsonl", 0x2000))
        assert worker.passed.acquire(timeout=10)
        assert worker.running
    finally:
        worker.close()
    assert not worker.running
    assert worker.passes == 2


def test_the_timer_makes_a_pass_due_and_close_ends_the_wait() -> None:
    worker, _ = started(interval=0.05)
    try:
        for _ in range(3):
            assert worker.passed.acquire(timeout=10)
    finally:
        worker.close()
    assert not worker.running
    assert worker.stopping


def test_close_stops_following_the_events() -> None:
    worker, events = started(interval=None)
    assert worker.passed.acquire(timeout=10)
    worker.close()
    events(ChangeFileCompleted("0000000000002000.jsonl", 0x2000))
    assert worker.passes == 1


def test_a_failure_is_stated_with_its_kind_and_the_workers_clock() -> None:
    failure = Counting(EventStream(), None).failure(StoreError("no answer"))
    assert (failure.kind, failure.message, failure.at) == ("StoreError", "no answer", 42.0)


@pytest.mark.parametrize("attempt", [0, 3, 10])
def test_a_retryable_failure_backs_off_and_a_refusal_waits_the_longest(attempt: int) -> None:
    policy = RetryPolicy(attempts=2, base_delay=0.5, max_delay=4.0)
    assert 0 <= retry_delay(policy, StoreError("down"), attempt) \
        <= min(4.0, 0.5 * 2 ** attempt)
    assert retry_delay(policy, StoreRefused("no such bucket"), attempt) == 4.0


#: the rooms whose threads are workers; the metrics endpoint's HTTP server is a library's loop
WORKER_ROOMS = ("daemon", "walreceiver", "logicalreceiver")
NOT_A_WORKER = {"daemon/worker.py", "daemon/endpoint.py"}


def test_a_receivers_thread_is_a_worker() -> None:
    """No module of the daemon's rooms starts a thread, or waits on a condition and a stop
    event, of its own: the skeleton is daemon/worker.py's, written once."""
    package = Path(receivewal.__file__).parent
    own = []
    for room in WORKER_ROOMS:
        for path in sorted((package / room).glob("*.py")):
            name = f"{room}/{path.name}"
            text = path.read_text()
            if name not in NOT_A_WORKER and any(
                    spelling in text for spelling in ("threading.Thread(",
                                                      "threading.Condition(")):
                own.append(name)
    assert own == []
