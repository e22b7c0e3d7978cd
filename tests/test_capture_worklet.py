"""The page's capture worklet (speechstream/web/capture-worklet.js), run in Node with a stand-in for the
AudioWorklet globals: any input rate becomes 16 kHz, the same however the browser slices its render quanta."""

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

WORKLET = Path(__file__).resolve().parent.parent / "speechstream" / "web" / "capture-worklet.js"
NODE = shutil.which("node")

HARNESS = """
const fs = require("fs");
const [rate, quantum, toneSeconds, silenceSeconds, amplitude] = process.argv.slice(2).map(Number);
let registered = null;
const sent = [];
global.sampleRate = rate;
global.AudioWorkletProcessor = class { constructor() { this.port = { postMessage: (m) => sent.push(m) }; } };
global.registerProcessor = (name, cls) => { registered = cls; };
eval(fs.readFileSync(process.argv[1], "utf8"));
const worklet = new registered();
const n = Math.round(rate * (toneSeconds + silenceSeconds));
const input = new Float32Array(n);
for (let i = 0; i < Math.round(rate * toneSeconds); i++) input[i] = amplitude * Math.sin(2 * Math.PI * 1000 * i / rate);
for (let i = 0; i < n; i += quantum) worklet.process([[input.subarray(i, Math.min(n, i + quantum))]]);
worklet.port.onmessage({ data: "flush" });
const out = [];
for (const m of sent) if (m instanceof ArrayBuffer) out.push(...new Int16Array(m));
console.log(JSON.stringify(out));
"""

pytestmark = pytest.mark.skipif(NODE is None, reason="node is not installed")


def capture(rate: int, quantum: int = 128, tone_s: float = 0.5, silence_s: float = 0.5, amplitude: float = 0.5):
    args = [str(rate), str(quantum), str(tone_s), str(silence_s), str(amplitude)]
    script = subprocess.run([NODE, "-e", HARNESS, str(WORKLET), *args],
                            capture_output=True, text=True, timeout=120, check=True)
    return np.array(json.loads(script.stdout), dtype=np.float64) / 32768


@pytest.mark.parametrize("rate", [8000, 11025, 16000, 22050, 44100, 48000, 96000])
def test_any_input_rate_becomes_16_khz(rate):
    out = capture(rate)
    assert abs(out.size - 16000) <= 320  # one second, up to the zero-padded last frame
    t = np.arange(8000) / 16000
    ideal = 0.5 * np.sin(2 * np.pi * 1000 * t)
    middle = slice(400, 7600)  # away from the tone's edges, where the low-pass rings
    assert np.max(np.abs(out[middle] - ideal[middle])) < 2e-3, rate
    assert np.max(np.abs(out[8400:16000])) < 2e-3  # the silence after the tone stays silent


def test_render_quanta_do_not_change_the_output():
    assert np.array_equal(capture(44100, 128), capture(44100, 97))
    assert np.array_equal(capture(8000, 128), capture(8000, 97))
    assert np.array_equal(capture(96000, 128), capture(96000, 97))


@pytest.mark.parametrize("rate", [16000, 48000])
def test_a_clipping_microphone_saturates_int16_without_wrapping(rate):
    out = capture(rate, amplitude=1.5) * 32768  # the int16 samples
    tone = out[400:7600]
    assert tone.max() == 32767 and tone.min() == -32768  # full scale both ways
    ideal = np.sin(2 * np.pi * 1000 * np.arange(400, 7600) / 16000)
    loud = np.abs(tone) > 16384
    assert np.all(np.sign(tone[loud]) == np.sign(ideal[loud]))  # no wrap-around to the other sign
