"""``speechstream live``: the callback only queues, Ctrl-C flushes, and a virtual microphone
(ALSA ``file`` plugin reading a raw s16le file) gives the same transcript as ``transcribe``."""

import ctypes.util
import json
import os
import queue
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from speechstream import live
from speechstream.audio import SAMPLE_RATE

ROOT = Path(__file__).resolve().parent.parent
SPEECHSTREAM = str(Path(sys.executable).parent / "speechstream")
ALSA_CONF = Path("/usr/share/alsa/alsa.conf")

# The capture side of the default device reads the raw file; ``plug`` converts to what PortAudio asks for.
# PortAudio must record int16 here: the plug's float conversion of this chain garbles samples (measured),
# which is one reason ``live`` records int16 and converts itself.
ASOUNDRC = """\
pcm.!default {{
    type asym
    playback.pcm "null"
    capture.pcm "speechstream_mic"
}}
pcm.speechstream_mic {{
    type plug
    slave {{
        pcm "speechstream_file"
        format S16_LE
        rate 16000
        channels 1
    }}
}}
pcm.speechstream_file {{
    type file
    slave.pcm "null"
    file "/dev/null"
    infile "{infile}"
    format "raw"
}}
"""


def have_audio_libraries() -> bool:
    return bool(ctypes.util.find_library("asound")) and bool(ctypes.util.find_library("portaudio"))


needs_alsa = pytest.mark.skipif(not have_audio_libraries() or not ALSA_CONF.exists(),
                                reason="libasound2 / libportaudio2 (or the ALSA configuration) is not installed")


def virtual_mic(tmp_path: Path, samples: np.ndarray) -> dict:
    """Environment for a subprocess whose default ALSA capture device plays ``samples`` (float, 16 kHz).

    ``ALSA_CONFIG_PATH`` lists the system configuration and ours (HOME stays, so the weight cache is found);
    PortAudio then lists ``default`` as an input device.
    """
    raw = tmp_path / "mic.raw"
    np.round(np.clip(samples, -1, 32767 / 32768) * 32768).astype("<i2").tofile(raw)
    conf = tmp_path / "asoundrc"
    conf.write_text(ASOUNDRC.format(infile=raw))
    return dict(os.environ, ALSA_CONFIG_PATH=f"{ALSA_CONF}:{conf}", HF_HUB_OFFLINE="1")


def jfk() -> np.ndarray:
    audio, rate = sf.read(ROOT / "samples/jfk.wav", dtype="float32")
    assert rate == SAMPLE_RATE and audio.ndim == 1
    return audio


def run_cli(args: list[str], env: dict, timeout: float = 1800) -> subprocess.CompletedProcess:
    return subprocess.run([SPEECHSTREAM, *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout)


# -- the design, without a sound card ------------------------------------------------------------------------------


def test_callback_only_queues_a_copy():
    blocks: queue.Queue = queue.Queue()
    callback = live.make_callback(blocks)
    indata = (np.arange(1600, dtype=np.int16) - 800).reshape(-1, 1)
    callback(indata, 1600, None, 0)
    callback(indata, 1600, None, 4)  # PortAudio flagged an overflow
    indata[:] = 0  # PortAudio reuses its buffer
    first, flagged = blocks.get_nowait()
    assert not flagged and first[:, 0].tolist() == list(range(-800, 800))
    assert blocks.get_nowait()[1] and blocks.empty()
    # the callback's closure holds the queue, counters and options: no session, no model
    held = [cell.cell_contents for cell in callback.__closure__]
    assert all(isinstance(x, (queue.Queue, int, list, type(None))) for x in held), held


def test_callback_stops_at_the_limit_and_drops_when_full():
    class Stop(Exception):
        pass

    blocks, dropped = queue.Queue(maxsize=2), [0]
    callback = live.make_callback(blocks, limit=2500, stop_exception=Stop, dropped=dropped)
    callback(np.ones((1600, 1), np.int16), 1600, None, 0)
    with pytest.raises(Stop):  # ends the stream: an unpaced device would otherwise spin on
        callback(np.ones((1600, 1), np.int16), 1600, None, 0)
    assert [blocks.get_nowait()[0].shape[0] for _ in range(2)] == [1600, 900]
    full, dropped = queue.Queue(maxsize=1), [0]
    callback = live.make_callback(full, dropped=dropped)
    for _ in range(3):
        callback(np.ones((1600, 1), np.int16), 1600, None, 0)
    assert full.qsize() == 1 and dropped == [2]


class RecordingSession:
    """Stands in for StreamingSession: records what the main loop feeds."""

    def __init__(self):
        self.fed: list[int] = []
        self.finished = False

    def feed(self, samples):
        assert samples.dtype == np.float32
        self.fed.append(samples.size)
        return []

    def finish(self):
        self.finished = True
        return ["end"]


def test_main_loop_counts_samples_and_stops_on_the_flag():
    blocks: queue.Queue = queue.Queue()
    callback = live.make_callback(blocks)
    for _ in range(5):
        callback(np.full((1600, 1), 16384, np.int16), 1600, None, 0)
    session, flagged = RecordingSession(), [0]
    stop = live.StopFlag()
    source = live.queued_blocks(blocks, stop, lambda: False, flagged)
    events, taken = live.feed_blocks(session, source, 4000, lambda e: None, stop)
    assert session.fed == [1600, 1600, 800] and taken == 4000 and not session.finished
    assert live.finish_session(session, lambda e: None) == ["end"] and session.finished
    # Ctrl-C: the flag ends the loop after the block being fed
    session, stop = RecordingSession(), live.StopFlag()
    source = live.queued_blocks(blocks, stop, lambda: True, flagged)
    first = next(source)
    stop.event.set()
    events, taken = live.feed_blocks(session, [first, first, first], None, lambda e: None, stop)
    assert session.fed == [1600] and list(source) == []  # the queue is no longer read
    assert live.to_float(np.array([[16384], [-32768]], np.int16)).tolist() == [0.5, -1.0]


def test_first_sigint_sets_the_flag_second_interrupts():
    before = signal.getsignal(signal.SIGINT)  # SIG_IGN when pytest was started in the background by a shell
    with live.StopFlag() as stop:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)
        assert stop.set
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
    assert signal.getsignal(signal.SIGINT) is before  # the handler it found is back


def test_option_parsing():
    assert live.parse_device("3") == 3 and live.parse_device(" default ") == "default" and live.parse_device(None) is None
    assert live.seconds_to_samples(2.5) == 40000 and live.seconds_to_samples(None) is None
    for bad in (0, -1, float("nan"), float("inf"), 1e-9, 1e305):
        with pytest.raises(live.InputError):
            live.seconds_to_samples(bad)
    assert live.describe_devices([], None) == ["no audio input devices found"]


# -- the real command through a virtual microphone -----------------------------------------------------------------


@needs_alsa
def test_list_devices_and_bad_input(tmp_path):
    env = virtual_mic(tmp_path, jfk())
    listed = run_cli(["live", "--list-devices"], env)
    assert listed.returncode == 0 and "default" in listed.stdout
    for args, match in [
        (["--input-device", "no-such-microphone"], "no-such-microphone"),
        (["--input-device", "99"], "99"),
        (["--seconds", "0"], "--seconds"),
        (["--seconds", "abc"], "--seconds"),
        (["--vad-min-silence-ms", "1"], "silence"),
        (["--format", "docx"], "--format"),
    ]:
        result = run_cli(["live", "--model", "tiny-random", *args], env)
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2 and len(lines) == 1, (args, result.stderr)
        assert lines[0].startswith("speechstream: error:") and match in lines[0]
    # no sound card and no virtual one: nothing to list, and live says so
    bare = dict(env, ALSA_CONFIG_PATH=str(ALSA_CONF))
    assert run_cli(["live", "--list-devices"], bare).stdout.strip() == "no audio input devices found"
    result = run_cli(["live", "--model", "tiny-random"], bare)
    assert result.returncode == 2 and result.stderr.strip().startswith("speechstream: error: no audio input device")


@needs_alsa
@pytest.mark.slow
def test_live_equals_transcribe_on_the_same_audio(tmp_path):
    """The virtual microphone plays samples/jfk.wav; live writes what transcribe writes (both with their default VAD
    segmentation, which cuts jfk.wav at its long pause)."""
    audio = jfk()
    env = virtual_mic(tmp_path, audio)
    model = ["--model", "smollm2-whisper-base"]
    out = tmp_path / "live.json"
    seconds = f"{audio.size / SAMPLE_RATE:.4f}"
    result = run_cli(["live", *model, "--seconds", seconds, "--output", str(out), "--format", "json"], env)
    assert result.returncode == 0, result.stderr
    reference = run_cli(["transcribe", "samples/jfk.wav", *model], env)
    assert reference.returncode == 0, reference.stderr
    document = json.loads(out.read_text())
    assert document["text"] == reference.stdout.strip() and document["text"]
    assert result.stdout == reference.stdout  # committed text as it came, then a newline
    assert document["audio_s"] == pytest.approx(11.0) and document["segments"]
    assert all(s["end"] <= 11.0 for s in document["segments"])


@needs_alsa
def test_ctrl_c_finishes_and_saves(tmp_path):
    """SIGINT while it runs: the session is finished, the transcript saved, exit 0."""
    env = virtual_mic(tmp_path, np.tile(jfk(), 30))  # 5.5 minutes: far more than is read before the signal
    out = tmp_path / "live.json"
    process = subprocess.Popen([SPEECHSTREAM, "live", "--model", "tiny-random", "--output", str(out), "--format", "json"],
                               env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 300
        for line in process.stderr:  # wait until it listens (the model is loaded)
            if "listening on" in line or time.time() > deadline:
                break
        time.sleep(3)
        process.send_signal(signal.SIGINT)
        stdout, stderr = process.communicate(timeout=300)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, stderr
    document = json.loads(out.read_text())
    assert 0 < document["audio_s"] < 330 and document["compute_s"] > 0
    assert stdout.endswith("\n") and "Traceback" not in stderr
