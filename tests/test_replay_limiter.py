"""The samples-per-insert limiter holds the ratio, blocks, and releases when the other side moves."""

import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from embodyrl.replay import RateLimiter


def test_sampling_waits_for_min_size_then_holds_the_ratio():
    lim = RateLimiter(samples_per_insert=2.0, min_size=10, error_buffer=4.0)
    lim.record_insert(9)
    assert not lim.can_sample(1)
    lim.record_insert(1)
    # at min size: diff = 20 - 0 >= min_diff = 16, so 4 samples are allowed, the 5th is not
    assert lim.can_sample(4) and not lim.can_sample(5)
    lim.record_sample(4)
    assert not lim.can_sample(1)
    assert lim.can_insert(4) and not lim.can_insert(5)  # 28 - 4 = 24 = max_diff
    lim.record_insert(1)
    assert lim.can_sample(2) and not lim.can_sample(3)


@settings(max_examples=100, deadline=None)
@given(spi=st.floats(0.25, 8.0), min_size=st.integers(0, 50), slack=st.floats(1.0, 40.0),
       ops=st.lists(st.booleans(), min_size=1, max_size=300))
def test_greedy_traffic_stays_within_the_error_buffer(spi, min_size, slack, ops):
    lim = RateLimiter(spi, min_size, max(spi, 1.0) * slack)
    for want_insert in ops:
        if want_insert and lim.can_insert(1):
            lim.record_insert(1)
        elif not want_insert and lim.can_sample(1):
            lim.record_sample(1)
        if lim.inserts >= min_size:
            diff = lim.inserts * spi - lim.samples
            assert lim.min_diff - 1e-9 <= diff <= lim.max_diff + spi + 1e-9
    assert lim.can_insert(1) or lim.can_sample(1)  # never both blocked: no deadlock
    assert lim.insert_room() >= 0


def test_a_blocked_sampler_is_released_by_an_insert_and_a_blocked_inserter_by_a_sample():
    lim = RateLimiter(samples_per_insert=1.0, min_size=2, error_buffer=1.0)
    got = []
    sampler = threading.Thread(target=lambda: got.append(lim.await_sample(1, timeout_s=10)))
    sampler.start()
    time.sleep(0.05)
    assert sampler.is_alive() and not got  # blocked: nothing inserted
    lim.record_insert(2)
    sampler.join(5)
    assert got == [True]
    lim.record_sample(1)
    lim.record_insert(2)  # inserts 4, samples 1: diff 3 = max_diff
    assert not lim.can_insert(1)
    inserted = []
    inserter = threading.Thread(target=lambda: inserted.append(lim.await_insert(1, timeout_s=10)))
    inserter.start()
    time.sleep(0.05)
    assert inserter.is_alive() and not inserted
    lim.record_sample(1)
    inserter.join(5)
    assert inserted == [True]
    t0 = time.monotonic()
    assert lim.await_sample(100, timeout_s=0.05) is False and time.monotonic() - t0 < 2


def test_settings_that_would_deadlock_are_refused():
    with pytest.raises(ValueError, match="error_buffer"):
        RateLimiter(samples_per_insert=4.0, min_size=10, error_buffer=2.0)
    with pytest.raises(ValueError, match="samples_per_insert must be positive"):
        RateLimiter(samples_per_insert=0.0, min_size=10, error_buffer=2.0)


def test_behind_is_how_far_the_samples_trail_the_ratio():
    lim = RateLimiter(samples_per_insert=2.0, min_size=10, error_buffer=4.0)
    lim.record_insert(8)
    assert lim.behind() == 0  # the warm-up buys nothing
    lim.record_insert(5)
    assert lim.behind() == 6  # 3 rows past min_size at 2 samples each
    lim.record_sample(10)
    assert lim.behind() == -4 and not lim.can_sample(1)  # ahead by the whole error buffer
