"""Where each fed sample goes before the front end: encoded, or dropped as silence; and where segments start and end.

``Router.route(samples)`` returns front-end steps in order: ("audio", samples) to encode, ("skip", n) samples
dropped, ("start", sample) a segment's audio begins there, ("cut", None) the segment ends (a VAD ``Endpoint``).
Without VAD every sample is audio. With it (``speechstream.vad.Endpointer``), audio before a segment's speech is
confirmed waits here (at most the VAD's look-back, ``speech_pad_ms``, plus up to ``max_segment_s`` while speech heard
is not yet confirmed) and is dropped, except the ``speech_pad_ms`` before the speech. Positions are absolute samples
of the stream, lost audio (``lose``) included, so the steps do not depend on how the audio was sliced.
"""

from __future__ import annotations

import numpy as np

from speechstream.vad import Endpoint, Endpointer, SpeechStart

Step = tuple[str, object]


class Router:
    """The routing state of one stream."""

    def __init__(self, vad: Endpointer | None = None):
        self.vad = vad
        self.endpoints: list[Endpoint] = []  # segment ends found so far
        self.routed = 0  # samples routed so far (the waiting ones start here)
        self.open = vad is None  # a segment is open (with VAD: a speech start not yet cut)
        self._waiting = np.zeros(0, np.float32)  # with VAD, samples from ``routed`` on: not yet known to be speech

    @property
    def waiting(self) -> int:
        """Samples held back because it is not yet known whether they are speech (with VAD)."""
        return self._waiting.size

    def route(self, samples: np.ndarray) -> list[Step]:
        """The steps of a feed (1-D float32 samples)."""
        if self.vad is None:  # every sample is encoded (the session opens a segment where none is open)
            self.routed += samples.size
            return [("audio", samples)]
        found = self.vad.push(samples)  # windows are aligned to the stream start: slicing-invariant
        waiting = np.concatenate([self._waiting, samples]) if self._waiting.size else samples
        at = self.routed  # absolute sample of waiting[0]
        steps: list[Step] = []

        def take(until: int, kind: str) -> None:
            nonlocal waiting, at
            n = until - at
            if n > 0:
                steps.append((kind, waiting[:n]) if kind == "audio" else (kind, n))
                waiting, at = waiting[n:], until

        for item in found:
            if isinstance(item, SpeechStart):
                take(item.start, "skip")
                steps.append(("start", item.start))
                self.open = True
            else:
                take(item.cut, "audio")
                self.endpoints.append(item)
                steps.append(("cut", None))
                self.open = False
        if self.vad.speaking:
            take(at + waiting.size, "audio")
        else:
            take(self.vad.keep_from(), "skip")
        self._waiting = waiting.copy() if waiting.size else np.zeros(0, np.float32)
        self.routed = at
        return steps

    def onset(self) -> list[Step]:
        """Where the audio stops (its end, or a gap), with VAD: speech heard but not yet confirmed opens its segment
        (it would have been read had the audio gone on). Its steps; [] when there is none."""
        if self.vad is None or self.open or self.vad.pending_onset is None:
            return []
        start = self.vad.keep_from()
        steps = [("skip", start - self.routed), ("start", start), ("audio", self._waiting[start - self.routed :])]
        self.routed += self._waiting.size
        self.open = True
        self._waiting = np.zeros(0, np.float32)
        return steps

    def lose(self, samples: int) -> None:
        """``samples`` of the stream were lost after everything fed so far (call ``onset`` first): audio still
        waiting is dropped, no segment is open, and routing goes on after the gap."""
        self.routed += self._waiting.size + samples
        self._waiting = np.zeros(0, np.float32)
        self.open = False
        if self.vad is not None:
            self.vad.skip(samples)
