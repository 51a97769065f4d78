"""Episode returns from the step stream, however the stream is cut into batches."""

import numpy as np

from embodyrl.hal.specs import ArraySpec, DictSpec
from embodyrl.hal.steps import NO_POLICY, Source, StepRecorder
from embodyrl.learner.episodes import EpisodeReturns

OBS = DictSpec.of(ArraySpec("x", (1,), np.float32))
ACT = ArraySpec("action", (1,), np.float32, -1, 1)


def stream(rng, episodes: int):
    """Rows of ``episodes`` episodes of random length (some abandoned without a final row), with
    the return and intervention rate each finished one should report."""
    recorder = StepRecorder(OBS, ACT, actor_id=2, device_id=1, capacity=10_000)
    expected = []
    x, a = {"x": np.zeros(1, np.float32)}, np.zeros(1, np.float32)
    for _ in range(episodes):
        length = int(rng.integers(1, 40))
        rewards = rng.normal(size=length).astype(np.float32)
        sources = rng.choice([Source.ONLINE, Source.INTERVENTION], size=length)
        for reward, source in zip(rewards, sources, strict=True):
            recorder.add(x, a, a, float(reward), False, False, NO_POLICY, source=source)
        if rng.random() < 0.2:
            recorder.abandon_episode()  # never finished: reported by no one
            continue
        recorder.add_final(x)
        expected.append((float(rewards.sum(dtype=np.float64)), float(np.mean(sources == Source.INTERVENTION))))
    return recorder.flush(), expected


def test_returns_and_rates_are_the_same_for_any_cut_of_the_stream():
    rng = np.random.default_rng(0)
    steps, expected = stream(rng, 60)
    arrays = steps.arrays()
    for _ in range(20):
        cuts = np.sort(rng.choice(np.arange(1, len(steps)), size=int(rng.integers(1, 80)), replace=False))
        returns, finished = EpisodeReturns(), 0
        for lo, hi in zip([0, *cuts], [*cuts, len(steps)], strict=True):
            part = type(steps)(observation={"x": arrays["observation/x"][lo:hi]},
                               **{k: v[lo:hi] for k, v in arrays.items() if not k.startswith("observation/")})
            finished += returns.add(part)
        assert finished == len(expected)
        # within a batch, episodes are reported in no particular order
        np.testing.assert_allclose(sorted(returns.take_finished()), sorted(r for r, _ in expected), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(sorted(returns.take_intervention_rates()), sorted(k for _, k in expected))
