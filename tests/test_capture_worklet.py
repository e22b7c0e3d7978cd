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
const [rate, quantum, toneSeconds, silenceSeconds, amplitude, noise] = process.argv.slice(2, 8).map(Number);
const direct = process.argv[8] === "direct"; // the kernel evaluated per sample, as before its values were tabled
let registered = null;
const sent = [];
global.sampleRate = rate;
global.AudioWorkletProcessor = class { constructor() { this.port = { postMessage: (m) => sent.push(m) }; } };
global.registerProcessor = (name, cls) => { registered = cls; };
eval(fs.readFileSync(process.argv[1], "utf8"));
const worklet = new registered();
if (direct) worklet.phases = null;
const n = Math.round(rate * (toneSeconds + silenceSeconds));
const input = new Float32Array(n);
let seed = 1; // seeded white noise on the tone (Park-Miller)
for (let i = 0; i < Math.round(rate * toneSeconds); i++) {
  seed = (seed * 16807) % 2147483647;
  input[i] = amplitude * Math.sin(2 * Math.PI * 1000 * i / rate) + noise * (seed / 2147483647 - 0.5);
}
const sin = Math.sin;
let sines = 0; // Math.sin calls while the audio runs (after the worklet's constructor)
Math.sin = (x) => { sines++; return sin(x); };
for (let i = 0; i < n; i += quantum) worklet.process([[input.subarray(i, Math.min(n, i + quantum))]]);
worklet.port.onmessage({ data: "flush" });
const out = [];
for (const m of sent) if (m instanceof ArrayBuffer) out.push(...new Int16Array(m));
const phases = (worklet.phases || []).filter(Boolean).length; // the kernel's phases made (none: per sample)
console.log(JSON.stringify({ out, sines, phases, taps: 2 * worklet.half + 1 }));
"""

pytestmark = pytest.mark.skipif(NODE is None, reason="node is not installed")


def run_worklet(rate: int, quantum: int = 128, tone_s: float = 0.5, silence_s: float = 0.5, amplitude: float = 0.5,
                noise: float = 0.0, direct: bool = False) -> dict:
    """The worklet's int16 output (``out``), the ``Math.sin`` calls it made while the audio ran (``sines``), the
    phases of the kernel it tabled (``phases``) and the most taps a phase has (``taps``); ``direct``: with the kernel
    evaluated per sample instead of its table."""
    args = [str(rate), str(quantum), str(tone_s), str(silence_s), str(amplitude), str(noise)]
    args.append("direct" if direct else "table")
    script = subprocess.run([NODE, "-e", HARNESS, str(WORKLET), *args],
                            capture_output=True, text=True, timeout=120, check=True)
    return json.loads(script.stdout)


def capture(rate: int, quantum: int = 128, tone_s: float = 0.5, silence_s: float = 0.5, amplitude: float = 0.5):
    return np.array(run_worklet(rate, quantum, tone_s, silence_s, amplitude)["out"], dtype=np.float64) / 32768


@pytest.mark.parametrize("rate", [8000, 11025, 16000, 22050, 44100, 48000, 96000])
def test_any_input_rate_becomes_16_khz(rate):
    out = capture(rate)
    assert out.size == 16000  # one second: the last frame is shorter, not padded with zeros
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


@pytest.mark.parametrize("rate", [8000, 8001, 11025, 22050, 44100, 48000, 96000, 192000])
def test_the_precomputed_kernel_gives_the_per_sample_kernels_output_at_a_fraction_of_the_cost(rate):
    """The kernel took sin and cos per tap per output sample: 407 taps at 192 kHz, about a third of a core in Node.
    Its values are now computed once per phase of the output instants between input samples (one phase at 48 kHz,
    160 at 44.1 kHz, 16000 at 8001 Hz); the int16 output is the one the per-sample kernel gives (an output sample may
    differ by one step where the two round an output instant differently: 8001 Hz)."""
    tabled = run_worklet(rate, tone_s=0.7, silence_s=0.1, noise=0.6)
    direct = run_worklet(rate, tone_s=0.7, silence_s=0.1, noise=0.6, direct=True)
    out, reference = np.array(tabled["out"]), np.array(direct["out"])
    assert out.shape == reference.shape and out.size > 12000
    assert np.max(np.abs(out - reference)) <= 1 and np.count_nonzero(out != reference) <= 2
    assert tabled["sines"] <= tabled["phases"] * tabled["taps"] and direct["sines"] > 10 * out.size
    assert tabled["phases"] == min(16000 // np.gcd(rate, 16000), out.size)
