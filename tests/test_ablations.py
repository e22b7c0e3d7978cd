"""Decoding-time GPE ablations (``DecodingConfig.ablation``): their positions, masks and decoder behaviour.

Each ablation must differ from GPE ("none") exactly where the mismatch it re-introduces applies, and match the
one-pass forward that describes it.
"""

import dataclasses

import numpy as np
import pytest
import torch

from speechstream import gpe
from speechstream.batch import transcribe_batch
from speechstream.config import DecodingConfig
from speechstream.errors import InputError
from speechstream.policy import WaitK
from speechstream.session import StreamingSession
from speechstream.verify import TOLERANCE, random_target
from tests.conftest import text_favouring_chooser

S, T, P = gpe.SOURCE, gpe.TARGET, gpe.PAD
DIFFERS = 1e-3  # a real difference in logits (float32 noise of equal computations is about 1e-6)


@pytest.fixture(scope="module")
def sharp_model():
    """The tiny model with queries and keys scaled up, so that attention (hence position and mask) matters.

    The seeded tiny LLM attends almost uniformly: moving a position changes its logits by about 1e-4, too
    close to float noise to tell an ablation from GPE. Sharper attention makes every difference plain.
    """
    from speechstream.model import load_model

    model = load_model("tiny-random")
    with torch.no_grad():
        for layer in model.decoder.llm.model.layers:
            layer.self_attn.q_proj.weight.mul_(6.0)
            layer.self_attn.k_proj.weight.mul_(6.0)
    return model


# -- pure functions -------------------------------------------------------------------------------


def test_group_positions_continue_each_group():
    kinds = torch.tensor([[S, S, T, S, T, P], [P, T, T, P, P, P]])
    positions = gpe.group_positions(torch.tensor([3, 0]), torch.tensor([5, 7]), kinds)
    assert positions.tolist() == [[3, 4, 5, 5, 6, 0], [0, 7, 8, 0, 0, 0]]


def test_arrival_positions_count_every_earlier_real_slot():
    cached = torch.tensor([[S, S, T, P], [S, P, P, P]])
    new = torch.tensor([[S, T, P, S], [T, T, S, P]])
    assert gpe.arrival_positions(cached, new).tolist() == [[3, 4, 0, 5], [1, 2, 3, 0]]


def test_interleaved_positions_differ_once_a_target_precedes_a_source():
    """Source-only streams get the same positions; a source read after a write does not."""
    empty = torch.zeros(1, 0, dtype=torch.long)
    first = torch.tensor([[S, S, S]])
    grouped_first = gpe.group_positions(torch.tensor([0]), torch.tensor([0]), first)
    assert torch.equal(gpe.arrival_positions(empty, first), grouped_first)
    cached = torch.tensor([[S, S, S, T, T]])
    second = torch.tensor([[S, S]])
    grouped = gpe.group_positions(torch.tensor([3]), torch.tensor([2]), second)
    assert grouped.tolist() == [[3, 4]]
    assert gpe.arrival_positions(cached, second).tolist() == [[5, 6]]


def test_causal_mask_lets_source_rows_see_targets_and_nothing_else_changes():
    generator = torch.Generator().manual_seed(0)
    for _ in range(20):
        cached = torch.randint(0, 3, (2, 6), generator=generator)
        new = torch.randint(0, 3, (2, 4), generator=generator)
        gpe_mask = gpe.cache_attention_mask(cached, new)
        causal = gpe.causal_cache_mask(cached, new)
        kinds = torch.cat([cached, new], dim=1)
        source_rows = (new == S)[:, None, :, None]
        target_keys = (kinds == T)[:, None, None, :]
        earlier = torch.ones(4, 10, dtype=torch.bool).tril(6)[None, None]
        # identical outside (source row, target key); there, causal attends to every earlier target
        assert torch.equal(gpe_mask & ~(source_rows & target_keys), causal & ~(source_rows & target_keys))
        assert not (gpe_mask & source_rows & target_keys).any()
        assert torch.equal(causal & source_rows & target_keys, earlier & source_rows & target_keys)


def test_step_mask_dispatch():
    cached, new = torch.tensor([[S, T, S]]), torch.tensor([[S, T]])
    for mode in ("none", "interleaved", "reencode"):
        assert torch.equal(gpe.step_mask(mode, cached, new), gpe.cache_attention_mask(cached, new))
    assert torch.equal(gpe.step_mask("source-sees-target", cached, new), gpe.causal_cache_mask(cached, new))
    assert not torch.equal(gpe.causal_cache_mask(cached, new), gpe.cache_attention_mask(cached, new))


def test_reencode_rows_are_reads_after_writes():
    cached = torch.tensor([[S, T], [S, S], [S, T], [P, P]])
    new = torch.tensor([[S, P], [S, S], [T, T], [S, S]])
    assert gpe.reencode_rows(cached, new).tolist() == [True, False, False, False]


# -- the decoder ------------------------------------------------------------------------------------


def _steps(decoder, mode, pieces):
    """Feed (embeds (n, H), kind) pieces one step each; return the logits of each step."""
    state = decoder.new_state(1, mode=mode)
    with torch.no_grad():
        return [decoder.step(state, e[None], torch.full((1, e.shape[0]), kind))[0] for e, kind in pieces], state


def _pieces(model, seed=0):
    """Source 5 tokens, target 3, source 4, target 2 (random source embeddings, real target tokens)."""
    generator = torch.Generator().manual_seed(seed)
    hidden = model.decoder.llm.get_input_embeddings().weight.shape[1]
    source = [torch.randn(n, hidden, generator=generator) for n in (5, 4)]
    target = [model.embed_ids([ord(c) for c in text]) for text in ("ab ", "cd")]
    return [(source[0], S), (target[0], T), (source[1], S), (target[1], T)]


def _one_pass(decoder, pieces, positions, mask):
    embeds = torch.cat([e for e, _ in pieces])[None]
    with torch.no_grad():
        out = decoder.llm(inputs_embeds=embeds, attention_mask=gpe.additive(mask[None, None], torch.float32),
                          position_ids=positions[None], use_cache=False)
    return out.logits[0]


def test_unknown_ablation_is_an_input_error(sharp_model):
    with pytest.raises(InputError, match="unknown ablation"):
        sharp_model.decoder.new_state(1, mode="bogus")
    with pytest.raises(InputError, match="unknown ablation"):
        StreamingSession(sharp_model, DecodingConfig(ablation="bogus"))


def test_session_passes_the_ablation_to_its_state(sharp_model):
    for mode in gpe.ABLATIONS:
        assert StreamingSession(sharp_model, DecodingConfig(ablation=mode)).llm.mode == mode


def test_interleaved_uses_arrival_positions(sharp_model):
    decoder = sharp_model.decoder
    pieces = _pieces(sharp_model)
    none, _ = _steps(decoder, "none", pieces)
    inter, _ = _steps(decoder, "interleaved", pieces)
    assert torch.equal(none[0], inter[0])  # the first source: same positions, same mask
    for a, b in zip(none[1:], inter[1:]):
        assert (a - b).abs().max() > DIFFERS
    # equals one forward over the arrival order, positions 0..13, GPE mask (source rows skip targets)
    kinds = torch.cat([torch.full((e.shape[0],), kind) for e, kind in pieces])
    mask = gpe.cache_attention_mask(torch.zeros(1, 0, dtype=torch.long), kinds[None])[0, 0]
    full = _one_pass(decoder, pieces, torch.arange(len(kinds)), mask)
    assert (torch.cat(inter) - full).abs().max() <= TOLERANCE


def test_source_sees_target_changes_source_states_after_the_first_write(sharp_model):
    decoder = sharp_model.decoder
    pieces = _pieces(sharp_model)
    none, _ = _steps(decoder, "none", pieces)
    ablated, _ = _steps(decoder, "source-sees-target", pieces)
    assert torch.equal(none[0], ablated[0]) and torch.equal(none[1], ablated[1])  # before any source follows a write
    assert (none[2] - ablated[2]).abs().max() > DIFFERS  # the source read after the write now sees it
    assert (none[3] - ablated[3]).abs().max() > DIFFERS / 10  # and the text after it sees changed source states
    # one forward in arrival order with group positions and a plain causal mask
    kinds = torch.cat([torch.full((e.shape[0],), kind) for e, kind in pieces])
    positions = gpe.group_positions(torch.tensor([0]), torch.tensor([decoder.phi]), kinds[None])[0]
    mask = torch.ones(len(kinds), len(kinds), dtype=torch.bool).tril()
    full = _one_pass(decoder, pieces, positions, mask)
    assert (torch.cat(ablated) - full).abs().max() <= TOLERANCE
    # with different text written, the second source's states differ too (under GPE they would not)
    other = pieces[:1] + [(sharp_model.embed_ids([ord(c) for c in "xy "]), T)] + pieces[2:3]
    assert torch.equal(_steps(decoder, "none", other)[0][2], none[2])
    assert (_steps(decoder, "source-sees-target", other)[0][2] - ablated[2]).abs().max() > DIFFERS


def test_reencode_rebuilds_the_target_after_each_read(sharp_model):
    decoder = sharp_model.decoder
    pieces = _pieces(sharp_model)
    none, _ = _steps(decoder, "none", pieces)
    ablated, state = _steps(decoder, "reencode", pieces)
    for step in range(3):
        assert torch.equal(none[step], ablated[step])
    assert (none[3] - ablated[3]).abs().max() > DIFFERS
    assert state.tokens_reencoded.tolist() == [3] and state.tokens_fed.tolist() == [14]
    assert state.kinds.tolist() == [[S] * 5 + [S] * 4 + [T] * 3 + [T] * 2]  # old copies dropped from the cache
    # the last rows equal the training forward in which every target row sees all 9 source tokens
    source = torch.cat([pieces[0][0], pieces[2][0]])[None]
    target_ids = torch.tensor([[ord(c) for c in "ab cd"]])
    logits = decoder.forward_train(source, torch.tensor([9]), target_ids, torch.tensor([5]), torch.full((1, 5), 9))
    assert (ablated[3] - logits[0, 3:]).abs().max() <= TOLERANCE
    # and the re-encoded target slots hold the keys/values of that forward
    embeds = torch.cat([source, decoder.embed(target_ids)], dim=1)
    mask = gpe.training_mask(9, 5, torch.full((5,), 9))
    positions = torch.cat([gpe.source_positions(9), gpe.target_positions(5, decoder.phi)])[None]
    with torch.no_grad():
        out = decoder.llm(inputs_embeds=embeds, attention_mask=gpe.additive(mask[None, None], torch.float32),
                          position_ids=positions, use_cache=True)
    for mine, theirs in zip(state.cache.layers, out.past_key_values.layers):
        assert (mine.keys - theirs.keys).abs().max() <= 1e-5
        assert (mine.values - theirs.values).abs().max() <= 1e-5


@pytest.mark.parametrize("architecture", ["qwen2", "gemma2", "phi3"])
def test_ablations_on_the_other_architectures(architecture):
    """Reencode matches the full-visibility forward in each family (gemma2 too: its cache layers are full ones)."""
    from speechstream.model import build_model
    from speechstream.verify import tiny_config

    model = build_model(tiny_config(architecture))
    decoder = model.decoder
    pieces = _pieces(model)
    ablated, state = _steps(decoder, "reencode", pieces)
    source = torch.cat([pieces[0][0], pieces[2][0]])[None]
    target_ids = torch.tensor([[ord(c) for c in "ab cd"]])
    with torch.no_grad():
        logits = decoder.forward_train(source, torch.tensor([9]), target_ids, torch.tensor([5]), torch.full((1, 5), 9))
    assert (ablated[3] - logits[0, 3:]).abs().max() <= TOLERANCE
    assert state.kinds.shape[1] == 14
    for mode in ("interleaved", "source-sees-target"):
        logits, _ = _steps(decoder, mode, pieces)
        assert all(torch.isfinite(x).all() for x in logits)


def _forced_session(model, audio, target, k, chunk_ms, ablation):
    policy = WaitK(k, max_tokens=10**9, max_tail_tokens=10**9, max_repeats=0)
    session = None

    def forced(_logits):
        fed = len(session.target_ids)
        return target[fed] if fed < len(target) else model.eos_id

    session = StreamingSession(model, DecodingConfig(chunk_ms=chunk_ms, k=k, ablation=ablation), policy=policy,
                               choose=forced, partials=False)
    session.record_logits = True
    for start in range(0, len(audio), 4000):
        session.feed(audio[start : start + 4000])
    session.finish()
    assert session.target_ids == target[:-1]
    return session


@pytest.mark.parametrize("k", [1, 2])
def test_reencode_session_rows_see_all_source_read_so_far(sharp_model, k):
    """Row r of a reencode stream equals the training forward where rows 0..r all see the source read at r."""
    rng = np.random.default_rng(3)
    audio = (0.1 * rng.standard_normal(36000)).astype(np.float32)
    n_units = 36000 // 10240 + 1
    target = random_target(sharp_model, n_units, rng)
    with torch.no_grad():
        session = _forced_session(sharp_model, audio, target, k, 640, "reencode")
        plain = _forced_session(sharp_model, audio, target, k, 640, "none")
        stream = torch.stack(session.logits)
        source = sharp_model.source_batch([audio], 640)
        fed = torch.tensor(target[:-1])
        units = gpe.units_visible(fed, sharp_model.eoc_id, k, n_units)
        ends = torch.tensor(source.unit_ends[0])
        for r in range(len(fed)):
            visible = torch.full((1, r + 1), int(ends[units[r] - 1]))
            batch = sharp_model.decoder.forward_train(source.embeds, source.lengths, fed[None, : r + 1],
                                                     torch.tensor([r + 1]), visible)
            assert (stream[r] - batch[0, r]).abs().max() <= TOLERANCE, r
    # it differs from GPE once text written before a read is re-encoded
    assert (stream - torch.stack(plain.logits)).abs().max() > DIFFERS
    reads = [r for r in range(1, len(fed)) if units[r] > units[r - 1]]  # a read happened before row r
    assert reads
    assert session.llm.tokens_reencoded.item() == sum(reads)  # every earlier target token, once per read
    assert plain.llm.tokens_reencoded.item() == 0
    assert session.llm.tokens_fed.item() == plain.llm.tokens_fed.item()


@pytest.mark.parametrize("ablation", ["interleaved", "source-sees-target", "reencode"])
def test_ablations_decode_in_a_batch_as_alone(sharp_model, ablation):
    rng = np.random.default_rng(4)
    audios = [(0.1 * rng.standard_normal(n)).astype(np.float32) for n in (9000, 26000)]
    decoding = DecodingConfig(chunk_ms=320, k=2, max_tokens_per_chunk=6, max_tail_tokens=20, ablation=ablation)
    choose = text_favouring_chooser(sharp_model)
    batched = transcribe_batch(sharp_model, audios, decoding, choose=choose, record_logits=True)
    plain = transcribe_batch(sharp_model, audios, dataclasses.replace(decoding, ablation="none"), choose=choose,
                             record_logits=True)
    differences = []
    for audio, together, gpe_session in zip(audios, batched, plain):
        alone = StreamingSession(sharp_model, decoding, choose=choose, partials=False)
        alone.record_logits = True
        alone.feed(audio)
        alone.finish()
        assert together.target_ids == alone.target_ids
        assert (torch.stack(together.logits) - torch.stack(alone.logits)).abs().max() < TOLERANCE
        n = min(len(together.logits), len(gpe_session.logits))
        differences.append(float((torch.stack(together.logits[:n]) - torch.stack(gpe_session.logits[:n])).abs().max()))
    assert max(differences) > DIFFERS, differences


def test_eval_counts_llm_work_and_resumes_runs_from_before_the_option(tiny_model, tmp_path, monkeypatch):
    """scores.json sums the LLM tokens fed and re-encoded; a run logged before --ablation existed still resumes."""
    import json

    import soundfile

    from speechstream.eval import run

    def shared_model(system, _name, decoding):  # the session's tiny model, not a fresh load per run
        system.model, system.decoding = tiny_model, decoding

    monkeypatch.setattr("speechstream.baselines.StreamingSystem.__init__", shared_model)
    rng = np.random.default_rng(5)
    soundfile.write(tmp_path / "a.wav", (0.1 * rng.standard_normal(24000)).astype(np.float32), 16000)
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(json.dumps({"id": "a", "audio": "a.wav", "text": "hello there"}) + "\n")
    decoding = DecodingConfig(chunk_ms=320, k=1)
    plain = run.evaluate(manifest, tmp_path / "none", "tiny-random", decoding, "asr", progress=False)
    again = run.evaluate(manifest, tmp_path / "re", "tiny-random", dataclasses.replace(decoding, ablation="reencode"),
                         "asr", progress=False)
    assert plain["LLM_tokens"] > 0 and plain["LLM_reencoded_tokens"] == 0
    assert again["LLM_reencoded_tokens"] > 0
    assert "re-encoded in addition" in (tmp_path / "re" / "summary.txt").read_text()
    record = json.loads((tmp_path / "re" / "instances.log").read_text())
    assert record["llm_reencoded_tokens"] == again["LLM_reencoded_tokens"]
    # a folder written before the option existed: its config.json lacks decoding.ablation
    config_path = tmp_path / "none" / "config.json"
    config = json.loads(config_path.read_text())
    del config["decoding"]["ablation"]
    config_path.write_text(json.dumps(config))
    assert run.evaluate(manifest, tmp_path / "none", "tiny-random", decoding, "asr", progress=False) == plain
    with pytest.raises(InputError, match="ablation"):
        run.evaluate(manifest, tmp_path / "none", "tiny-random", dataclasses.replace(decoding, ablation="reencode"),
                     "asr", progress=False)


def test_cli_rejects_an_unknown_ablation_and_ablations_of_baselines(capsys, tmp_path):
    from speechstream.cli import main

    assert main(["transcribe", "samples/jfk.wav", "--ablation", "bogus"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("speechstream: error: unknown ablation 'bogus'")
    assert main(["eval", "samples/manifest.jsonl", "--out", str(tmp_path / "o"), "--baseline", "whisper-offline",
                 "--ablation", "reencode"]) == 2
    assert "--ablation applies to the gpe system" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
