"""RateClock: absolute deadlines (no drift), the period error with every overrun at its size, counted misses."""

import time

import numpy as np
import pytest

from embodyrl.hal.clock import RateClock, set_realtime_priority


def _spin(seconds: float) -> None:
    """A loop body that takes ``seconds`` (spinning: no sleep overshoot)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


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
    times, late = [], 0.0
    for i in range(100):
        time.sleep(0.001 * (i % 3))  # a body of varying length must not shift the schedule
        late = clock.tick()
        times.append(time.perf_counter())
    # tick k returns at its deadline start + (k + 1) * period, plus its own lateness; only an
    # overrun shifts the schedule, by its size: errors never accumulate however long the bodies took
    st = clock.stats()
    elapsed = times[-1] - start
    expected = 100 / 200 + st.schedule_shift_ms / 1e3
    assert expected - 0.0005 <= elapsed <= expected + 0.0005 + late
    assert st.ticks == 100 and st.missed >= st.overruns
    assert 0 <= st.p50_ms <= st.p99_ms <= st.max_ms
    # the periods are the time between tick returns: together they span the whole run
    errors = clock.period_errors()
    assert errors.shape == (100,)
    assert abs(100 / 200 + errors.sum() - elapsed) < 0.0005
    assert st.max_ms == pytest.approx(np.abs(errors).max() * 1e3)


def _overrun_once(body_s: float) -> tuple[float, float, RateClock]:
    """A 100 Hz loop whose fifth body takes ``body_s``: (that body's measured length, its tick's
    period error, the clock)."""
    clock = RateClock(100)
    clock.tick()
    for _ in range(3):
        _spin(0.001)
        clock.tick()
    body_start = time.perf_counter()
    _spin(body_s)
    body = time.perf_counter() - body_start
    clock.tick()
    return body, float(clock.period_errors()[-1]), clock


def test_a_5ms_overrun_is_a_5ms_period_error_and_a_5ms_overrun():
    for _ in range(10):  # a busy machine may preempt a body: then it was no 15 ms body, or not the only overrun
        body, error, clock = _overrun_once(0.015)  # the body overruns the 10 ms period by 5 ms
        assert error == pytest.approx(body - 0.01, abs=0.0005)  # the body's own overrun, whole
        undisturbed = np.abs(clock.period_errors()[:-1]).max() < 0.002  # no other tick preempted late
        if abs(body - 0.015) < 0.0005 and clock.overruns == 1 and undisturbed:
            break
    assert abs(body - 0.015) < 0.0005 and clock.overruns == 1 and undisturbed, \
        "the machine never ran the loop undisturbed"
    assert error * 1e3 == pytest.approx(5.0, abs=1.5)  # not +10 ms: the old schedule's next deadline
    st = clock.stats()
    assert st.overruns == 1 and st.missed >= 1
    assert st.overrun_max_ms == pytest.approx(error * 1e3, abs=1e-6)  # its size is its period error
    assert st.overrun_max_ms == pytest.approx(5.0, abs=1.5)
    assert st.overrun_p99_ms == pytest.approx(st.overrun_max_ms)
    assert st.max_ms == pytest.approx(abs(error) * 1e3)  # the headline figure sees it
    clock.tick()  # the late step went on at once; the next period is a full one, not a rush
    assert clock.period_errors()[-1] > -0.0005


def test_a_late_wake_up_is_period_error_but_not_an_overrun(monkeypatch):
    real_sleep = time.sleep
    for _ in range(10):
        clock = RateClock(100)
        oversleep = [0.003]
        monkeypatch.setattr(time, "sleep", lambda s, extra=oversleep: real_sleep(s + (extra.pop() if extra else 0)))
        clock.tick()  # wakes about 3 ms late
        body_start = time.perf_counter()
        _spin(0.008)  # a body that fits its period, started late: it ends past the deadline
        body = time.perf_counter() - body_start
        clock.tick()
        monkeypatch.setattr(time, "sleep", real_sleep)
        first, second = clock.period_errors()
        if abs(body - 0.008) < 0.0005 and 0.002 < first < 0.004:
            break
    assert abs(body - 0.008) < 0.0005 and 0.002 < first < 0.004, "the machine never ran the loop undisturbed"
    st = clock.stats()
    assert st.missed == 1 and st.overruns == 0 and st.overrun_max_ms == 0.0
    assert second == pytest.approx(body - 0.01, abs=0.0005)  # went on at once: a short period
    assert st.max_ms == pytest.approx(first * 1e3)
    assert st.schedule_shift_ms == pytest.approx((first + second) * 1e3, abs=0.01)


def test_an_overrun_counts_every_skipped_deadline_and_does_not_rush():
    clock = RateClock(100)
    clock.tick()
    time.sleep(0.035)  # the body overruns by two and a half periods: three deadlines pass
    clock.tick()
    assert clock.missed in (3, 4)
    assert clock.stats().overrun_max_ms > 25.0
    before = time.perf_counter()
    clock.tick()  # the next deadline is a full period after the late tick
    assert time.perf_counter() - before > 0.008
    st = clock.stats()
    assert st.missed == clock.missed and st.overruns == 1
    assert st.schedule_shift_ms > 25.0


def test_restart_starts_a_new_schedule():
    clock = RateClock(50)
    clock.tick()
    time.sleep(0.1)
    clock.restart()
    clock.tick()
    st = clock.stats()
    assert clock.missed == 0 and clock.ticks == 1 and st.overruns == 0
    assert abs(clock.period_errors()[0]) < 0.05  # measured from the restart, not the last tick (0.1 s)


def test_history_keeps_the_latest_ticks_in_order():
    clock = RateClock(1000, history=4)
    for _ in range(6):
        clock.tick()
    _spin(0.003)
    clock.tick()
    errors = clock.period_errors()
    assert errors.shape == (4,) and errors[-1] > 0.002  # the overrun is the newest
    assert clock.stats().ticks == 7
