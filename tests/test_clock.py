"""RateClock: absolute deadlines (no drift), counted misses, lateness statistics."""

import time

import pytest

from embodyrl.hal.clock import RateClock, set_realtime_priority


def test_rate_out_of_range_is_refused():
    with pytest.raises(ValueError, match="hz"):
        RateClock(5)
    with pytest.raises(ValueError, match="hz"):
        RateClock(2000)
    with pytest.raises(ValueError, match="priority"):
        set_realtime_priority(0)


def test_ticks_land_on_absolute_deadlines_without_drift():
    clock = RateClock(200)
    start = time.perf_counter()
    times = []
    for i in range(100):
        time.sleep(0.001 * (i % 3))  # a body of varying length must not shift the schedule
        clock.tick()
        times.append(time.perf_counter())
    # tick k returns at its deadline start + (k + 1 + skipped) * period, plus its own lateness:
    # errors never accumulate, however long the bodies took or how loaded the machine is
    elapsed = times[-1] - start
    expected = (100 + clock.missed) / 200
    assert expected - 0.0005 <= elapsed <= expected + 0.0005 + clock.stats().max_ms / 1e3
    st = clock.stats()
    assert st.ticks == 100
    assert 0 <= st.p50_ms <= st.p99_ms <= st.max_ms


def test_an_overrun_counts_every_skipped_deadline_and_does_not_rush():
    clock = RateClock(100)
    clock.tick()
    time.sleep(0.035)  # the body overruns by three and a half periods
    clock.tick()
    assert clock.missed in (3, 4)
    before = time.perf_counter()
    clock.tick()  # the next deadline is a full period after the one it woke for
    assert time.perf_counter() - before > 0.008
    assert clock.stats().missed == clock.missed


def test_restart_starts_a_new_schedule():
    clock = RateClock(50)
    clock.tick()
    time.sleep(0.1)
    clock.restart()
    clock.tick()
    assert clock.missed == 0 and clock.ticks == 1
