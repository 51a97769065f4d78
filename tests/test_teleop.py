"""Teleop sources by name: gamepad and spacemouse decoding on recorded input events, the keyboard
through a pipe, scripts, and the refusals."""

import json
import os
import time

import numpy as np
import pytest

from embodyrl.hal import teleop
from embodyrl.hal.actor import ActorConfig
from embodyrl.hal.intervention import EpisodeAborted, KeyboardTeleop
from embodyrl.hal.operator import Answer, TerminalOperator
from embodyrl.hal.specs import ArraySpec, SpecError
from embodyrl.hal.teleop import (
    ABS_HAT0X,
    ABS_RZ,
    ABS_X,
    ABS_Y,
    BTN_0,
    BTN_1,
    BTN_SELECT,
    BTN_TL,
    EV_ABS,
    EV_KEY,
    EV_REL,
    EV_SYN,
    GAMEPAD,
    SPACEMOUSE,
    EventTeleop,
    TeleopError,
    make_source,
    read_recording,
)

ACTION = ArraySpec("torque", (3,), np.float32, -2.0, 2.0)
SYN = (EV_SYN, 0, 0)


def write_recording(path, events, absinfo=None):
    """A recording as a robot session would leave it: header, then [seconds, type, code, value]."""
    header = {"format": "embodyrl.input-events", "version": 1, "device": "Xbox Wireless Controller",
              "absinfo": {str(k): v for k, v in (absinfo or {}).items()}}
    lines = [json.dumps(header)] + [json.dumps([round(0.001 * i, 3), *e]) for i, e in enumerate(events)]
    path.write_text("\n".join(lines) + "\n")
    return path


# a person's session: push the left stick right and up, let go, hold the bumper, press Select
SESSION = [
    (EV_ABS, ABS_X, 32767), (EV_ABS, ABS_Y, -32768), SYN,    # full right, full up
    (EV_ABS, ABS_X, 16384), SYN,                             # half right
    (EV_ABS, ABS_X, 0), (EV_ABS, ABS_Y, 0), SYN,             # at rest: the policy acts
    (EV_ABS, ABS_X, 2000), SYN,                              # inside the dead zone
    (EV_KEY, BTN_TL, 1), SYN,                                # bumper held: control at rest
    (EV_KEY, BTN_TL, 0), SYN,
    (EV_ABS, ABS_HAT0X, -1), SYN,                            # d-pad left drives element 4: not here
    (EV_KEY, BTN_SELECT, 1), SYN, (EV_KEY, BTN_SELECT, 0), SYN,
]


def test_gamepad_decodes_a_recorded_session_frame_by_frame(tmp_path):
    absinfo, events = read_recording(write_recording(tmp_path / "pad.jsonl", SESSION,
                                                     {ABS_X: [-32768, 32767, 128]}))
    pad = EventTeleop(GAMEPAD, ACTION, absinfo=absinfo)
    frames = []
    for _, kind, code, value in events:
        pad.feed(kind, code, value)
        if (kind, code) == (EV_SYN, 0):
            try:
                frames.append(pad.poll())
            except EpisodeAborted:
                frames.append("abort")
    full, half, rest, dead, held, released, hat, abort, after = frames
    np.testing.assert_allclose(full, [2.0, 2.0, 0.0], atol=1e-3)  # y up is positive
    np.testing.assert_allclose(half, [1.0, 2.0, 0.0], atol=1e-3)  # a frame changes only what it names
    assert rest is None and dead is None and released is None and hat is None
    np.testing.assert_array_equal(held, [0.0, 0.0, 0.0])          # the person holds the middle
    assert full.dtype == np.float32
    assert abort == "abort" and after is None                     # the abort is said once


def test_gamepad_source_replays_a_recording_through_the_same_decoding(tmp_path):
    path = write_recording(tmp_path / "pad.jsonl", [(EV_ABS, ABS_X, -32768), SYN, (EV_ABS, ABS_RZ, 255), SYN])
    source = make_source(f"gamepad:{path}", ArraySpec("a", (8,), np.float32, -1.0, 1.0))
    try:
        deadline = time.monotonic() + 5
        while not source.finished and time.monotonic() < deadline:
            time.sleep(0.01)
        action = source.poll({})
    finally:
        source.close()
    np.testing.assert_allclose(action, [-1, 0, 0, 0, 0, 0, 0, 1], atol=1e-3)  # left stick; right trigger
    assert source.teleop.events == 4


def test_spacemouse_reads_relative_and_absolute_axes_and_goes_quiet_when_released():
    mouse = EventTeleop(SPACEMOUSE, ArraySpec("twist", (6,), np.float32, -1.0, 1.0))
    mouse.feed(EV_REL, 2, -350)  # older kernels: relative axes, reported while displaced
    mouse.feed(*SYN)
    np.testing.assert_allclose(mouse.poll(), [0, 0, -1, 0, 0, 0])
    time.sleep(SPACEMOUSE.rel_hold_s * 1.5)  # released: the kernel drops zeros, the axis goes quiet
    assert mouse.poll() is None
    mouse.feed(EV_ABS, 0, 175)  # newer kernels: absolute axes
    mouse.feed(*SYN)
    np.testing.assert_allclose(mouse.poll(), [0.5, 0, 0, 0, 0, 0])
    mouse.feed(EV_ABS, 0, 0)
    mouse.feed(EV_KEY, BTN_0, 1)  # the left button: control at rest
    mouse.feed(*SYN)
    np.testing.assert_array_equal(mouse.poll(), np.zeros(6))
    mouse.feed(EV_KEY, BTN_1, 1)  # the right button throws the episode away
    with pytest.raises(EpisodeAborted):
        mouse.poll()


def test_event_codes_are_the_kernels():
    ecodes = pytest.importorskip("evdev.ecodes")
    for name in ("EV_SYN", "EV_KEY", "EV_REL", "EV_ABS", "ABS_X", "ABS_Y", "ABS_RZ", "ABS_HAT0X",
                 "BTN_0", "BTN_1", "BTN_TL", "BTN_SELECT", "BTN_SOUTH"):
        assert getattr(teleop, name) == getattr(ecodes, name), name


def test_keyboard_keys_through_a_pipe_and_the_operator_shares_its_reader():
    r, w = os.pipe()
    spec = ArraySpec("torque", (2,), np.float32, -2.0, 2.0)
    keys = make_source("keyboard", spec, fd=r)
    assert isinstance(keys, KeyboardTeleop)
    operator = TerminalOperator(keys=keys.other_keys, out=open(os.devnull, "w"))  # noqa: SIM115
    try:
        os.write(w, b"w")  # element 1 down by half its range
        deadline = time.monotonic() + 5
        while (action := keys.poll({})) is None and time.monotonic() < deadline:
            time.sleep(0.01)
        np.testing.assert_allclose(action, [0.0, -1.0])
        operator.ask(0, "episode over")
        os.write(w, b"zs")  # not a key of the keymap: the operator's
        deadline = time.monotonic() + 5
        while (answer := operator.answer()) is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert answer is Answer.SUCCESS
        os.write(w, b"x")
        deadline = time.monotonic() + 5
        with pytest.raises(EpisodeAborted):  # noqa: PT012
            while time.monotonic() < deadline:
                keys.poll({})
                time.sleep(0.01)
    finally:
        keys.close()
        os.close(w)
        os.close(r)


def test_script_source_counts_steps_per_episode(tmp_path, monkeypatch):
    (tmp_path / "expert_a.py").write_text(
        "def act(observation, step):\n    return None if step % 2 else [float(step), 0.0, 0.0]\n"
        "def wrong(observation, step):\n    return [1.0]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    source = make_source("script:expert_a:act", ACTION)
    assert [None if a is None else float(a[0]) for a in (source.poll({}) for _ in range(4))] == [0.0, None, 2.0, None]
    source.new_episode()
    assert float(source.poll({})[0]) == 0.0
    with pytest.raises(SpecError, match="shaped"):
        make_source("script:expert_a:wrong", ACTION).poll({})


@pytest.mark.parametrize("spec, reason", [
    ("joystick", "unknown teleop source"), ("script:nowhere", "script:module:function"),
    ("script:no_such_module_here:f", "No module"), ("gamepad:/no/such/file", "No such file"),
    ("keyboard:x", "unknown teleop source")])
def test_bad_sources_are_refused_naming_them(spec, reason):
    with pytest.raises(TeleopError, match=reason):
        make_source(spec, ACTION)


def test_a_recording_that_is_not_one_is_refused(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"format": "something else"}\n')
    with pytest.raises(TeleopError, match="not a recording"):
        make_source(f"gamepad:{bad}", ACTION)


def test_the_actor_config_refuses_a_malformed_source_and_reset():
    with pytest.raises(ValueError, match="unknown teleop source"):
        ActorConfig(teleop="mouse")
    with pytest.raises(ValueError, match="actor.reset"):
        ActorConfig(reset="sometimes")
    assert ActorConfig(teleop="script:m:f", reset="operator").reset == "operator"


def test_a_person_sets_the_real_pace_a_script_does_not():
    from embodyrl.cli.person import needs_real_pace
    from embodyrl.config import TrainConfig

    def config(**actor):
        return TrainConfig(actor=ActorConfig(**actor))

    assert not needs_real_pace(config())
    assert not needs_real_pace(config(teleop="script:embodyrl.envs.arm_push:person"))  # waits for credit
    for source in ("keyboard", "gamepad", "spacemouse:/dev/input/event3"):
        assert needs_real_pace(config(teleop=source))
    assert needs_real_pace(config(reset="operator"))


def test_a_scripted_source_imports_from_the_working_directory(tmp_path, monkeypatch):
    """As a robot file's factories do: no PYTHONPATH=. needed for the expert beside the command."""
    import sys

    (tmp_path / "bench_expert.py").write_text("import numpy as np\n\ndef push(observation, step):\n"
                                              "    return np.full(2, 0.5, np.float32)\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".", str(tmp_path))])
    monkeypatch.delitem(sys.modules, "bench_expert", raising=False)
    source = teleop.make_source("script:bench_expert:push", ArraySpec("a", (2,), np.float32, -1, 1))
    try:
        assert sys.modules["bench_expert"].__file__ == str(tmp_path / "bench_expert.py")
    finally:
        sys.modules.pop("bench_expert", None)
    assert source is not None
