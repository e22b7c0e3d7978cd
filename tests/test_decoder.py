"""Streaming decoding reproduces the one-pass training forward, for every supported architecture."""

import dataclasses

import numpy as np
import pytest
import torch

from speechstream import gpe
from speechstream.audio import load_audio
from speechstream.batch import transcribe_batch
from speechstream.config import DecodingConfig
from speechstream.decoder import last_rows
from speechstream.model import ARCHITECTURES, build_model
from speechstream.policy import WaitK
from speechstream.session import StreamingSession
from speechstream.verify import TOLERANCE, random_target, teacher_forced_logits, tiny_config, verify_model
from tests.conftest import text_favouring_chooser


@pytest.fixture(scope="module", params=ARCHITECTURES)
def arch_model(request):
    return build_model(tiny_config(request.param))


@pytest.mark.parametrize("k", [1, 3])
def test_teacher_forced_streaming_equals_training_forward(arch_model, k):
    # 3.3 s is not a whole number of 640 ms chunks; 1000 ms chunks leave a 0.3 s tail too
    for chunk_ms in (640, 1000):
        result = verify_model(arch_model, arch_model.config.name, k, chunk_ms=chunk_ms, seconds=3.3)
        assert result.target_tokens > 10
        assert result.max_delta <= TOLERANCE, result


@pytest.mark.parametrize("lookahead", [8, 32])
def test_teacher_forced_streaming_equals_training_forward_with_encoder_lookahead(lookahead):
    """The encoder's right context delays each block's frames; the whole model still streams exactly."""
    config = tiny_config("llama")
    config = dataclasses.replace(config, encoder=dataclasses.replace(config.encoder, lookahead_frames=lookahead))
    model = build_model(config)
    for k, chunk_ms in ((1, 640), (2, 320)):
        result = verify_model(model, config.name, k, chunk_ms=chunk_ms, seconds=3.3)
        assert result.target_tokens > 10
        assert result.max_delta <= TOLERANCE, result


def test_a_header_holding_the_end_of_chunk_token_streams_what_it_trains_on():
    """A header with the end-of-chunk token in it (ChatML's "<|im_start|>assistant\\n" where the newline is the
    marker, as the SmolLM2 models' is) marks no chunk end: the training mask counted it as one, so every target row
    saw a chunk more than the stream gives it (delta 0.1, verify FAIL) and training taught that view."""
    config = tiny_config("llama")
    config = dataclasses.replace(config, prompt=dataclasses.replace(config.prompt,
                                                                    target_prefix="<|im_start|>assistant<|eoc|>"))
    model = build_model(config)
    assert model.header_ids[-1] == model.eoc_id
    for k in (1, 2):
        result = verify_model(model, config.name, k, chunk_ms=640, seconds=3.3)
        assert result.max_delta <= TOLERANCE, result


def test_a_wrong_schedule_is_detected(tiny_model):
    """Negative control: the training forward under wait-(k+1) does not match streaming under wait-k."""
    rng = np.random.default_rng(0)
    audio = (0.1 * rng.standard_normal(40000)).astype(np.float32)
    target = random_target(tiny_model, 40000 // 10240 + 1, rng)
    with torch.no_grad():
        stream = teacher_forced_logits(tiny_model, audio, target, k=1, chunk_ms=640)
        batch = tiny_model.forward_train(tiny_model.source_batch([audio], 640), [target], k=2)[0, : len(target) - 1]
    assert (stream - batch).abs().max() > 1e-2


def test_source_states_ignore_the_target(tiny_model):
    """Changing only target tokens leaves every source-side hidden state and cached key/value unchanged."""
    rng = np.random.default_rng(1)
    audio = (0.1 * rng.standard_normal(30000)).astype(np.float32)
    n_segments = 30000 // 10240 + 1
    targets = [random_target(tiny_model, n_segments, np.random.default_rng(seed)) for seed in (5, 6)]
    llm = tiny_model.decoder.llm
    with torch.no_grad():
        source = tiny_model.source_batch([audio], 640)
        n_source = source.embeds.shape[1]
        hidden = []
        for target in targets:
            ids = torch.tensor([target])
            visible = gpe.target_visibility(ids[0], source.unit_ends[0], tiny_model.eoc_id, 1)[None]
            mask = gpe.training_mask(n_source, len(target), visible[0])[None, None]
            embeds = torch.cat([source.embeds, tiny_model.decoder.embed(ids)], dim=1)
            positions = torch.cat([gpe.source_positions(n_source), gpe.target_positions(len(target), 0)])[None]
            out = llm(inputs_embeds=embeds, attention_mask=gpe.additive(mask, torch.float32), position_ids=positions,
                      output_hidden_states=True)
            hidden.append([h[0, :n_source] for h in out.hidden_states])
        assert targets[0] != targets[1]
        for a, b in zip(*hidden):
            assert torch.equal(a, b)
        # streaming: the source slots of the KV cache are identical whatever was written between reads
        caches = []
        for target in targets:
            forced = iter(target[len(tiny_model.header_ids) :])
            session = StreamingSession(tiny_model, DecodingConfig(k=1), policy=WaitK(1, 10**9, 10**9, 0),
                                       choose=lambda _logits, forced=forced: next(forced, tiny_model.eos_id))
            session.feed(audio)
            session.finish()
            source_slots = (session.llm.kinds[0] == gpe.SOURCE).nonzero().flatten()
            layer = session.llm.cache.layers[0]
            caches.append((layer.keys[0][:, source_slots], layer.values[0][:, source_slots]))
        assert torch.allclose(caches[0][0], caches[1][0], atol=1e-6)
        assert torch.allclose(caches[0][1], caches[1][1], atol=1e-6)


def test_streams_of_different_lengths_decode_in_one_batch(tiny_model):
    rng = np.random.default_rng(2)
    audios = [(0.1 * rng.standard_normal(n)).astype(np.float32) for n in (9000, 31000, 17777)]
    decoding = DecodingConfig(chunk_ms=320, k=2, max_tokens_per_chunk=6, max_tail_tokens=20)
    choose = text_favouring_chooser(tiny_model)
    batched = transcribe_batch(tiny_model, audios, decoding, choose=choose, record_logits=True)
    for audio, together in zip(audios, batched):
        alone = StreamingSession(tiny_model, decoding, choose=choose, partials=False)
        alone.record_logits = True
        alone.feed(audio)
        alone.finish()
        assert together.target_ids == alone.target_ids
        assert together.transcript == alone.transcript
        assert (torch.stack(together.logits) - torch.stack(alone.logits)).abs().max() < TOLERANCE
    assert any(s.transcript for s in batched), "the chooser should produce some text"


# -- logits of the rows read only -------------------------------------------------------------------


S, T, P = gpe.SOURCE, gpe.TARGET, gpe.PAD


def test_last_rows_are_each_rows_last_real_slots():
    kinds = torch.tensor([[S, S, S, P], [T, P, P, P], [T, T, T, T], [P, P, P, P], [S, S, P, P]])
    keep = last_rows(kinds, [2, 1, 1, 1, 0])
    assert keep.dtype == torch.bool
    assert keep.int().tolist() == [[0, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 1], [0, 0, 0, 0], [0, 0, 0, 0]]
    assert torch.equal(last_rows(kinds, [9] * 5), kinds != P)  # more than a row holds: all its real slots
    assert torch.equal(last_rows(torch.tensor([[P, T, P, T]]), [1]), torch.tensor([[False, False, False, True]]))
    with pytest.raises(ValueError):
        last_rows(kinds, [1, 1])


def _batched_steps(model, seed=0):
    """Steps of 3 streams, right-padded per stream: (embeds (3, Q, H), kinds (3, Q)) each."""
    generator = torch.Generator().manual_seed(seed)
    hidden = model.decoder.llm.get_input_embeddings().weight.shape[1]
    steps = []
    for kinds_per_row in [(S, S, S), (T, S, P), (T, T, S), (S, P, T)]:
        lengths = torch.randint(1, 5, (3,), generator=generator)
        embeds = torch.zeros(3, int(lengths.max()), hidden)
        kinds = torch.full((3, int(lengths.max())), P)
        for b, (kind, n) in enumerate(zip(kinds_per_row, lengths.tolist())):
            if kind == P:  # this stream waits: padding only
                continue
            ids = torch.randint(32, 127, (n,), generator=generator)
            embeds[b, :n] = model.embed_ids(ids.tolist()) if kind == T else torch.randn(n, hidden, generator=generator)
            kinds[b, :n] = kind
        steps.append((embeds, kinds))
    return steps


def test_kept_rows_logits_equal_the_all_rows_logits(arch_model):
    """``keep`` skips the output layer for the other rows only: kept logits and the cache are unchanged."""
    decoder = arch_model.decoder
    generator = torch.Generator().manual_seed(1)
    every, kept = decoder.new_state(3), decoder.new_state(3)
    with torch.no_grad():
        for i, (embeds, kinds) in enumerate(_batched_steps(arch_model)):
            if i % 2:  # any subset of rows
                keep = (torch.rand(kinds.shape, generator=generator) < 0.5) & (kinds != P)
            else:  # each stream's last row (a write's next token)
                keep = last_rows(kinds, [1, 1, 1])
            full = decoder.step(every, embeds, kinds)
            some = decoder.step(kept, embeds, kinds, keep=keep)
            assert full.shape[:2] == kinds.shape and some.shape == (int(keep.sum()), full.shape[-1])
            assert (some - full[keep]).abs().max() <= TOLERANCE
        assert decoder.step(kept, embeds, kinds, keep=torch.zeros_like(keep)).shape == (0, full.shape[-1])
    assert torch.equal(every.kinds, kept.kinds[:, : every.kinds.shape[1]])
    for a, b in zip(every.cache.layers, kept.cache.layers):
        assert torch.equal(a.keys, b.keys[..., : a.keys.shape[-2], :])
    with pytest.raises(ValueError, match="keep"):
        decoder.step(kept, embeds, kinds, keep=keep.long())


def _output_rows(model):
    """A counter of the rows that go through the LLM's output layer (a forward hook; remove it after)."""
    rows = [0]
    hook = model.decoder.llm.get_output_embeddings().register_forward_hook(
        lambda _module, args, _out: rows.__setitem__(0, rows[0] + args[0].reshape(-1, args[0].shape[-1]).shape[0])
    )
    return rows, hook


def _recording(choose, seen):
    def record(logits):
        seen.append(logits.clone())
        return choose(logits)

    return record


@pytest.mark.parametrize("batched", [False, True])
def test_the_fast_path_chooses_from_the_all_rows_last_row(tiny_model, batched):
    """Without ``record_logits`` only each write's last row goes through the output layer, and the chooser
    sees the last row of the all-rows logits (single stream and batch)."""
    speech = load_audio("samples/austen-0880.wav")
    audios = [speech, speech[:20000], (0.1 * np.random.default_rng(3).standard_normal(9000)).astype(np.float32)]
    decoding = DecodingConfig(chunk_ms=320, k=2, max_tokens_per_chunk=6, max_tail_tokens=20)
    choose = text_favouring_chooser(tiny_model)
    runs = {}
    for record in (True, False):
        seen: list[torch.Tensor] = []
        rows, hook = _output_rows(tiny_model)
        try:
            if batched:
                sessions = transcribe_batch(tiny_model, audios, decoding, _recording(choose, seen), record)
            else:
                sessions = [StreamingSession(tiny_model, decoding, choose=_recording(choose, seen), partials=False)]
                sessions[0].record_logits = record
                sessions[0].feed(audios[0])
                sessions[0].finish()
        finally:
            hook.remove()
        runs[record] = sessions, seen, rows[0]
    (every, seen_every, rows_every), (fast, seen_fast, rows_fast) = runs[True], runs[False]
    assert [s.target_ids for s in fast] == [s.target_ids for s in every]
    assert [s.transcript for s in fast] == [s.transcript for s in every]
    assert all(s.logits == [] for s in fast)
    assert len(seen_fast) == len(seen_every) > 10
    assert max((a - b).abs().max().item() for a, b in zip(seen_fast, seen_every)) <= TOLERANCE
    assert rows_fast == len(seen_fast)  # one output row per token chosen
    assert rows_every == sum(len(s.target_ids) for s in every)  # the reference path: every target row, no source row


def test_verify_bound_is_the_contracts_whatever_the_logits():
    """1e-4 absolute (INTERFACES.md: non-zero exit when any delta exceeds it), large logits or not."""
    from speechstream.verify import VerifyResult

    assert not VerifyResult("m", 1, 640, 10, 2e-4, logit_scale=30.0).ok
    assert VerifyResult("m", 1, 640, 10, 9e-5, logit_scale=30.0).ok
    assert VerifyResult("m", 1, 640, 10, 1e-4).ok and not VerifyResult("m", 1, 640, 10, 1.01e-4).ok
    assert VerifyResult("m", 1, 640, 10, 9e-5).bound == 1e-4


def test_a_streaming_step_runs_where_the_model_is_with_requests_built_on_the_cpu(tiny_model):
    """The state (cache kinds, positions) lives on the model's device; sessions build their requests on the CPU.
    Masks and positions must be made on the state's device: they were made on the CPU, so beside a CUDA cache every
    streaming step failed ('Expected all tensors to be on the same device'). The meta device (shapes, no data)
    stands in for a GPU here; the same device mixing fails on it."""
    import copy

    decoder = copy.deepcopy(tiny_model.decoder)
    decoder.llm.to("meta")
    state = decoder.new_state(1)
    assert state.kinds.device.type == "meta"
    hidden = decoder.llm.get_input_embeddings().weight.shape[1]
    kinds = torch.tensor([[gpe.SOURCE, gpe.SOURCE, gpe.TARGET]])  # on the CPU, as sessions build them
    logits = decoder.step(state, torch.zeros(1, 3, hidden, device="meta"), kinds)
    assert logits.shape[:2] == (1, 3) and state.kinds.device.type == "meta" and state.kinds.shape == (1, 3)
    visible = torch.tensor([1, 2, 2], device="meta")
    assert gpe.training_mask(3, 3, visible, 3, 2).device.type == "meta"
    assert gpe.additive(gpe.causal_cache_mask(state.kinds, kinds.to("meta")), torch.float32).device.type == "meta"
