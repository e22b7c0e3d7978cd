"""Joint CTC beam search over one chunk's writing.

Greedy joint decoding (``ctc.fuse``) picks each next token alone. With ``--beam N`` (N > 1) the session instead
plans the text it writes after each read: ``plan`` keeps the N best hypotheses by their summed fused scores

    sum over their tokens of (1 - w) * log p_LLM(c | ...) + w * (log psi(g + c) - log psi(g))

and extends them together (one LLM step that feeds a token of each, as branches of the stream's own cache,
``decoder.Branches``: no copy of it) until the best of them has ended its chunk: with end-of-chunk (or an
end-of-text, which the policy takes as one) while audio is still coming, with end-of-text once all of it is read,
or on reaching the policy's cap of tokens. The session then writes the winner's tokens one at a time, so its events,
word times and statistics are those of any other write; as the search already scored each of them, they go into the
stream's cache with its next LLM step, not a step each. The plan is dropped at the next read, and at any token the
policy writes other than the planned one (its caps and repetition guard still rule).

Each hypothesis follows the rules greedy joint decoding follows (``ctc.joint_steps``, which ``ctc.fuse`` takes the best
of): end-of-chunk is taken when the LLM ranks it first (and only then), end-of-text competes by its own fused score once
the audio is read, and the text ends when it runs ``TAIL_MARGIN`` labels past the CTC head's best path. A beam of one
follows the greedy choices, but every hypothesis that ends counts, kept in the beam or not: where the greedy text passes
over an end-of-text that scores better than all that follows, a beam of one ends there (so its score is never below the
greedy text's, and its text not always that text); a session with ``beam == 1`` does not plan at all. Every extension
adds a score of at most zero (a prefix probability only falls as the prefix grows, a log-probability is at most zero),
so the search stops as soon as no live hypothesis can still beat the best ended one.

There is no length normalisation: an ended hypothesis needs the CTC head's consent (the ``SHORT_MARGIN`` rule and
the end-of-text's CTC term), which keeps the search from preferring short texts.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from speechstream.ctc import NEG, CTCPrefixScorer, joint_steps, masked_log_probs, overran
from speechstream.decoder import Branches, DecoderState


@dataclasses.dataclass
class Hypothesis:
    score: float  # summed fused scores of its tokens
    tokens: list[int]  # the planned tokens so far (end-of-chunk markers included)
    scorer: CTCPrefixScorer  # the CTC prefix state of the segment's text and these tokens
    eoc_run: int  # end-of-chunk tokens at the end of its text
    text: int  # text tokens among ``tokens`` (no markers)
    rows: list[torch.Tensor] = dataclasses.field(default_factory=list)  # (V,) LLM scores after each fed token
    slot: int = -1  # the branch slot of its last fed token (``decoder.Branches``; -1: none fed, the stream's own)


@dataclasses.dataclass(frozen=True)
class Limits:
    """Where the session's policy would stop a plan: ``source_done`` (all of the segment's audio read), ``room``
    tokens left before its cap forces a read or ends the text (text tokens before a read; any tokens after the end
    of the audio)."""

    source_done: bool
    room: int


def extensions(joint, hyp: Hypothesis, logits: torch.Tensor, source_done: bool):
    """The ways ``hyp`` may go on after ``logits`` (its next token's LLM scores), by greedy joint decoding's rules
    (``ctc.joint_steps``): (token, score added, ends) for each finite score, ``ends``: the token ends the planned
    writing. Empty when the hypothesis has ended (the head cannot emit its text, or all audio is read and the text
    overran the head's best path) or no candidate is a CTC class: the caller then treats it as ended as it is (a plan
    of nothing leaves the choice to ``ctc.fuse``)."""
    scorer, eoc, eos = hyp.scorer, joint.model.eoc_id, joint.model.eos_id
    if not math.isfinite(scorer.psi) or (source_done and overran(scorer)):
        return []
    logp = masked_log_probs(logits, joint.allowed)
    steps = joint_steps(logp, scorer, joint.class_of, joint.weight, joint.candidates, eoc, eos, source_done,
                        hyp.eoc_run)
    return [(token, score, token == eos or (token == eoc and not source_done))
            for token, score in steps if math.isfinite(score)]


def grown(joint, hyp: Hypothesis, token: int, added: float) -> Hypothesis:
    """``hyp`` with ``token`` appended (its own copy of the prefix scorer where the token is a CTC label)."""
    scorer, text = hyp.scorer, hyp.text
    if token not in joint.model.special_ids:
        text += 1
        label = int(joint.class_of[token])
        if label >= 0:
            scorer = scorer.copy()
            scorer.append(label)
    run = hyp.eoc_run + 1 if token == joint.model.eoc_id else 0
    return Hypothesis(hyp.score + added, hyp.tokens + [token], scorer, run, text, hyp.rows, hyp.slot)


def plan(joint, state: DecoderState, logits: torch.Tensor, limits: Limits, width: int) -> Hypothesis | None:
    """What to write next: the best of a beam of ``width`` hypotheses grown from the stream's LLM ``state`` (left
    as it was), whose next token's scores are ``logits`` (V,), until no live hypothesis can beat the best ended one
    (module docstring): its ``tokens``, and in ``rows`` the LLM's scores after each of them but the last. None when
    the text has already ended (the caller's greedy rules then say so)."""
    branches = Branches(joint.model.decoder, state)
    try:
        ended = _search(joint, branches, logits, limits, width)
    finally:
        branches.close()
    best = max(ended, key=lambda h: h.score, default=None)
    return best if best is not None and best.tokens else None


def _search(joint, branches: Branches, logits: torch.Tensor, limits: Limits, width: int) -> list[Hypothesis]:
    """``plan``'s search, its hypotheses fed as ``branches`` of the stream: the hypotheses it ended."""
    model = joint.model
    live = [Hypothesis(0.0, [], joint.scorer, joint.eoc_run, 0)]
    rows = logits[None]
    ended: list[Hypothesis] = []
    while live:
        grown_live, parents = [], []
        candidates = []
        for i, hyp in enumerate(live):
            steps = extensions(joint, hyp, rows[i], limits.source_done)
            if not steps:
                ended.append(hyp)
            candidates += [(hyp.score + added, i, token, added, ends) for token, added, ends in steps]
        candidates.sort(key=lambda c: -c[0])
        for _, i, token, added, ends in candidates:  # ended ones all count; the beam keeps ``width`` going on
            if not ends and len(grown_live) == width:
                continue
            hyp = grown(joint, live[i], token, added)
            used = len(hyp.tokens) if limits.source_done else hyp.text
            if ends or used >= limits.room:
                ended.append(hyp)
            else:
                grown_live.append(hyp)
                parents.append(live[i].slot)
        best_ended = max((h.score for h in ended), default=NEG)
        keep = [j for j, hyp in enumerate(grown_live) if hyp.score > best_ended]  # scores only fall
        if not keep:
            break
        live = [grown_live[j] for j in keep]
        rows, slots = branches.step(model.embed_ids([hyp.tokens[-1] for hyp in live]), [parents[j] for j in keep])
        for hyp, row, slot in zip(live, rows, slots):
            hyp.rows, hyp.slot = hyp.rows + [row], slot
    return ended
