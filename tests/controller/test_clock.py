"""The API server's clock from Date headers: converges on the true offset within half a second,
and starts over when a clock jumps."""

from __future__ import annotations

from email.utils import formatdate

from gpuq.controller.clock import ServerClock, parse_http_date


def date(epoch: float) -> str:
    return formatdate(epoch, usegmt=True)  # whole seconds, as servers send it


def test_offset_is_bounded_by_the_samples() -> None:
    clock = ServerClock(wall=lambda: 1000.0)
    true_offset = 42.7
    for local in (1000.0, 1000.3, 1001.1, 1002.6, 1003.9):
        clock.observe(local, local + 0.01, date(local + 0.005 + true_offset))
    assert abs(clock.offset - true_offset) <= 0.5
    assert abs(clock.now() - (1000.0 + true_offset)) <= 0.5


def test_no_samples_means_no_offset_and_bad_headers_are_ignored() -> None:
    clock = ServerClock(wall=lambda: 5.0)
    clock.observe(1.0, 2.0, None)
    clock.observe(1.0, 2.0, "not a date")
    assert clock.offset == 0.0 and clock.now() == 5.0
    assert parse_http_date("garbage") is None


def test_a_jumped_clock_starts_over() -> None:
    clock = ServerClock()
    for local in (100.0, 101.0, 102.0):
        clock.observe(local, local + 0.01, date(local))
    clock.observe(200.0, 200.01, date(200.0 + 3600))  # server (or we) jumped an hour
    assert abs(clock.offset - 3600) <= 1.0
