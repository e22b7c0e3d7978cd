"""A seeded random campaign: each stream decoded in a batch gives exactly what it gives decoded alone.

    HF_HUB_OFFLINE=1 python -m tests.fuzz_batch FIRST_SEED COUNT

Each case (one seed) draws 1-8 streams of the tiny seeded model (sometimes with a fine CTC head, sometimes with few
LLM positions so that segments are cut at them) and a driver: ``DynamicBatch`` stepped once per pass as the server's
``DecodeWorker`` steps it (frames held back while 4 chunks wait), ``DynamicBatch.run`` after each pass, or a fixed
``BatchDecoder`` under any ablation. Per stream: its own chunk size, k, caps, repetition guard, chooser (text, the
model's greedy, one that writes at every step, joint CTC), VAD (dynamic drivers) and context tokens; audio of noise,
speech clips and silence (with VAD at times a word cut short by the end), fed in pieces of 0, 1 or any number of
samples, with gaps, joining late (sometimes fed before it joins), ended or closed mid-stream. Every stream's target
ids, final and end events (kind, text, source time), segment starts and words must equal those of the same stream fed
the same pieces alone; its partial texts must be ones it has alone; the batch's cache must hold no more than twice the
fullest row's slots and nothing once every stream has left. Not collected by pytest (a campaign takes minutes); its
failures become regression tests.
"""

from __future__ import annotations

import dataclasses
import sys
import time
import traceback
from pathlib import Path

import numpy as np
import torch

from speechstream import gpe
from speechstream.audio import load_audio
from speechstream.batch import BatchDecoder, DynamicBatch
from speechstream.config import DecodingConfig
from speechstream.model import load_model
from speechstream.session import StreamingSession
from tests.conftest import text_favouring_chooser
from tests.helpers import fine_head_model

SAMPLES = Path(__file__).resolve().parent.parent / "samples"
CLIPS = ("jfk.wav", "austen-0880.wav", "austen-0870.wav")
AHEAD = 4  # the server's MAX_UNITS_AHEAD


def chatty(_model):
    """Writes a letter at every step: each chunk's writing meets its cap (``max_tokens_per_chunk``)."""
    written = []

    def choose(_logits) -> int:
        written.append(ord("a") + len(written) % 26)
        return written[-1]

    return choose


CHOOSERS = {"text": text_favouring_chooser, "greedy": lambda model: None, "chatty": chatty,
            "ctc": lambda model: None}


@dataclasses.dataclass(frozen=True)
class StreamSpec:
    decoding: DecodingConfig
    chooser: str
    items: tuple  # ("feed", samples) / ("gap", n)
    ends: bool  # end_audio (else closed mid-stream, once the batch has caught up)
    start: int  # the pass at which it joins
    early: int  # items fed before it joins


@dataclasses.dataclass(frozen=True)
class Case:
    driver: str  # "server", "dynamic" or "fixed"
    ablation: str
    fine: bool  # the tiny model with a fine CTC head
    limit: int | None  # the LLM's positions (None: its own)
    compact_below: float
    streams: tuple[StreamSpec, ...]


def draw_audio(rng, clips, vad: bool) -> np.ndarray:
    parts = []
    for _ in range(int(rng.integers(1, 4))):
        kind = rng.choice(["noise", "speech", "silence"], p=[0.45, 0.35, 0.2] if vad else [0.6, 0.3, 0.1])
        n = int(rng.integers(1, 3 * 16000))
        if kind == "noise":
            parts.append((0.1 * rng.standard_normal(n)).astype(np.float32))
        elif kind == "speech":
            clip = clips[int(rng.integers(len(clips)))]
            start = int(rng.integers(0, max(1, clip.size - n)))
            parts.append(clip[start : start + n])
        else:
            parts.append(np.zeros(int(rng.integers(8000, 24000)) if vad else n, np.float32))
    if vad and rng.random() < 0.3:  # a pause, then a word cut short by the end: read at ``end_audio``
        clip = clips[int(rng.integers(len(clips)))]
        start = int(rng.integers(0, clip.size - 6000))
        word = clip[start : start + int(rng.integers(800, 6000))]
        parts += [np.zeros(int(rng.integers(8000, 20000)), np.float32), word]
    audio = np.concatenate(parts)
    return audio[: int(rng.integers(0, 400))] if rng.random() < 0.1 else audio  # very short, even empty


def draw_items(rng, audio: np.ndarray, chunk: int) -> list:
    items, at, gaps = [], 0, rng.random() < 0.25
    while at < audio.size:
        sizes = [0, 1, int(rng.integers(1, chunk)), int(rng.integers(1, 3 * chunk))]
        n = int(rng.choice(sizes, p=[0.1, 0.1, 0.3, 0.5]))
        items.append(("feed", audio[at : at + n]))
        at += n
        if gaps and rng.random() < 0.08:
            items.append(("gap", int(rng.integers(0, 6000))))
    return items


def draw_stream(rng, clips, driver: str, ablation: str, limit: int | None) -> StreamSpec:
    chooser = str(rng.choice(["text", "greedy", "chatty", "ctc"], p=[0.4, 0.15, 0.2, 0.25]))
    if limit and chooser == "text":
        chooser = "chatty"  # (text that fills the target positions)
    vad = driver != "fixed" and rng.random() < 0.3
    decoding = DecodingConfig(
        chunk_ms=int(rng.choice([40, 80, 160, 320, 480, 640])), k=int(rng.integers(1, 4)),
        max_tokens_per_chunk=int(rng.integers(1, 9)), max_tail_tokens=int(rng.integers(1, 20)),
        max_repeats=int(rng.choice([0, 2, 3, 4])), ablation=ablation, vad=vad,
        vad_min_silence_ms=int(rng.choice([100, 300, 600])) if vad else DecodingConfig.vad_min_silence_ms,
        context_tokens=int(rng.choice([0, 0, 2])),
        ctc_weight=float(rng.choice([0.3, 0.6])) if chooser == "ctc" else 0.0)
    items = draw_items(rng, draw_audio(rng, clips, vad), decoding.chunk_ms * 16)
    ends = rng.random() >= 0.2
    if not ends:
        items = items[: int(rng.integers(0, len(items) + 1))]
    early = int(rng.integers(0, 4)) if driver != "fixed" and rng.random() < 0.3 else 0
    return StreamSpec(decoding, chooser, tuple(items), ends, int(rng.integers(0, 6)), early)


def draw_case(seed: int, clips) -> Case:
    rng = np.random.default_rng(seed)
    driver = str(rng.choice(["server", "dynamic", "fixed"], p=[0.45, 0.25, 0.3]))
    ablation = str(rng.choice(gpe.ABLATIONS)) if driver == "fixed" else "none"
    fine = bool(rng.random() < 0.25)
    limit = int(rng.choice([96, 128, 192])) if rng.random() < 0.25 else None
    streams = tuple(draw_stream(rng, clips, driver, ablation, limit) for _ in range(int(rng.integers(1, 9))))
    return Case(driver, ablation, fine, limit, float(rng.choice([0.5, 1.01])), streams)


def alone(model, spec: StreamSpec):
    session = StreamingSession(model, spec.decoding, choose=CHOOSERS[spec.chooser](model))
    events = []
    for what, value in spec.items:
        events += session.feed(value) if what == "feed" else session.gap(value)
    return session, events + (session.finish() if spec.ends else session.close())


class Batched:
    """The case's streams in one batch, fed and stepped pass by pass (``rng``: how many items a stream gets)."""

    def __init__(self, model, case: Case, rng):
        self.case, self.rng = case, rng
        self.sessions = [StreamingSession(model, s.decoding, choose=CHOOSERS[s.chooser](model), own_llm=False)
                         for s in case.streams]
        self.events = [[] for _ in case.streams]
        self.at = [0] * len(case.streams)  # next item per stream
        self.ending = [False] * len(case.streams)
        self.widths = []  # (columns, the fullest row's slots) after each pass
        if case.driver == "fixed":
            self.batch = BatchDecoder(model, self.sessions)
        else:
            self.batch = DynamicBatch(model, compact_below=case.compact_below)

    def feed(self, i: int) -> None:
        """Stream i's next item; at its end, end_audio (or nothing: it is closed once the batch has caught up)."""
        spec, session = self.case.streams[i], self.sessions[i]
        if self.at[i] < len(spec.items):
            what, value = spec.items[self.at[i]]
            self.at[i] += 1
            self.events[i] += session.feed(value) if what == "feed" else session.gap(value)
            return
        if spec.ends:
            session.end_audio()
        self.ending[i] = True

    def feed_round(self, i: int) -> None:
        for _ in range(int(self.rng.integers(0, 4))):
            if self.ending[i] or self.case.driver == "server" and self.sessions[i].chunks_waiting >= AHEAD:
                return
            self.feed(i)

    def note_width(self) -> None:
        kinds = self.batch.state.kinds
        if kinds.numel():
            self.widths.append((kinds.shape[1], int((kinds != gpe.PAD).sum(dim=1).max())))

    def run_fixed(self) -> None:
        while not all(self.ending):
            for i in range(len(self.sessions)):
                if not self.ending[i]:
                    self.feed_round(i)
            for i, new in enumerate(self.batch.run()):
                self.events[i] += new + ([] if self.ending[i] else self.sessions[i].pending_events())
            self.note_width()
        for i, session in enumerate(self.sessions):
            self.events[i] += session.close()

    def run_dynamic(self) -> None:
        joined, closed = [False] * len(self.sessions), [False] * len(self.sessions)
        for t in range(10**6):
            for i, spec in enumerate(self.case.streams):
                if not joined[i] and t >= spec.start:
                    for _ in range(spec.early):
                        if not self.ending[i]:
                            self.feed(i)
                    self.batch.join(self.sessions[i])
                    joined[i] = True
            for i in range(len(self.sessions)):
                if joined[i] and not self.ending[i]:
                    self.feed_round(i)
            order = list(self.batch.sessions)
            if self.case.driver == "server":  # one step per pass; a stream not served waits or is done
                served = self.batch.step() or {}
            else:
                served = dict(enumerate(self.batch.run()))
            for b, session in enumerate(order):
                i = next(j for j, s in enumerate(self.sessions) if s is session)
                self.events[i] += served.get(b, [])
                if self.case.driver == "server" and b in served:
                    continue
                if self.ending[i]:
                    self.events[i] += session.close()
                    closed[i] = True
                    self.batch.leave(session)
                else:
                    self.events[i] += session.pending_events()
            self.note_width()
            if all(closed):
                break
        assert len(self.batch) == 0 and self.batch.width == 0, "the batch kept columns after every stream left"


def finals(events) -> list:
    return [(e.type, e.text, e.source_s) + ((e.audio_s,) if e.type == "end" else ()) for e in events
            if e.type != "partial"]


def compare(i: int, single, single_events, batched, batched_events) -> list[str]:
    problems = []
    if single.target_ids != batched.target_ids:
        problems.append(f"stream {i}: target ids differ")
    if finals(single_events) != finals(batched_events):
        problems.append(f"stream {i}: events differ:\n  alone {finals(single_events)}\n"
                        f"  batch {finals(batched_events)}")
    if (single.segment, single.segment_starts) != (batched.segment, batched.segment_starts):
        problems.append(f"stream {i}: segment starts differ: {single.segment_starts} vs {batched.segment_starts}")
    if single.words != batched.words:
        problems.append(f"stream {i}: words differ")
    seen = {e.text for e in single_events if e.type == "partial"} | {""}
    if any(e.type == "partial" and e.text not in seen for e in batched_events):
        problems.append(f"stream {i}: a partial text it never has alone")
    return problems


def run_case(case: Case, model, seed: int) -> list[str]:
    """The case's problems ([]: every stream equals its solo run)."""
    config = model.decoder.llm.config
    own = config.max_position_embeddings
    config.max_position_embeddings = case.limit or own
    try:
        solos = [alone(model, spec) for spec in case.streams]
        batched = Batched(model, case, np.random.default_rng(seed + 10**6))
        with torch.no_grad():
            batched.run_fixed() if case.driver == "fixed" else batched.run_dynamic()
    except Exception:  # noqa: BLE001 - a case that fails is reported, the campaign goes on
        return [traceback.format_exc()]
    finally:
        config.max_position_embeddings = own
    problems = []
    for i, (solo, session, events) in enumerate(zip(solos, batched.sessions, batched.events)):
        problems += compare(i, *solo, session, events)
    if case.driver != "fixed" and any(width > max(2 * fullest, fullest + 1) for width, fullest in batched.widths):
        problems.append("the cache held more than twice the fullest row's slots")
    return problems


def describe(case: Case) -> str:
    streams = [f"{s.decoding.chunk_ms}ms k{s.decoding.k} cap{s.decoding.max_tokens_per_chunk} "
               f"tail{s.decoding.max_tail_tokens} rep{s.decoding.max_repeats}{' vad' if s.decoding.vad else ''} "
               f"{s.chooser} {'end' if s.ends else 'close'} start{s.start}" for s in case.streams]
    return f"{case.driver} ablation={case.ablation} fine={case.fine} limit={case.limit}: " + "; ".join(streams)


def main(first: int, count: int) -> int:
    torch.set_num_threads(1)
    plain = load_model("tiny-random")
    models = {False: plain, True: fine_head_model(plain)}
    clips = [load_audio(SAMPLES / name) for name in CLIPS]
    failed = 0
    for seed in range(first, first + count):
        case, start = draw_case(seed, clips), time.perf_counter()
        problems = run_case(case, models[case.fine], seed)
        failed += bool(problems)
        print(f"seed {seed}: {'FAIL' if problems else 'ok'} ({time.perf_counter() - start:.1f} s) {describe(case)}",
              flush=True)
        for problem in problems:
            print("   ", problem[-3000:], flush=True)
    print(f"{count} cases, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]), int(sys.argv[2])))
