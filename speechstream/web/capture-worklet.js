// speechstream capture worklet: microphone samples at the AudioContext's rate -> 16 kHz mono int16 frames.
//
// Downsampling is band-limited: each output sample is the input convolved with a Hann-windowed sinc
// low-pass (cut-off just under 8 kHz) evaluated at the output instant, so any input rate works
// (48000, 44100, ... and below 16 kHz, where the same kernel interpolates). The output instants fall on at most
// OUT_RATE / gcd(rate, OUT_RATE) distinct phases between input samples (one at 48 or 192 kHz, 160 at 44.1 kHz): each
// phase's kernel values are computed once, when first needed, not per sample (sin and cos for each of the 407
// taps of each output sample at 192 kHz took 0.37 s of CPU per second of audio in Node, the table 0.05 s). Frames of
// FRAME_SAMPLES int16 samples go to the page through the port; the message "flush" sends what is left (the output
// samples up to the end of the input, as one shorter frame: no padding) followed by {type: "flushed"}.

const OUT_RATE = 16000;
const FRAME_SAMPLES = 320; // 20 ms
const ZERO_CROSSINGS = 16; // kernel half-width, in zero crossings of the sinc
const MAX_TABLE = 1 << 20; // kernel values computed ahead at most (8 MB); a rate that needs more evaluates the kernel
// per sample (sampleAt), as does a rate that is no integer

function gcd(a, b) {
  while (b) [a, b] = [b, a % b];
  return a;
}

class CaptureProcessor extends AudioWorkletProcessor {
  constructor() {
    super();
    this.step = sampleRate / OUT_RATE; // input samples per output sample
    this.cutoff = Math.min(1, OUT_RATE / sampleRate) * 0.95; // low-pass, as a fraction of the input rate
    // input samples each side; 0 only at 16 kHz in (each output sample is an input sample). Below 16 kHz the sinc
    // interpolates (a nearest-sample read there took one stale sample past the buffer per render quantum)
    this.half = this.step === 1 ? 0 : Math.ceil(ZERO_CROSSINGS / this.cutoff);
    this.phases = this.makePhases(); // null: the kernel is evaluated per sample (sampleAt)
    this.buffer = new Float32Array(16384);
    this.base = 0; // absolute input index of buffer[0]
    this.length = 0; // samples held in buffer
    this.next = 0; // output samples emitted
    this.frame = new Int16Array(FRAME_SAMPLES);
    this.fill = 0;
    this.samplesIn = 0;
    this.stopped = false;
    this.port.onmessage = (event) => {
      if (event.data === "flush") this.flush();
    };
  }

  kernel(d) {
    const x = this.cutoff * d;
    const sinc = x === 0 ? 1 : Math.sin(Math.PI * x) / (Math.PI * x);
    const window = 0.5 + 0.5 * Math.cos((Math.PI * d) / (this.half + 1));
    return this.cutoff * sinc * window;
  }

  makePhases() {
    // output sample n falls at input time n * rate / OUT_RATE = q + r / OUT_RATE (integers q, r): its taps depend on
    // r alone, a multiple of gcd(rate, OUT_RATE). One entry per r, made when an output sample first needs it (at an
    // odd rate such as 22051 Hz, 16000 of them: made all at once they held up the audio thread for most of a second)
    if (this.half === 0 || !Number.isInteger(sampleRate)) return null;
    this.phaseStep = gcd(sampleRate, OUT_RATE);
    const count = OUT_RATE / this.phaseStep;
    return count * (2 * this.half + 1) > MAX_TABLE ? null : new Array(count).fill(null);
  }

  makePhase(index) {
    // the taps of phase r = index * phaseStep, and the first one's input index relative to q
    const f = (index * this.phaseStep) / OUT_RATE; // in [0, 1)
    const lo = Math.ceil(f - this.half);
    const taps = new Float64Array(Math.floor(f + this.half) - lo + 1);
    for (let k = 0; k < taps.length; k++) taps[k] = this.kernel(f - (lo + k));
    return { lo, taps };
  }

  append(samples) {
    if (this.length + samples.length > this.buffer.length) {
      const grown = new Float32Array(Math.max(this.buffer.length * 2, this.length + samples.length));
      grown.set(this.buffer.subarray(0, this.length));
      this.buffer = grown;
    }
    this.buffer.set(samples, this.length);
    this.length += samples.length;
    this.samplesIn += samples.length;
  }

  sampleAt(t) {
    // one output sample at absolute input time t (the input is zero outside what was received)
    if (this.half === 0) return this.buffer[Math.round(t) - this.base] || 0;
    let sum = 0;
    const lo = Math.ceil(t - this.half);
    const hi = Math.floor(t + this.half);
    for (let i = lo; i <= hi; i++) {
      const j = i - this.base;
      if (j >= 0 && j < this.length) sum += this.buffer[j] * this.kernel(t - i);
    }
    return sum;
  }

  outputSample(n) {
    // output sample n from the precomputed taps of its phase (the same sum as sampleAt, in the same order)
    const at = n * sampleRate; // exact below 2^53: 8 days of audio at 768 kHz, 135 at 48 kHz
    const r = at % OUT_RATE;
    const index = r / this.phaseStep;
    const { lo, taps } = this.phases[index] || (this.phases[index] = this.makePhase(index));
    const first = (at - r) / OUT_RATE + lo - this.base; // buffer index of taps[0]
    const end = Math.min(taps.length, this.length - first);
    const buffer = this.buffer;
    let sum = 0;
    for (let k = Math.max(0, -first); k < end; k++) sum += buffer[first + k] * taps[k];
    return sum;
  }

  emit(final) {
    const end = this.base + this.length; // absolute index past the last input sample
    while (true) {
      const t = (this.next * sampleRate) / OUT_RATE; // exact where it is an integer, as the taps' positions are
      if (final ? t >= end : t + this.half >= end) break;
      const y = Math.max(-1, Math.min(1, this.phases ? this.outputSample(this.next) : this.sampleAt(t)));
      this.frame[this.fill++] = y < 0 ? Math.round(y * 32768) : Math.round(y * 32767);
      this.next++;
      if (this.fill === FRAME_SAMPLES) this.send(FRAME_SAMPLES);
    }
    // drop input no future output sample needs
    const keepFrom = Math.floor(this.next * this.step - this.half) - 1 - this.base;
    if (keepFrom > 4096) {
      this.buffer.copyWithin(0, keepFrom, this.length);
      this.length -= keepFrom;
      this.base += keepFrom;
    }
  }

  send(n) {
    const out = this.frame.slice(0, n);
    this.port.postMessage(out.buffer, [out.buffer]);
    this.fill = 0;
  }

  flush() {
    if (this.stopped) return;
    this.stopped = true; // nothing more is captured after the flush
    this.emit(true);
    if (this.fill > 0) this.send(this.fill);
    this.port.postMessage({ type: "flushed", samplesIn: this.samplesIn, samplesOut: this.next });
  }

  process(inputs) {
    const input = inputs[0];
    if (!this.stopped && input && input.length > 0 && input[0].length > 0) {
      let mono = input[0];
      if (input.length > 1) {
        mono = new Float32Array(input[0].length);
        for (const channel of input) for (let i = 0; i < mono.length; i++) mono[i] += channel[i] / input.length;
      }
      this.append(mono);
      this.emit(false);
    }
    return true;
  }
}

registerProcessor("speechstream-capture", CaptureProcessor);
