"""Joint CTC decoding: the auxiliary CTC head's prefix scores fused with the LLM's next-token scores.

The models carry a CTC head over the projector's output (``SpeechLLM.ctc_logits``), trained beside the LM
loss. While the session writes, ``CTCPrefixScorer`` keeps the CTC forward variables of the text
written so far over the speech tokens read so far (both only grow, so every update is incremental), and
``fuse`` (greedy joint decoding; ``joint_steps`` gives the beam search of ``speechstream.beam`` the same scores
for several tokens) re-ranks the LLM's best few next tokens by

    (1 - w) * log p_LLM(c | ...) + w * (log psi(g + c) - log psi(g))

where ``g`` is the text so far and ``psi(h)`` is the CTC probability that the speech read so far begins
with ``h`` (the prefix score of joint CTC/attention decoding, Watanabe et al. 2017). The end-of-chunk token
stays the LLM's decision while audio is still coming (it encodes the wait-k lag, which CTC knows nothing of;
after the end of the audio the rules of ``joint_steps`` may override it); the end of the text, once all audio is read,
compares ``log p_CTC(g complete)`` the same way. The recursions run in float64 log space (the head's class
log-probabilities are computed in float32 and converted).

Conventions: ``lp`` rows are per-frame log-probabilities over the CTC classes with the blank last; arrays
over time have a leading virtual frame 0 (before any speech), so ``r[t]`` covers the first ``t`` frames.
"""

from __future__ import annotations

import copy
import math
from collections import deque
from typing import Callable

import numpy as np
import torch

NEG = -math.inf
FLOOR = -1e4  # log-probabilities below this are clipped (exp(-1e4) is zero in float64 anyway)
# Once all the audio is read, a text with this many labels more than the CTC head's own best path ends (without the
# rule a joint text can loop on after the speech; see MODEL_CARD.md of the English model for the choice).
TAIL_MARGIN = 6
# ... and a text this many labels or more short of that best path does not end yet: where the LLM would stop
# (or write only end-of-chunk tokens) with words the head still hears unwritten, the best fused text token is
# written instead (a lost tail otherwise; the LLM can fall silent mid-stream and never catch up).
SHORT_MARGIN = 2
# ... counting only an end-of-chunk that would be the EOC_RUN-th in a row (1: every one; 2: a lone end-of-chunk
# stands, as a line break between words, and only a second in a row, where the LLM has stopped writing, is replaced;
# chosen on held-out synthetic speech: dev WER 60.0 % with 1, 59.3 % with 2, stage-1d English weights, CTC weight 0.4)
EOC_RUN = 2


def _log_recursion(feed: np.ndarray, emit: np.ndarray) -> np.ndarray:
    """x[0] = -inf, x[t] = logaddexp(x[t-1], feed[t-1]) + emit[t-1] for t = 1..T (T = len(emit)).

    Closed form, without a Python loop: x[t] = C[t] + logsumexp_{s<t}(feed[s] - C[s]), C the cumulative sum of
    ``emit`` (C[0] = 0), through torch's stable cumulative log-sum-exp.
    """
    count = len(emit)
    out = np.full(count + 1, NEG)
    if count == 0:
        return out
    cum = np.concatenate([[0.0], np.cumsum(emit)])
    acc = torch.logcumsumexp(torch.from_numpy(feed[:count] - cum[:count]), dim=0).numpy()
    out[1:] = np.where(np.isfinite(acc), acc + cum[1:], NEG)
    return out


def log_normalisers(logits: np.ndarray) -> np.ndarray:
    """(m, C) float64 logits -> (m, 1) their log-sum-exp per row, through torch's vectorised logsumexp: numpy's
    ``logaddexp.reduce`` over the ~20,000 classes of a row is a sequential scalar loop, eight times slower (about 7
    against 0.9 ms for one 640 ms chunk's 16 frames, a tenth of the chunk's CTC work); both agree to ~1e-12."""
    return torch.logsumexp(torch.from_numpy(logits), dim=1, keepdim=True).numpy()


def extend_prefix(r_n: np.ndarray, r_b: np.ndarray, last: int | None, label: int, emit: np.ndarray,
                  blank: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Forward variables of prefix ``g + label`` from those of ``g`` (``last``: g's last label, None if empty),
    over T frames whose log-probabilities of ``label`` and of the blank are ``emit`` and ``blank`` (T,). Returns
    (r_n, r_b) of length T + 1: the probability that the first t frames emit exactly the new prefix, ending in
    its last label (n) or in a blank (b)."""
    phi = r_b if label == last else np.logaddexp(r_b, r_n)  # paths that may emit ``label`` next
    n = _log_recursion(phi, emit)
    b = _log_recursion(n, blank)
    return n, b


def prefix_scores(r_n: np.ndarray, r_b: np.ndarray, last: int | None, labels: np.ndarray, columns: np.ndarray
                  ) -> np.ndarray:
    """log psi(g + c) for each class in ``labels``: the probability that the T frames begin with the prefix g + c
    (c's first frame somewhere in them, anything after); ``columns`` (T, len(labels)): the frames'
    log-probabilities of those classes."""
    if columns.shape[0] == 0:
        return np.full(len(labels), NEG)
    both = np.logaddexp(r_b, r_n)[:-1, None]  # phi at frames t - 1 = 0..T-1
    phi = np.where(labels[None, :] == last, r_b[:-1, None], both)
    terms = phi + columns
    return np.logaddexp.reduce(terms, axis=0)


class CTCPrefixScorer:
    """CTC prefix scores of one growing hypothesis over a growing sequence of frames.

    ``add_frames`` appends frames (log-probs), ``append`` adds a label to the hypothesis, ``scores`` gives
    log psi(g + c) - log psi(g) for candidate labels, ``end_score`` log p(g complete) - log psi(g).

    With ``table`` ((C + 1, H) class vectors, the blank last), frames come as the head's (m, H) vectors instead
    (``add_vectors``): a frame's log-probabilities are its vector's products with the table, normalised, and only
    the vector and the normaliser are kept, H + 1 numbers a frame instead of C + 1 (for the English model 577
    against 20,053: a long stream without VAD pauses keeps 115 KB a second of audio instead of 4 MB); the
    classes a step asks for are computed from them.
    """

    def __init__(self, num_classes: int, table: np.ndarray | None = None):
        self.blank = num_classes  # column of the blank (classes 0..num_classes-1 come first)
        self._table = table  # (float32, shared by the streams of a model: never copied here)
        width = num_classes + 1 if table is None else self._table.shape[1] + 1
        # per frame: its log-probabilities, or (with a table) its vector and log-normaliser; rows past ``frames``
        # are spare room
        self._lp = np.zeros((16, width))
        self._frames = 0
        self._owns_buffer = True  # False: ``_lp`` is shared with the scorer this one was copied from (``copy``)
        self._best_labels = 0  # labels on the head's own best path (frame argmax, repeats merged, no blanks)
        self._best_last = -1  # the argmax class of the last frame (-1: none yet)
        self.labels: list[int] = []
        self.r_n = np.array([NEG])  # the current prefix, over 0..T frames
        self.r_b = np.array([0.0])  # the empty prefix is complete before any frame
        self.col_n = np.array([NEG])  # every prefix length l = 0..L at the last frame
        self.col_b = np.array([0.0])
        self.psi = 0.0  # log psi of the current prefix (0: the empty prefix)

    @property
    def frames(self) -> int:
        return self._frames

    @property
    def lp(self) -> np.ndarray:
        """(frames, C + 1) log-probabilities of the frames so far."""
        return self._columns(np.arange(self.blank + 1))

    def columns(self, classes: np.ndarray) -> np.ndarray:
        """(frames, len(classes)) log-probabilities of those class indices (the blank: ``blank``) in the frames so far.
        """
        return self._columns(classes)

    def _columns(self, classes: np.ndarray) -> np.ndarray:
        """(frames, len(classes)) log-probabilities of those classes in the frames so far."""
        rows = self._lp[: self._frames]
        if self._table is None:
            return rows[:, classes]
        width = self._table.shape[1]
        return np.maximum(self._products(rows[:, :width], classes) - rows[:, width:], FLOOR)

    def _products(self, vectors: np.ndarray, classes: np.ndarray | None = None) -> np.ndarray:
        """(m, H) vectors -> (m, C + 1) (or the ``classes``) logits, in the head's float32, as float64."""
        table = self._table if classes is None else self._table[classes]
        # through torch, not numpy's BLAS: a second thread pool beside torch's slows the LLM steps down
        product = torch.from_numpy(vectors.astype(np.float32)) @ torch.from_numpy(table).T
        return product.double().numpy()

    def _store(self, lp: np.ndarray, kept: np.ndarray) -> None:
        """Append the rows ``kept`` of frames with log-probabilities ``lp``, doubling the buffer when full (no
        copy of every earlier frame at each read); a buffer shared with another scorer (``copy``) is left as it is,
        the frames moving to one of this scorer's own."""
        if len(lp) == 0:
            return
        need = self._frames + len(lp)
        if need > len(self._lp) or not self._owns_buffer:
            size = len(self._lp) if need <= len(self._lp) else max(need, 2 * len(self._lp))
            grown = np.empty((size, self._lp.shape[1]))
            grown[: self._frames] = self._lp[: self._frames]
            self._lp, self._owns_buffer = grown, True
        self._lp[self._frames : need] = kept
        self._frames = need
        path = lp.argmax(axis=1)
        starts = path != np.concatenate([[self._best_last], path[:-1]])
        self._best_labels += int(np.sum(starts & (path != self.blank)))
        self._best_last = int(path[-1])

    def add_vectors(self, vectors: np.ndarray) -> None:
        """Append (m, H) frame vectors of the head (a scorer built with a ``table``)."""
        vectors = np.asarray(vectors, dtype=np.float64)
        logits = self._products(vectors)
        self.add_frames(logits - (norm := log_normalisers(logits)), np.concatenate([vectors, norm], axis=1))

    def add_frames(self, lp: np.ndarray, kept: np.ndarray | None = None) -> None:
        """Append (m, C + 1) frame log-probabilities; all prefixes of the hypothesis move forward together.
        (``kept``: what to store of them, from ``add_vectors``.)"""
        if self._table is not None and kept is None:
            raise ValueError("a scorer with a class table takes frame vectors (add_vectors)")
        lp = np.maximum(np.asarray(lp, dtype=np.float64), FLOOR)  # no -inf: the recursions subtract sums
        labels = np.array(self.labels, dtype=np.int64)
        same = np.zeros(len(labels), dtype=bool)
        if len(labels) > 1:
            same[1:] = labels[1:] == labels[:-1]
        n, b = self.col_n, self.col_b
        r_n, r_b = [], []  # the current prefix at the new frames
        psi = self.psi
        for row in lp:
            # phi for prefix length l >= 1: paths of length l - 1 that may emit label l next
            phi = np.where(same, b[:-1], np.logaddexp(b[:-1], n[:-1]))
            if len(labels):
                psi = np.logaddexp(psi, phi[-1] + row[labels[-1]])
            new_n = np.concatenate([[NEG], np.logaddexp(n[1:], phi) + row[labels]])
            new_b = np.logaddexp(b, n) + row[self.blank]
            n, b = new_n, new_b
            r_n.append(n[-1])
            r_b.append(b[-1])
        self.col_n, self.col_b = n, b
        self.r_n, self.r_b = np.append(self.r_n, r_n), np.append(self.r_b, r_b)
        self.psi = float(psi)
        self._store(lp, lp if kept is None else kept)

    def copy(self) -> "CTCPrefixScorer":
        """An independent copy (a hypothesis of a beam search). The class table, shared by a model's streams, is
        shared by the copy too, and so is the buffer of the frames so far: a stored frame never changes, and only the
        scorer that owns the buffer writes its spare rows (a copy that reads frames moves to a buffer of its own), so
        a hypothesis costs its forward variables (two numbers a frame), not the segment's frames (577 numbers a frame
        for the English model: a beam-16 plan 8 minutes into a segment held 1.8 GB of copies of them)."""
        twin = copy.deepcopy(self, {id(self._table): self._table, id(self._lp): self._lp})
        twin._owns_buffer = False
        return twin

    def append(self, label: int) -> None:
        """Add ``label`` (a class index) to the hypothesis."""
        last = self.labels[-1] if self.labels else None
        columns = self._columns(np.array([label, self.blank]))
        self.psi = float(prefix_scores(self.r_n, self.r_b, last, np.array([label]), columns[:, :1])[0]) \
            if self.frames else NEG
        self.r_n, self.r_b = extend_prefix(self.r_n, self.r_b, last, label, columns[:, 0], columns[:, 1])
        self.labels.append(label)
        self.col_n = np.append(self.col_n, self.r_n[-1])
        self.col_b = np.append(self.col_b, self.r_b[-1])

    def scores(self, labels: np.ndarray) -> np.ndarray:
        """log psi(g + c) - log psi(g) for each class index in ``labels``."""
        last = self.labels[-1] if self.labels else None
        labels = np.asarray(labels, dtype=np.int64)
        if not math.isfinite(self.psi):  # the text so far cannot be emitted by the frames: nothing extends it
            return np.full(labels.shape, NEG)
        return prefix_scores(self.r_n, self.r_b, last, labels, self._columns(labels)) - self.psi

    def best_path_length(self) -> int:
        """Labels on the CTC head's own best path over the frames so far (frame argmax, repeats merged, no blanks)."""
        return self._best_labels

    def end_score(self) -> float:
        """log p(the frames so far emit exactly g) - log psi(g); -inf when psi(g) = 0 (the frames cannot emit g)."""
        if not math.isfinite(self.psi):
            return NEG
        return float(np.logaddexp(self.r_n[-1], self.r_b[-1])) - self.psi


def fuse(llm_logits: torch.Tensor, allowed: torch.Tensor, scorer: CTCPrefixScorer, class_of: torch.Tensor,
         weight: float, candidates: int, eoc_id: int, eos_id: int, source_done: bool, eoc_run: int = 0) -> int:
    """The next token: the LLM's greedy choice, or among its ``candidates`` best text tokens the best fused one.

    ``allowed``: (V,) bool, tokens the session may write; ``class_of``: (V,) CTC class of each token id (-1: not a
    CTC class). Candidates that are not CTC classes (tokens of no training transcript) are left out, so a text token
    the head cannot score is never written while joint decoding: letting the LLM's best token through when it is
    such a token cost 4.3 points of WER on the real clips (26.9 -> 31.2 %) and 0.6 on the dev set (46.5 -> 47.2 %);
    giving it the best class candidate's CTC term instead did the same on the dev set. End-of-chunk and (before the
    end of the audio) end-of-text stay the LLM's choices. Once all the audio is read, an end-of-text the LLM ranks
    first competes with the best fused text token by its own fused score (the CTC side: log p(g complete) - log
    psi(g)); one it does not rank first is not weighed (the tuned figures were measured so); the text ends at
    once when it has ``TAIL_MARGIN`` labels more than the CTC head's own best path or when the head finds it
    impossible (psi(g) = 0: more labels than the frames can emit): whatever followed would be a loop or invention.
    While the text is ``SHORT_MARGIN`` or more labels short of that path, the best fused text token overrides the
    LLM's end-of-text, and its end-of-chunk when that would make ``EOC_RUN`` in a row (``eoc_run``: end-of-chunk
    tokens at the end of the text so far). Weight 0 is the LLM's greedy choice, as a session without joint decoding;
    so is every choice while the head has nothing to score with: before the segment's first frame, and mid-stream
    once the text ran ahead of the frames read (psi(g) = 0).
    """
    logp = masked_log_probs(llm_logits, allowed)
    top = int(torch.argmax(logp))
    if weight <= 0:
        return top  # (0 x a -inf CTC score would be NaN, and NaN wins np.argmax)
    if source_done and scorer.frames and (not math.isfinite(scorer.psi) or overran(scorer)):
        return eos_id  # all the speech is read and the text is longer than the CTC head hears: it overran
    if scorer.frames == 0 or not math.isfinite(scorer.psi):
        return top  # (psi(g) = 0 before the end: the text ran ahead of the speech read so far)
    steps = joint_steps(logp, scorer, class_of, weight, candidates, eoc_id, eos_id, source_done, eoc_run)
    return max(steps, key=lambda step: step[1])[0] if steps else top  # (a tie goes to the first: end-of-text)


def masked_log_probs(llm_logits: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """(V,) the LLM's log-probabilities on the CPU, -inf where a token may not be written (``allowed`` False)."""
    return torch.log_softmax(llm_logits.float().cpu(), dim=-1).masked_fill(~allowed, NEG)


def overran(scorer: CTCPrefixScorer) -> bool:
    """The text has ``TAIL_MARGIN`` labels more than the CTC head's own best path over the frames so far."""
    return len(scorer.labels) >= scorer.best_path_length() + TAIL_MARGIN


def joint_steps(logp: torch.Tensor, scorer: CTCPrefixScorer, class_of: torch.Tensor, weight: float, candidates: int,
                eoc_id: int, eos_id: int, source_done: bool, eoc_run: int) -> list[tuple[int, float]]:
    """``fuse``'s rules for a text the head can still emit (psi(g) > 0, after the segment's first frame): the tokens
    it may write next, each with its fused score (scores of -inf included), from the LLM's ``logp``
    (``masked_log_probs``). The LLM's own end-of-chunk or (before the end of the audio) end-of-text comes alone; else
    end-of-text (first, where it competes) and the CTC classes among the LLM's ``candidates`` best text tokens, in
    the LLM's order. Empty when none of them can be scored: the LLM's choice then stands. ``fuse`` takes the best;
    a beam search (``speechstream.beam``) goes on with several."""
    top = int(torch.argmax(logp))
    short = source_done and len(scorer.labels) + SHORT_MARGIN <= scorer.best_path_length()
    if (top == eoc_id and not (short and eoc_run + 1 >= EOC_RUN)) or (top == eos_id and not source_done):
        return [(top, (1 - weight) * float(logp[top]))]
    steps = []
    if top == eos_id and not short:
        steps.append((eos_id, (1 - weight) * float(logp[eos_id]) + weight * scorer.end_score()))
    text = logp.clone()
    text[[eoc_id, eos_id]] = NEG
    ids = torch.topk(text, min(candidates, text.numel())).indices
    ids = ids[(class_of[ids] >= 0) & torch.isfinite(text[ids])]
    if len(ids):
        fused = (1 - weight) * text[ids].double().numpy() + weight * scorer.scores(class_of[ids].numpy())
        steps += [(int(token), float(score)) for token, score in zip(ids.tolist(), fused)]
    return steps


class JointCTC:
    """One stream's joint CTC decoding: the model's CTC classes and a prefix scorer for the current segment."""

    def __init__(self, model, weight: float, candidates: int, beam: int = 1):
        self.model = model
        self.weight = weight
        self.candidates = candidates
        self.beam = beam  # hypotheses of the beam search over a chunk's writing (``speechstream.beam``); 1: greedy
        self.plan: deque[int] = deque()  # tokens the beam search chose, not yet written
        self.plan_rows: deque[torch.Tensor] = deque()  # the LLM's (V,) scores after each planned token but the last
        vocab = model.decoder.llm.get_input_embeddings().weight.shape[0]
        self.classes = model.ctc_classes if model.ctc_classes is not None else torch.arange(vocab)
        self.class_of = torch.full((vocab,), -1, dtype=torch.long)
        self.class_of[self.classes] = torch.arange(len(self.classes))
        self.allowed = model.writable()
        # the class table as float32 numpy (a view of the model's shared tensor, no copy)
        self.table = model.decoding_ctc_table().numpy()
        self.reset()

    def reset(self) -> None:
        """A new segment: no frames, no text."""
        self.scorer = CTCPrefixScorer(len(self.classes), self.table)
        self.eoc_run = 0  # end-of-chunk tokens at the end of the text
        self.drop_plan()

    @torch.no_grad()
    def frame_vectors(self, speech: torch.Tensor, fine: bool = False) -> np.ndarray:
        """(n, H) projector outputs -> (n, H) the CTC head's frame vectors (before the projector's output scale,
        as ``SpeechLLM.ctc_logits`` scores them); ``fine``: (n, H) vectors of the model's fine CTC head
        (``ctc_head.CTCWindowStream``), as they are."""
        vectors = speech if fine else speech / self.model.projector.output_scale
        return vectors.float().cpu().numpy()

    def add_frames(self, vectors: np.ndarray) -> None:
        """A read: the frames of its speech. A plan made before it is dropped (the next choice sees them)."""
        self.drop_plan()
        self.scorer.add_vectors(vectors)

    def text_labels(self, ids: list[int]) -> tuple[list[int], list[int | None]]:
        """For aligning text tokens ``ids`` to the segment's frames (``align``): the K CTC classes they use, and each
        token's column among them (None: not a CTC class)."""
        classes = sorted({int(self.class_of[token]) for token in ids if int(self.class_of[token]) >= 0})
        column = {label: j for j, label in enumerate(classes)}
        return classes, [column.get(int(self.class_of[token])) for token in ids]

    def text_log_probs(self, classes: list[int]) -> np.ndarray:
        """(frames, K + 1) log-probabilities of the segment's frames over those K classes and the blank (last)."""
        return self.scorer.columns(np.array(classes + [self.scorer.blank], dtype=np.int64))

    def add_text(self, token: int) -> None:
        """A text token was written: extend the hypothesis (tokens outside the CTC classes are skipped)."""
        if self.plan and self.plan[0] == token:
            self.plan.popleft()
            if self.plan_rows:
                self.plan_rows.popleft()
        else:  # the policy wrote something else (a cap's end-of-chunk): the rest of the plan no longer applies
            self.drop_plan()
        self.eoc_run = self.eoc_run + 1 if token == self.model.eoc_id else 0
        label = int(self.class_of[token])
        if label >= 0 and token not in self.model.special_ids:
            self.scorer.append(label)

    def drop_plan(self) -> None:
        self.plan.clear()
        self.plan_rows.clear()

    def planned_scores(self, tokens: list[int]) -> torch.Tensor | None:
        """Where writing ``tokens`` follows the plan and more of it is left: the LLM's (V,) scores after them, which
        the beam search computed (the session then need not step its LLM for them yet); else None."""
        if len(tokens) == 1 and self.plan_rows and self.plan[0] == tokens[0]:
            return self.plan_rows[0]
        return None

    def choose(self, logits: torch.Tensor, source_done: bool, planning: Callable | None = None) -> int:
        """The next token: the plan's next one; else with ``beam`` > 1 a new plan's first (``planning()`` gives the
        stream's LLM state and the policy's ``beam.Limits``, or None where no plan can be made); else ``fuse``'s."""
        if self.plan:
            return self.plan[0]
        if self.beam > 1 and planning is not None and self.scorer.frames and math.isfinite(self.scorer.psi):
            where = planning()
            if where is not None:
                from speechstream import beam  # (beam builds on this module)

                best = beam.plan(self, where[0], logits, where[1], self.beam)
                if best is not None:
                    self.plan.extend(best.tokens)
                    self.plan_rows.extend(best.rows[: len(best.tokens) - 1])
                    return self.plan[0]
        return fuse(logits.cpu(), self.allowed, self.scorer, self.class_of, self.weight, self.candidates,
                    self.model.eoc_id, self.model.eos_id, source_done, self.eoc_run)
