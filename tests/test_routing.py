"""Routing a stream's samples: every sample accounted for, the same steps however the audio is sliced."""

import numpy as np
import pytest

from speechstream.routing import Router
from speechstream.vad import Endpoint, Endpointer, VADConfig
from tests.helpers import ScriptedVAD

W = 512  # samples per VAD window
# silence, speech (confirmed after 8 windows), a pause that ends it (19 windows), silence, a blip too short to confirm
SCRIPT = [0.0] * 30 + [0.9] * 20 + [0.0] * 40 + [0.9] * 3


def router(script=SCRIPT) -> Router:
    return Router(Endpointer(VADConfig(), model=ScriptedVAD(script)))


def merged(steps):
    """Consecutive audio steps joined, consecutive skips summed (what slicing may split)."""
    out = []
    for kind, value in steps:
        if out and kind == out[-1][0] in ("audio", "skip"):
            out[-1] = (kind, np.concatenate([out[-1][1], value]) if kind == "audio" else out[-1][1] + value)
        else:
            out.append((kind, value))
    return out


def route_in(r: Router, audio: np.ndarray, size: int):
    steps = []
    for at in range(0, audio.size, size):
        steps += r.route(audio[at : at + size])
    return steps


def test_without_vad_every_sample_is_audio():
    r = Router()
    audio = np.ones(1000, np.float32)
    assert r.open and r.route(audio) == [("audio", audio)] and r.routed == 1000 and r.onset() == []
    r.lose(300)
    assert r.routed == 1300 and not r.open and r.waiting == 0


def test_a_segment_is_the_pad_before_its_speech_to_its_cut():
    audio = np.arange(len(SCRIPT) * W, dtype=np.float32)  # each sample names its position
    r = router()
    steps = merged(r.route(audio))
    start = (30 - 16) * W  # speech_pad_ms = 512 ms = 16 windows before the first speech window
    cut = (50 + 19) * W  # the end of the 19th window of the pause (min_silence_ms = 600 ms)
    assert [kind for kind, _ in steps] == ["skip", "start", "audio", "cut", "skip"]
    assert steps[0] == ("skip", start) and steps[1] == ("start", start)
    assert np.array_equal(steps[2][1], audio[start:cut])
    assert r.endpoints == [Endpoint(speech_end=50 * W, cut=cut)] and not r.open
    # after the cut only the look-back before the blip (still unconfirmed) waits; the rest was dropped
    assert r.routed + r.waiting == audio.size and r.waiting == 3 * W + 16 * W
    assert steps[4][1] == r.routed - cut


@pytest.mark.parametrize("size", [W, 700, 5_000])
def test_the_steps_do_not_depend_on_the_slicing(size):
    audio = np.random.default_rng(0).uniform(-1, 1, len(SCRIPT) * W).astype(np.float32)
    whole, sliced = router(), router()
    one, many = merged(whole.route(audio)), merged(route_in(sliced, audio, size))
    assert [(k, v if k != "audio" else v.tobytes()) for k, v in one] == \
        [(k, v if k != "audio" else v.tobytes()) for k, v in many]
    assert (whole.routed, whole.waiting, whole.endpoints) == (sliced.routed, sliced.waiting, sliced.endpoints)


def test_speech_unconfirmed_where_the_audio_stops_opens_its_segment():
    audio = np.arange(len(SCRIPT) * W, dtype=np.float32)
    r = router()
    r.route(audio)
    before = r.routed
    steps = r.onset()
    start = (len(SCRIPT) - 3 - 16) * W  # the blip's look-back
    assert [kind for kind, _ in steps] == ["skip", "start", "audio"] and steps[1] == ("start", start)
    assert steps[0][1] == start - before and np.array_equal(steps[2][1], audio[start:])
    assert r.open and r.waiting == 0 and r.routed == audio.size and r.onset() == []


def test_lost_audio_drops_what_waits_and_routing_goes_on_after_it():
    r = router([0.0] * 10 + [0.9] * 3 + [0.0] * 10 + [0.9] * 30)
    r.route(np.zeros(13 * W, np.float32))  # a blip not yet confirmed: its look-back waits
    assert r.waiting > 0 and r.onset() != []  # where the audio stops, it opens a segment
    r.lose(5 * W)
    assert r.waiting == 0 and not r.open and r.routed == 18 * W and r.vad.samples_seen == 18 * W
    steps = merged(r.route(np.zeros(40 * W, np.float32)))  # 10 windows of silence, then speech
    # its look-back (16 windows) would reach back across the gap: the segment starts where the audio goes on
    assert [kind for kind, _ in steps] == ["start", "audio"] and steps[0] == ("start", 18 * W)
    assert steps[1][1].size == 40 * W
