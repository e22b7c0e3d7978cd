"""Read/write policies: objects that look at the stream and return what to do next.

The session calls ``decide`` in a loop. ``Read`` feeds the next source unit (a chunk
of speech) to the LLM, or waits for audio when none is ready; ``Write`` feeds the
pending target token (the one the LLM just predicted, or a substitute) and so emits
it; ``Stop`` ends the transcript.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Read:
    """Read the next source unit."""


@dataclass(frozen=True)
class Write:
    """Feed a target token: the pending prediction, or ``token`` in its place."""

    token: int | None = None  # None: the pending token (or the assistant header before the first write)


@dataclass(frozen=True)
class Stop:
    """The transcript is complete."""


Action = Read | Write | Stop


@dataclass(frozen=True)
class StreamView:
    """What a policy may look at."""

    units_read: int  # source units fed to the LLM
    source_done: bool  # every unit of the stream has been read (audio finished and all fed)
    pending: int | None  # predicted next target token, not yet fed; None before the header
    reads_since_prediction: int  # units read since ``pending`` was predicted
    tokens_since_read: int  # target tokens fed since the last read
    eoc_id: int  # end-of-chunk token
    eos_id: int  # end-of-transcript token


class Policy:
    """Base class: decide the next action."""

    def decide(self, view: StreamView) -> Action:
        raise NotImplementedError


class WaitK(Policy):
    """Wait-k over chunks: read k chunks, then write until the model asks for the next chunk.

    The model ends each chunk's words with the end-of-chunk token, so one read can be
    followed by zero, one or several words. ``max_tokens`` forces a read when a chunk's
    writing runs long; ``max_tail_tokens`` stops writing after the end of the audio.
    An end-of-transcript prediction before the audio has ended is taken as end of chunk.
    """

    def __init__(self, k: int, max_tokens: int = 24, max_tail_tokens: int = 200):
        if k < 1:
            raise ValueError("wait-k needs k >= 1")
        self.k = k
        self.max_tokens = max_tokens
        self.max_tail_tokens = max_tail_tokens

    def decide(self, view: StreamView) -> Action:
        if view.units_read < self.k and not view.source_done:
            return Read()
        if view.pending is None:
            return Write()
        if view.source_done:
            if view.pending == view.eos_id or view.tokens_since_read >= self.max_tail_tokens:
                return Stop()
            return Write()
        wants_chunk = view.pending in (view.eoc_id, view.eos_id) or view.tokens_since_read >= self.max_tokens
        if not wants_chunk:
            return Write()
        if view.reads_since_prediction == 0:
            return Read()
        return Write(view.eoc_id)


POLICIES = {"wait-k": WaitK}  # name -> class, for --policy


def make_policy(name: str, k: int, max_tokens: int, max_tail_tokens: int) -> Policy:
    from speechstream.errors import InputError

    if name not in POLICIES:
        raise InputError(f"unknown policy {name!r} (known: {', '.join(POLICIES)})")
    if k < 1:
        raise InputError("k must be at least 1")
    return POLICIES[name](k, max_tokens, max_tail_tokens)
