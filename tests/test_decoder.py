"""Streaming decoding reproduces the one-pass training forward, for every supported architecture."""

import dataclasses

import numpy as np
import pytest
import torch

from speechstream import gpe
from speechstream.batch import transcribe_batch
from speechstream.config import DecodingConfig
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
