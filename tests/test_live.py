"""``speechstream live``: the callback only queues, Ctrl-C flushes, and a virtual microphone
(ALSA ``file`` plugin reading a raw s16le file) gives the same transcript as ``transcribe``."""

import ctypes.util
import itertools
import json
import os
import queue
import signal
import subprocess
import sys
import time
import unicodedata
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from speechstream import live
from speechstream.audio import SAMPLE_RATE
from speechstream.interrupts import Terminated

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
    first, flagged, lost = blocks.get_nowait()
    assert not flagged and not lost and first[:, 0].tolist() == list(range(-800, 800))
    assert blocks.get_nowait()[1] and blocks.empty()
    # the callback's closure holds the queue, counters and options: no session, no model
    held = [cell.cell_contents for cell in callback.__closure__]
    assert all(isinstance(x, (queue.Queue, int, list, type(None))) for x in held), held


def test_callback_stops_at_the_limit_and_drops_when_full():
    class Stop(Exception):
        pass

    blocks, dropped = queue.Queue(maxsize=2), [0, 0]
    callback = live.make_callback(blocks, limit=2500, stop_exception=Stop, dropped=dropped)
    callback(np.ones((1600, 1), np.int16), 1600, None, 0)
    with pytest.raises(Stop):  # ends the stream: an unpaced device would otherwise spin on
        callback(np.ones((1600, 1), np.int16), 1600, None, 0)
    assert [blocks.get_nowait()[0].shape[0] for _ in range(2)] == [1600, 900]
    full, dropped = queue.Queue(maxsize=1), [0, 0]
    callback = live.make_callback(full, dropped=dropped)
    for _ in range(3):
        callback(np.ones((1600, 1), np.int16), 1600, None, 0)
    assert full.qsize() == 1 and dropped == [2, 3200]
    assert full.get_nowait()[2] == 0
    callback(np.ones((800, 1), np.int16), 800, None, 0)
    assert full.get_nowait()[2] == 3200  # the next block queued carries the samples lost before it
    # with a limit, lost samples count: they are part of the audio the device recorded
    blocks, dropped = queue.Queue(maxsize=1), [0, 0]
    callback = live.make_callback(blocks, limit=4000, stop_exception=Stop, dropped=dropped)
    callback(np.ones((1600, 1), np.int16), 1600, None, 0)
    callback(np.ones((1600, 1), np.int16), 1600, None, 0)
    with pytest.raises(Stop):
        callback(np.ones((1600, 1), np.int16), 1600, None, 0)
    assert dropped == [2, 2400]


class RecordingSession:
    """Stands in for StreamingSession: records what the main loop feeds."""

    def __init__(self):
        self.fed: list[int] = []
        self.finished = False
        self.lost_samples = 0

    def feed(self, samples):
        assert samples.dtype == np.float32
        self.fed.append(samples.size)
        return []

    def gap(self, samples):
        self.fed.append(-samples)
        self.lost_samples += samples
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
    # Ctrl-C: recording stops (on_stop is told how much audio is queued) and the blocks already queued are read
    session, stop, told = RecordingSession(), live.StopFlag(), []
    source = live.queued_blocks(blocks, stop, lambda: True, flagged, told.append)
    first = next(source)
    stop.event.set()
    events, taken = live.feed_blocks(session, itertools.chain([first], source), None, lambda e: None, stop)
    assert first[1] == 0 and taken == 3200 and session.fed == [1600, 1600] and told == [0.1] and blocks.empty()
    # a second Ctrl-C: the queue is no longer read, and the loop ends after the block being fed
    for _ in range(3):
        callback(np.full((1600, 1), 16384, np.int16), 1600, None, 0)
    stop.skip_event.set()
    assert list(live.queued_blocks(blocks, stop, lambda: True, flagged)) == [] and blocks.qsize() == 3
    session = RecordingSession()
    events, taken = live.feed_blocks(session, [first, first, first], None, lambda e: None, stop)
    assert session.fed == [1600] and taken == 1600
    assert live.to_float(np.array([[16384], [-32768]], np.int16)).tolist() == [0.5, -1.0]
    # a gap goes to the session before the block after it, and counts toward the limit
    session, gaps = RecordingSession(), []
    blocks = [(np.zeros(1600, np.float32), 0), (np.zeros(1600, np.float32), 3200), (np.zeros(1600, np.float32), 900)]
    events, fed = live.feed_blocks(session, blocks, 6000, lambda e: None, None, lambda at, n: gaps.append((at, n)))
    assert session.fed == [1600, -3200, 1200] and fed == 2800 and gaps == [(1600, 3200)]


class _FakeStream:
    """A PortAudio input stream in the main thread: ``play(n)`` calls the callback with the next n blocks of the
    script (block i holds the value i), as a device does while the main loop is busy."""

    def __init__(self, callback, total, blocksize):
        self.callback, self.total, self.blocksize, self.played = callback, total, blocksize, 0

    def play(self, n):
        for _ in range(min(n, self.total - self.played)):
            self.callback(np.full((self.blocksize, 1), self.played, np.int16), self.blocksize, None, 0)
            self.played += 1

    @property
    def active(self):
        return self.played < self.total

    def stop(self):  # (sounddevice: no more callbacks)
        self.total = self.played

    def __enter__(self):
        self.play(6)  # the model is slow to start: the queue (3 blocks) fills and 3 blocks are dropped
        return self

    def __exit__(self, *exc):
        pass


class _FakeSounddevice:
    CallbackStop = type("CallbackStop", (Exception,), {})
    PortAudioError = RuntimeError

    def __init__(self, total):
        self.total, self.stream = total, None

    def InputStream(self, device, samplerate, channels, dtype, blocksize, callback):  # noqa: N802, ARG002
        self.stream = _FakeStream(callback, self.total, blocksize)
        return self.stream


class _Slow:
    """A real session; each feed lets the fake device play on (one block, four after the block of value 6)."""

    def __init__(self, session, sd):
        self.session, self.sd, self.blocks = session, sd, []

    def feed(self, samples):
        self.blocks.append(round(float(samples[0]) * 32768) if samples.size else None)
        self.sd.stream.play(4 if self.blocks[-1] == 6 else 1)
        return self.session.feed(samples)

    def gap(self, samples):
        self.blocks.append(-samples)
        return self.session.gap(samples)

    def __getattr__(self, name):
        return getattr(self.session, name)


def test_blocks_dropped_while_the_model_is_behind_keep_the_timeline(tiny_model, monkeypatch):
    """Blocks the callback drops (the queue full: the model fell MAX_QUEUED_S behind) are gaps in the session, where
    they happened, and at the end; the stream's times count them, and the user is warned once."""
    from speechstream.config import DecodingConfig
    from speechstream.session import StreamingSession

    monkeypatch.setattr(live, "MAX_QUEUED_S", 0.3)  # 3 blocks of 100 ms
    sd, warnings = _FakeSounddevice(total=13), []
    session = _Slow(StreamingSession(tiny_model, DecodingConfig(chunk_ms=320, vad=False)), sd)
    result = live.record(session, {"index": 0, "name": "fake"}, None, lambda e: None, sd, warn=warnings.append)
    # blocks 0-2 queued, 3-5 dropped; 6, 7, 8 queued; after 6: 9 queued, 10-12 dropped (a gap at the end)
    assert session.blocks == [0, 1, 2, -4800, 6, 7, 8, 9, -4800]
    assert (result.dropped, result.lost_samples, result.samples) == (6, 9600, 11200)
    assert len(warnings) == 1 and "first gap at 0.3 s" in warnings[0] and "times stay" in warnings[0]
    end = result.events[-1]
    assert end.type == "end" and end.audio_s == pytest.approx(1.3) and end.source_s == pytest.approx(1.3)
    assert session.segment_start_times == [0.6]  # the audio after the first gap (after the one at the end: none)


@pytest.mark.parametrize("second_at", [None, 4])
def test_ctrl_c_reads_the_audio_captured_before_it(tiny_model, monkeypatch, second_at):
    """Ctrl-C (while block 1 is fed) stops the recording; the blocks already queued (2-7) are still read, with a
    note of how much; a second Ctrl-C (while block 4 is fed) leaves the rest unread."""
    from speechstream.config import DecodingConfig
    from speechstream.session import StreamingSession

    class Interrupted(_Slow):
        def feed(self, samples):
            events = super().feed(samples)
            if self.blocks[-1] in (1, second_at):
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.05)
            return events

    monkeypatch.setattr(live, "BACKLOG_NOTE_S", 0.5)
    sd, notes = _FakeSounddevice(total=40), []
    session = Interrupted(StreamingSession(tiny_model, DecodingConfig(chunk_ms=320, vad=False)), sd)
    result = live.record(session, {"index": 0, "name": "fake"}, None, lambda e: None, sd, warn=notes.append)
    read = 8 if second_at is None else 5
    assert session.blocks == list(range(read)) and result.interrupted and sd.stream.played == 8
    assert len(notes) == 1 and "reading the 0.6 s of audio captured before Ctrl-C" in notes[0]
    assert result.events[-1].type == "end" and result.events[-1].audio_s == pytest.approx(read / 10)


def test_first_sigint_sets_the_flag_second_skips_third_interrupts():
    before = signal.getsignal(signal.SIGINT)  # SIG_IGN when pytest was started in the background by a shell
    with live.StopFlag() as stop:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)
        assert stop.set and not stop.skip
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)
        assert stop.skip
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
    assert signal.getsignal(signal.SIGINT) is before  # the handler it found is back


def test_sigterm_stops_as_ctrl_c_does_and_is_named():
    """A service manager's stop (SIGTERM) killed `live` with the transcript unsaved; now it counts as a Ctrl-C."""
    before = signal.getsignal(signal.SIGTERM)
    with live.StopFlag() as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)
        assert stop.set and not stop.skip and stop.by == "SIGTERM"
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)
        assert stop.skip and stop.by == "SIGTERM"  # (named by the first)
        with pytest.raises(Terminated):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)
    assert signal.getsignal(signal.SIGTERM) is before


def test_option_parsing():
    assert live.parse_device("3") == 3 and live.parse_device(" default ") == "default"
    assert live.parse_device(None) is None
    # digits int() cannot read (superscripts) are part of a name, not an index: they were a ValueError, exit 1
    assert live.parse_device("mic²") == "mic²" and live.parse_device("²") == "²" and live.parse_device("٣") == 3
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
@pytest.mark.parametrize("how, by", [(signal.SIGINT, "Ctrl-C"), (signal.SIGTERM, "SIGTERM")])
def test_ctrl_c_finishes_and_saves(tmp_path, how, by):
    """SIGINT (or SIGTERM) while it runs: the session is finished, the transcript saved, exit 0."""
    env = virtual_mic(tmp_path, np.tile(jfk(), 30))  # 5.5 minutes: far more than is read before the signal
    out = tmp_path / "live.json"
    command = [SPEECHSTREAM, "live", "--model", "tiny-random", "--output", str(out), "--format", "json"]
    process = subprocess.Popen(command, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 300
        for line in process.stderr:  # wait until it listens (the model is loaded)
            if "listening on" in line or time.time() > deadline:
                break
        time.sleep(3)
        process.send_signal(how)
        stdout, stderr = process.communicate(timeout=300)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, stderr
    document = json.loads(out.read_text())
    # (the ALSA file device is not paced: by the signal it has delivered far more audio than was read, which the
    # queue held or dropped; what it held is read before the end, with a note, and dropped audio counts as time)
    assert document["audio_s"] > 0 and document["compute_s"] > 0
    assert f"captured before {by} ({by} again skips it)" in stderr
    assert stdout.endswith("\n") and "Traceback" not in stderr


def test_a_device_that_opens_but_will_not_start_is_one_line_exit_2(tiny_model):
    """PortAudio can open a device and then fail to start it (taken by another program in between, a Bluetooth
    headset gone to sleep): that is a device error as a failed open is, an InputError naming the device, not
    "PortAudioError: Error starting stream" with exit 1 after the model loaded."""
    from speechstream.config import DecodingConfig
    from speechstream.errors import InputError
    from speechstream.session import StreamingSession

    class _WillNotStart(_FakeStream):
        closed = False

        def __enter__(self):
            raise _FakeSounddevice.PortAudioError("Error starting stream: Device unavailable [PaErrorCode -9985]")

        def close(self):
            self.closed = True

    sd, streams = _FakeSounddevice(total=3), []
    sd.InputStream = lambda **kwargs: streams.append(_WillNotStart(kwargs["callback"], 3, kwargs["blocksize"])) or \
        streams[-1]
    session = StreamingSession(tiny_model, DecodingConfig(chunk_ms=320, vad=False))
    with pytest.raises(InputError, match=r"input device 'fake' cannot record: .*Device unavailable"):
        live.record(session, {"index": 0, "name": "fake"}, None, lambda e: None, sd)
    assert streams[0].closed  # (the device is let go of)


def test_the_device_asked_for_is_the_one_recorded_when_two_share_a_name():
    """Two identical USB microphones on macOS are both "USB Audio Device" on Core Audio: ``--input-device 2`` (or the
    default, the second) must record device 2, which PortAudio's own answer names by its index, not the first device
    of that name and host API."""

    class TwinMics:
        class PortAudioError(Exception):
            pass

        DEVICES = [{"name": "USB Audio Device", "index": i, "hostapi": 0, "max_input_channels": 1,
                    "default_samplerate": 48000.0} for i in range(3)]
        DEVICES[0] = dict(DEVICES[0], name="Built-in Microphone")

        def query_devices(self, spec=None, kind=None):
            if spec is None and kind is None:
                return [dict(device) for device in self.DEVICES]
            return dict(self.DEVICES[2 if spec is None else spec])  # (the default input: the second twin)

    sd = TwinMics()
    assert [live.resolve_device(sd, spec)["index"] for spec in (1, 2, None, 0)] == [1, 2, 2, 0]


class _Terminal:
    """What a terminal of ``width`` columns shows of the text written to it (stdout and stderr both): text wraps at
    the last column (a wide character that would not fit in it is written on the next row), and the controls act on
    it as in xterm ("\\r", "\\n", ESC [ n A / C: up / right n, ESC [ K / J: erase from the cursor to the end of the
    row / screen)."""

    def __init__(self, width: int):
        self.width, self.rows, self.row, self.col = width, [[]], 0, 0

    def stream(self):
        terminal = self

        class Stream:
            def write(self, text):
                terminal.write(text)

            def flush(self):
                pass

            def isatty(self):
                return True

        return Stream()

    def down(self) -> None:
        self.row, self.col = self.row + 1, 0
        self.rows += [[] for _ in range(self.row + 1 - len(self.rows))]

    def write(self, text: str) -> None:
        import re

        for control, count, letter, char in re.findall(r"(\x1b\[(\d*)([A-Za-z]))|(.|\n)", text, re.DOTALL):
            at = min(self.col, self.width - 1)  # (past the last column, the cursor waits on it: a pending wrap)
            if control:
                if letter == "A":
                    self.row, self.col = max(0, self.row - int(count or 1)), at
                elif letter == "C":
                    self.col = min(self.width - 1, at + int(count or 1))
                elif letter in "JK":
                    del self.rows[self.row][at:]
                    if letter == "J":
                        del self.rows[self.row + 1 :]
                else:
                    raise AssertionError(f"a control the test does not know: {control!r}")
            elif char == "\r":
                self.col = 0
            elif char == "\n":
                self.down()
            else:  # (a wide character takes two cells; one that does not fit in the row's last cell goes on the next)
                wide = 2 if unicodedata.east_asian_width(char) in "WF" else 1
                if self.col + wide > self.width:
                    self.down()
                line = self.rows[self.row]
                line += [" "] * (self.col + wide - len(line))
                line[self.col : self.col + wide] = [char] + [""] * (wide - 1)
                self.col += wide

    @property
    def screen(self) -> list[str]:
        return ["".join(row).rstrip() for row in self.rows]


def test_the_uncommitted_tail_shown_on_a_terminal_leaves_the_committed_text_on_it():
    """On a terminal stdout and stderr share the screen: the tail (stderr) goes after the committed text (stdout),
    at most the rest of its row and the next, and is erased back to it. It was written from the start of the row
    with "\\r" and erased with the whole row, so each partial wiped the committed text of its row from the screen
    (the next final was written from the row's start), and the transcript showed in pieces."""
    from speechstream.session import Event

    terminal = _Terminal(width=20)
    printer = live.Printer(terminal.stream(), terminal.stream(), width=20)
    shown = []
    for kind, text in [("final", " Hello"), ("partial", " wor"), ("partial", " world"), ("final", " world."),
                       ("partial", " and a tail longer than the row"), ("final", " And a"), ("partial", " tail"),
                       ("final", " tail longer"), ("partial", " x"), ("end", "")]:
        printer(Event(kind, text, 0.0, 0.0))
        shown.append(terminal.screen)
    assert shown[2] == [" Hello world"] and shown[3] == [" Hello world."]
    assert shown[4] == [" Hello world. a tail", " longer than the row"]  # (the tail's end that fits)
    assert shown[5] == [" Hello world. And a"] and shown[6] == [" Hello world. And a", "tail"]
    assert shown[7] == [" Hello world. And a", "tail longer"] and shown[8] == [" Hello world. And a", "tail longer x"]
    assert shown[9] == [" Hello world. And a", "tail longer", ""]
    note = live.Printer(terminal.stream(), terminal.stream(), width=20)
    note(Event("final", " Text", 0.0, 0.0))
    note(Event("partial", " tail", 0.0, 0.0))
    note.note("warning: a gap")  # (a warning on a row of its own, the tail erased first)
    note(Event("final", " more", 0.0, 0.0))
    assert terminal.screen[-3:] == [" Text", "warning: a gap", " more"]
    # East Asian wide characters take two columns: the tail that fits, and where the text leaves the cursor
    assert live.fitting_tail("ab日本", 5) == "b日本" and live.fitting_tail("ab日本", 3) == "本"
    assert live.advance_column(17, "日本", 20) == 2 and live.advance_column(16, "日本", 20) == 20


def test_a_wide_tail_that_wraps_early_is_erased_whole():
    """A wide character does not fit in a row's last column: the terminal writes it on the next row, leaving that
    column empty, so a tail of wide characters can take more rows than its columns say. It was fitted and erased by
    its columns: "中中中中中" in 10 columns of a 5-column terminal took three rows, and its first stayed on the
    screen, over the committed text written after it."""
    from speechstream.session import Event

    terminal = _Terminal(width=5)
    printer = live.Printer(terminal.stream(), terminal.stream(), width=5)
    printer(Event("partial", "中中中中中", 0.0, 0.0))
    assert terminal.screen == ["中中", "中中"]  # (at most the row and the next: the end that fits there)
    printer(Event("final", "ab", 0.0, 0.0))
    printer(Event("partial", "中中中中", 0.0, 0.0))
    assert terminal.screen == ["ab中", "中中"]
    printer(Event("final", "c", 0.0, 0.0))
    assert terminal.screen == ["abc"]


def test_a_tail_holding_line_breaks_or_controls_is_shown_on_its_rows_and_erased_whole():
    """The tail is fitted and erased by its columns: a line break, tab or escape the model wrote in it moved the
    cursor in ways not counted, so erasing left its first row on the screen (or the escape acted on the terminal).
    Control characters are shown as spaces."""
    from speechstream.session import Event

    terminal = _Terminal(width=20)
    printer = live.Printer(terminal.stream(), terminal.stream(), width=20)
    printer(Event("final", "Hello", 0.0, 0.0))
    printer(Event("partial", " one\ntwo\tthree\x1b[2Jx", 0.0, 0.0))
    assert terminal.screen == ["Hello one two three", "[2Jx"]
    printer(Event("final", " one", 0.0, 0.0))
    assert terminal.screen == ["Hello one"]


def test_the_block_queued_as_the_stream_ends_is_read():
    """The main loop found the queue empty, and in the moment before it asked whether the stream was still active the
    callback queued its last block and ended the stream (``--seconds`` reached): that block (up to 100 ms of the
    recording's end) was left unread."""
    blocks: queue.Queue = queue.Queue()
    last = np.full((1600, 1), 16384, np.int16)

    def active() -> bool:  # (the callback runs between the loop's wait and this question)
        blocks.put((last, False, 0))
        return False

    read = list(live.queued_blocks(blocks, live.StopFlag(), active, [0]))
    assert [(block.size, lost) for block, lost in read] == [(1600, 0)] and blocks.empty()
