"""Read/write policies: objects that look at the stream and return what to do next.

The session calls ``decide`` in a loop. ``Read`` feeds the next source unit (a chunk
of speech) to the LLM, or waits for audio when none is ready; ``Write`` feeds the
pending target token (the one the LLM just predicted, or a substitute) and so emits
it; ``Stop`` ends the transcript.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_PERIOD = 12  # the repetition guard's longest block (tokens)


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
    tokens_since_read: int  # target tokens fed since the last read (the assistant header and markers included)
    eoc_id: int  # end-of-chunk token
    eos_id: int  # end-of-transcript token
    # the last text tokens fed in this segment (end-of-chunk tokens and the header left out; the policy's
    # ``recent_tokens`` of them), oldest first, pending excluded
    recent: tuple[int, ...] = ()
    # text tokens fed since the last read: the transcript's own, without the header, context or any marker
    text_since_read: int = 0


def repeats_at_end(tokens: tuple[int, ...], min_repeats: int, max_period: int = MAX_PERIOD) -> bool:
    """True when the sequence ends with some block of 1..max_period tokens repeated min_repeats times in a row."""
    for period in range(1, max_period + 1):
        span = period * min_repeats
        if len(tokens) < span:
            break
        tail = tokens[-span:]
        if all(tail[i] == tail[i % period] for i in range(span)):
            return True
    return False


class Policy:
    """Base class: decide the next action."""

    recent_tokens = 0  # text tokens the policy looks back on (``StreamView.recent``)

    def decide(self, view: StreamView) -> Action:
        raise NotImplementedError


class WaitK(Policy):
    """Wait-k over chunks: read k chunks, then write until the model asks for the next chunk.

    The model ends each chunk's words with the end-of-chunk token, so one read can be
    followed by zero, one or several words. ``max_tokens`` forces a read once that many text tokens
    (the header and end-of-chunk markers not counted) follow one read; ``max_tail_tokens`` stops writing
    once that many target tokens of any kind follow the last read (after the end of the audio).
    An end-of-transcript prediction before the audio has ended is taken as end of chunk.
    Every read made for the pending prediction (the model's end of chunk, an early end, the cap, the guard
    below; the last chunk's too) is followed by the end-of-chunk token in place of that prediction, which is
    then made again with the new chunk in view: text row r so sees k + (markers up to r) chunks, as the
    training mask says (``gpe.units_visible``).
    Repetition guard: when the pending token would make the text (end-of-chunk tokens left out)
    end in a block of up to 12 tokens repeated ``max_repeats`` times, the writer stops writing
    this chunk (reads on, or ends after the audio) instead of committing a hallucinated loop;
    0 disables it. The text so keeps ``max_repeats`` - 1 whole repeats of the block and all but the
    last token of another (the pending token is the first one that could tell the loop from speech).
    """

    def __init__(self, k: int, max_tokens: int = 24, max_tail_tokens: int = 200, max_repeats: int = 4):
        if k < 1:
            raise ValueError("wait-k needs k >= 1")
        if max_tokens < 1 or max_tail_tokens < 1:  # (0 would write no text between reads, or none after the last)
            raise ValueError(f"wait-k needs max_tokens >= 1 and max_tail_tokens >= 1, got {max_tokens} and "
                             f"{max_tail_tokens}")
        if max_repeats < 0 or max_repeats == 1:  # (every block of one token repeats once: 1 would stop all writing)
            raise ValueError(f"wait-k needs max_repeats 0 (off) or at least 2, got {max_repeats}")
        self.k = k
        self.max_tokens = max_tokens
        self.max_tail_tokens = max_tail_tokens
        self.max_repeats = max_repeats
        self.recent_tokens = MAX_PERIOD * max_repeats  # enough for the longest loop, however many chunk ends it spans

    def _looping(self, view: StreamView) -> bool:
        if not self.max_repeats or view.pending in (None, view.eoc_id, view.eos_id):
            return False
        text = tuple(token for token in view.recent if token != view.eoc_id)  # a loop may span chunk ends
        return repeats_at_end(text + (view.pending,), self.max_repeats)

    def decide(self, view: StreamView) -> Action:
        if view.units_read < self.k and not view.source_done:
            return Read()
        if view.pending is None:
            return Write()
        if view.reads_since_prediction:  # a chunk was read for the pending prediction: the marker in its place
            return Write(view.eoc_id)
        looping = self._looping(view)
        if view.source_done:
            if view.pending == view.eos_id or view.tokens_since_read >= self.max_tail_tokens or looping:
                return Stop()
            return Write()
        wants_chunk = (
            view.pending in (view.eoc_id, view.eos_id) or view.text_since_read >= self.max_tokens or looping
        )
        return Read() if wants_chunk else Write()


POLICIES = {"wait-k": WaitK}  # name -> class, for --policy (DecodingConfig.policy)
