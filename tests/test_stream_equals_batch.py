"""Streaming equals the batch forward under varied settings (cases kept from a seeded randomized campaign).

Each case streams seeded noise through a session (tiny seeded models with sharpened attention, so that a wrong
position or mask moves the logits far beyond float noise) and checks, per segment, against references built here
from METHOD.md's definitions, not from the decoder's own code:

* the source tokens the stream fed equal the training-side source (``source_batch``) of that segment's audio;
* the source tokens each text row saw equal ``min(k + #eoc up to the row, N)`` units (the training mask of the text
  the stream wrote), and its logits equal ``forward_train`` of that text (GPE), one forward in arrival order with the
  ablation's positions and mask (interleaved, source-sees-target), or the forward where rows 0..r all see the
  source read at r (reencode).
"""

import dataclasses

import numpy as np
import pytest
import torch

from speechstream import gpe
from speechstream.chunker import chunk_samples
from speechstream.config import DecodingConfig
from speechstream.model import build_model
from speechstream.policy import WaitK
from speechstream.session import StreamingSession
from speechstream.verify import TOLERANCE, random_target, tiny_config
from tests.conftest import text_favouring_chooser

S, T, P = gpe.SOURCE, gpe.TARGET, gpe.PAD


# -- references from METHOD.md ----------------------------------------------------------------------------------


def arrival_mask(kinds: list[int], source_sees_target: bool = False) -> torch.Tensor:
    """(L, L) over slots in arrival order: earlier-or-same real slots; source rows skip target slots (unless the
    ablation lets them see it); padding rows see themselves only."""
    mask = torch.zeros(len(kinds), len(kinds), dtype=torch.bool)
    for i, row in enumerate(kinds):
        for j, col in enumerate(kinds[: i + 1]):
            mask[i, j] = row != P and col != P and (row != S or col != T or source_sees_target)
        mask[i, i] |= row == P
    return mask


def group_positions(kinds: list[int], phi: int) -> list[int]:
    """Source slots count 0, 1, ...; target slots phi, phi + 1, ...; padding 0."""
    counts, out = {S: 0, T: phi}, []
    for kind in kinds:
        out.append(counts.get(kind, 0))
        if kind in counts:
            counts[kind] += 1
    return out


def training_mask(n_source: int, n_target: int, visible: list[int], source_len: int, target_len: int) -> torch.Tensor:
    """``[source | target]``: source rows causal over real source; target row r the first visible[r] source tokens
    and targets 0..r; padding is never attended and padding rows see themselves only."""
    size = n_source + n_target
    mask = torch.zeros(size, size, dtype=torch.bool)
    real = [i < source_len if i < n_source else i - n_source < target_len for i in range(size)]
    for i in range(size):
        for j in range(size):
            if not (real[i] and real[j]):
                continue
            if i < n_source:
                mask[i, j] = j < n_source and j <= i
            else:
                mask[i, j] = j < visible[i - n_source] if j < n_source else j - n_source <= i - n_source
        mask[i, i] |= not real[i]
    return mask


def units_visible(target: list[int], eoc: int, k: int, n_units: int) -> list[int]:
    out, markers = [], 0
    for token in target:
        markers += token == eoc
        out.append(min(k + markers, n_units))
    return out


# -- the pure functions of gpe.py against them ---------------------------------------------------------------------


def test_gpe_functions_equal_brute_force_constructions():
    rng = np.random.default_rng(0)
    for _ in range(150):
        target = rng.choice([1, 2, 9], size=int(rng.integers(1, 16))).tolist()
        k, n_units = int(rng.integers(1, 4)), int(rng.integers(3, 7))
        assert gpe.units_visible(torch.tensor(target), 9, k, n_units).tolist() == units_visible(target, 9, k, n_units)
        n_source, n_target = int(rng.integers(1, 8)), int(rng.integers(1, 8))
        source_len, target_len = int(rng.integers(0, n_source + 1)), int(rng.integers(0, n_target + 1))
        visible = rng.integers(0, source_len + 1, size=n_target).tolist()
        assert torch.equal(gpe.training_mask(n_source, n_target, torch.tensor(visible), source_len, target_len),
                           training_mask(n_source, n_target, visible, source_len, target_len))
        batch, length, phi = int(rng.integers(1, 4)), int(rng.integers(1, 14)), int(rng.choice([0, 3, 128]))
        kinds = torch.tensor(rng.choice([P, S, T], size=(batch, length), p=[0.2, 0.5, 0.3]))
        cuts = sorted({int(c) for c in rng.integers(1, length + 1, size=2)} | {length})
        start, next_source, next_target = 0, torch.zeros(batch, dtype=torch.long), torch.full((batch,), phi)
        for stop in cuts:  # the stream's steps: each new piece against the slots cached before it
            cached, new = kinds[:, :start], kinds[:, start:stop]
            group = gpe.group_positions(next_source, next_target, new)
            arrival = gpe.arrival_positions(cached, new)
            for b in range(batch):
                row = kinds[b, :stop].tolist()
                for mode in ("none", "source-sees-target"):
                    expected = arrival_mask(row, mode == "source-sees-target")[start:stop]
                    assert torch.equal(gpe.step_mask(mode, cached, new)[b, 0], expected)
                assert group[b].tolist() == group_positions(row, phi)[start:stop]
                real = [i for i, kind in enumerate(row) if kind != P]
                assert arrival[b].tolist() == [real.index(i) if i in real else 0 for i in range(start, stop)]
                assert bool(gpe.reencode_rows(cached, new)[b]) == (S in row[start:] and T in row[:start])
            next_source = next_source + (new == S).sum(1)
            next_target = next_target + (new == T).sum(1)
            start = stop


# -- streaming sessions against them -------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Case:
    architecture: str = "llama"
    stack: int = 4
    lookahead: int = 0
    left_frames: int | None = 100
    phi: int = 0
    ctc_hop: int = 0
    chunk_ms: int = 320
    lengths: tuple[tuple[int, int], ...] = ((0, 1),)  # per segment: (whole chunks, samples past them; -1: short)
    k: int = 1
    ablation: str = "none"
    forced: bool = False  # teacher-forced random target (else free-running: caps, guard, joint CTC act)
    max_tokens: int = 24
    max_repeats: int = 0
    ctc_weight: float = 0.0
    context_tokens: int = 0
    feed: int = 4000  # samples per feed (0: random sizes)
    longrope: int = 0  # phi3 with LongRoPE from this original_max_position_embeddings on (0: plain RoPE)


CASES = {
    "shorter-than-one-chunk-k3": Case(lengths=((0, 1),), k=3, forced=True),
    "one-40ms-chunk-stack8": Case(stack=8, chunk_ms=40, lengths=((1, 0),), k=1, forced=True),
    "one-sample-over-lookahead32-left0": Case(stack=8, lookahead=32, left_frames=0, lengths=((2, 1),), k=2,
                                             forced=True, feed=0),
    "exact-multiple-lookahead8-stack3": Case(stack=3, lookahead=8, lengths=((3, 0),), k=1, forced=True),
    "stack1-phi1000-k5": Case(stack=1, phi=1000, chunk_ms=160, lengths=((6, 333),), k=5, forced=True, feed=0),
    "cap1-gemma2": Case(architecture="gemma2", lengths=((3, 777),), max_tokens=1),
    "cap2-guard-joint-ctc-fine-head": Case(stack=4, ctc_hop=2, chunk_ms=160, lengths=((4, -1),), max_tokens=2,
                                           max_repeats=2, ctc_weight=0.5),
    "reset-with-context-phi128": Case(phi=128, lengths=((2, 100), (2, 1)), max_tokens=3, context_tokens=3),
    "reset-with-context-cap1": Case(lookahead=4, lengths=((2, 0), (2, 5000)), max_tokens=1, context_tokens=8, feed=0),
    "interleaved-qwen2-phi5": Case(architecture="qwen2", phi=5, lengths=((3, 1),), max_tokens=2,
                                   ablation="interleaved"),
    "source-sees-target-phi3": Case(architecture="phi3", lengths=((3, 0),), k=2, forced=True,
                                    ablation="source-sees-target"),
    "reencode-lookahead4-cap2": Case(lookahead=4, lengths=((3, 200),), max_tokens=2, ablation="reencode"),
}

_models: dict[tuple, object] = {}


def case_model(case: Case):
    """The tiny seeded model of the case's sizes, its attention sharpened (q and k weights times 6)."""
    key = (case.architecture, case.stack, case.lookahead, case.left_frames, case.phi, case.ctc_hop, case.longrope)
    if key not in _models:
        config = tiny_config(case.architecture)
        config = dataclasses.replace(
            config, ctc_hop=case.ctc_hop, projector=dataclasses.replace(config.projector, stack=case.stack),
            encoder=dataclasses.replace(config.encoder, lookahead_frames=case.lookahead, left_frames=case.left_frames),
            llm=dataclasses.replace(config.llm, phi=case.phi))
        model = build_model(config)
        llm = model.decoder.llm.config
        head = llm.hidden_size // llm.num_attention_heads
        with torch.no_grad():
            if case.ctc_hop:
                model.ctc_head.init_from_projector(model.projector, model.ctc_blank)
            for layer in model.decoder.llm.model.layers:
                attention = layer.self_attn
                if hasattr(attention, "qkv_proj"):  # phi3: q and k rows first
                    attention.qkv_proj.weight[: (llm.num_attention_heads + llm.num_key_value_heads) * head].mul_(6.0)
                else:
                    attention.q_proj.weight.mul_(6.0)
                    attention.k_proj.weight.mul_(6.0)
        if case.longrope:
            use_longrope(model.decoder.llm, case.longrope)
        _models[key] = model
    return _models[key]


def use_longrope(llm, original: int) -> None:
    """Switch a tiny phi3 to LongRoPE (as Phi-3-128k and Phi-3.5 name it): its long factors, far from the short
    ones, take over in a call whose largest position reaches ``original``."""
    config = llm.config
    half = config.hidden_size // config.num_attention_heads // 2
    config.original_max_position_embeddings = original
    config.rope_parameters = {"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [1.0] * half,
                              "long_factor": [2.0 + i for i in range(half)],
                              "original_max_position_embeddings": original}
    llm.model.rotary_emb = type(llm.model.rotary_emb)(config)


def stream(case: Case, model, audios: list[np.ndarray], rng: np.random.Generator, monkeypatch):
    """Run the case's session over the segments (a gap between them ends one); returns it and, per segment, the
    (kinds, embeds) of each LLM step."""
    steps: list[tuple[int, list[int], torch.Tensor]] = []
    step = model.decoder.step

    def logged(state, embeds, kinds, keep=None):
        steps.append((id(state), kinds[0].tolist(), embeds[0].clone()))
        return step(state, embeds, kinds, keep=keep)

    monkeypatch.setattr(model.decoder, "step", logged)
    decoding = DecodingConfig(chunk_ms=case.chunk_ms, k=case.k, max_tokens_per_chunk=case.max_tokens,
                              max_repeats=case.max_repeats, max_tail_tokens=30, ablation=case.ablation,
                              context_tokens=case.context_tokens, ctc_weight=case.ctc_weight)
    policy = choose = None
    session: StreamingSession
    if case.forced:
        target = random_target(model, len(audios[0]) // chunk_samples(case.chunk_ms) + 1, rng)
        policy = WaitK(case.k, max_tokens=10**9, max_tail_tokens=10**9, max_repeats=0)

        def choose(_logits):
            return target[len(session.target_ids)] if len(session.target_ids) < len(target) else model.eos_id
    elif not case.ctc_weight:
        choose = text_favouring_chooser(model)
    session = StreamingSession(model, decoding, policy=policy, choose=choose, partials=False)
    session.record_logits = True
    for j, audio in enumerate(audios):
        if j:
            session.gap(1600)
        start = 0
        while start < len(audio):
            size = case.feed or int(rng.integers(1, 3 * chunk_samples(case.chunk_ms)))
            session.feed(audio[start : start + size])
            start += size
    session.finish()
    segments, last = [], None
    for state, kinds, embeds in steps:
        if state != last:
            segments.append([])
            last = state
        segments[-1].append((kinds, embeds))
    return session, segments


def one_pass(model, kinds: list[int], embeds: torch.Tensor, positions: list[int], mask: torch.Tensor):
    out = model.decoder.llm(inputs_embeds=embeds[None], attention_mask=gpe.additive(mask[None, None], torch.float32),
                            position_ids=torch.tensor(positions)[None], use_cache=False)
    return out.logits[0, [i for i, kind in enumerate(kinds) if kind == T]]


@pytest.mark.parametrize("name", list(CASES))
def test_streaming_equals_the_batch_forward(name, monkeypatch):
    case = CASES[name]
    model = case_model(case)
    rng = np.random.default_rng(sorted(CASES).index(name))
    size = chunk_samples(case.chunk_ms)
    audios = [(0.1 * rng.standard_normal(max(chunks * size + extra, 1))).astype(np.float32)
              for chunks, extra in case.lengths]
    with torch.no_grad():
        session, segments = stream(case, model, audios, rng, monkeypatch)
        assert len(segments) == len(audios) == session.segment + 1
        check_segments(case, model, session, segments, audios)


def check_segments(case: Case, model, session, segments, audios) -> None:
    """Each segment's source, the source each text row saw and its logits against the references, from its audio."""
    with torch.no_grad():
        row = 0
        for j, (audio, steps) in enumerate(zip(audios, segments)):
            kinds = [kind for step_kinds, _ in steps for kind in step_kinds]
            context = next(step_kinds for step_kinds, _ in steps if T in step_kinds).count(T) - len(model.header_ids)
            assert 1 <= context <= case.context_tokens if j and case.context_tokens else context == 0  # after a reset
            embeds = torch.cat([e for _, e in steps])
            n_target = kinds.count(T)
            ids = session.target_ids[row : row + n_target]
            logits = torch.stack(session.logits[row : row + n_target])
            row += n_target
            source = model.source_batch([audio], case.chunk_ms)
            fed_source = embeds[[i for i, kind in enumerate(kinds) if kind == S]]
            assert fed_source.shape[0] == int(source.lengths[0])
            assert (fed_source - source.embeds[0, : fed_source.shape[0]]).abs().max() <= 1e-4
            seen = [kinds[:i].count(S) for i, kind in enumerate(kinds) if kind == T]  # source slots before each row
            units = units_visible(ids, model.eoc_id, case.k, len(source.unit_ends[0]))
            if case.ablation != "reencode":  # (its rows are fed again after each read: below)
                assert seen == [source.unit_ends[0][u - 1] for u in units]
            if case.ablation == "none":
                expected = model.forward_train(source, [ids], case.k)[0]
            elif case.ablation == "interleaved":
                expected = one_pass(model, kinds, embeds, list(range(len(kinds))), arrival_mask(kinds))
            elif case.ablation == "source-sees-target":
                expected = one_pass(model, kinds, embeds, group_positions(kinds, model.decoder.phi),
                                    arrival_mask(kinds, source_sees_target=True))
            else:
                n_source, rows = fed_source.shape[0], []
                for r in range(n_target):  # rows 0..r all see the source read before row r: [source | target]
                    layout = [S] * n_source + [T] * (r + 1)
                    rows.append(one_pass(model, layout, torch.cat([fed_source, model.embed_ids(ids[: r + 1])]),
                                         group_positions(layout, model.decoder.phi),
                                         training_mask(n_source, r + 1, [seen[r]] * (r + 1), n_source, r + 1))[r])
                expected = torch.stack(rows)
            assert (logits - expected).abs().max() <= TOLERANCE, (j, case)
        assert row == len(session.logits) == len(session.target_ids)


def test_a_longrope_stream_stays_below_the_threshold_and_equals_the_batch_forward(monkeypatch):
    """transformers picks LongRoPE's short or long factors per call from that call's largest position: a stream
    whose early steps stayed below ``original_max_position_embeddings`` and whose later ones passed it rotated keys
    with both sets, its one-pass forward with the long set only (logits off by 0.4). Now its segments end where
    they would pass the threshold, so every call, and each segment's one-pass forward, uses the short set."""
    case = Case(architecture="phi3", longrope=64, lengths=((20, 777),), max_tokens=2)
    model = case_model(case)
    rng = np.random.default_rng(7)
    (chunks, extra), = case.lengths
    audio = (0.1 * rng.standard_normal(chunks * chunk_samples(case.chunk_ms) + extra)).astype(np.float32)
    with torch.no_grad():
        session, segments = stream(case, model, [audio], rng, monkeypatch)
    check_segments(case, model, session, segments, np.split(audio, session.segment_starts))
    assert session.segment >= 2 and len(segments) == session.segment + 1
