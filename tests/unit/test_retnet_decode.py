"""RetNet decoding at a fixed small cost: the fast one-token step, the static-buffer decoder (CUDA graph on a GPU),
batched generation of prompts of different lengths, and the cached decay/rotary tables of the parallel forms."""

from __future__ import annotations

import copy

import pytest
import torch

import zoo
from zoo.models.retnet import RecurrentDecoder, RetNetInputError

VOCAB = 97
NEEDS_CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def make_model(dtype: torch.dtype = torch.float32, prune: bool = False, **overrides) -> torch.nn.Module:
    torch.manual_seed(0)
    model = zoo.create_model("retnet_tiny", vocab_size=VOCAB, depth=3, **overrides).to(dtype).eval()
    with torch.no_grad():  # weights away from the initial scale, so that every part of the step matters
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    if prune:  # a removed retention sub-layer (no state) and a removed FFN
        model.blocks[1].retention = torch.nn.Identity()
        model.blocks[2].ffn = torch.nn.Identity()
    return model


def reference_of(model: torch.nn.Module) -> torch.nn.Module:
    reference = copy.deepcopy(model)
    reference.set_fast_step(False)
    return reference


def prompt(batch: int = 2, length: int = 21, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


VARIANTS = [pytest.param({}, False, id="default"), pytest.param({}, True, id="pruned"),
            pytest.param({"rope": "neox", "head_norm_affine": True}, False, id="fla-options"),
            pytest.param({"tie_embeddings": True, "decay": "linspace"}, False, id="tied-linspace")]


@pytest.mark.parametrize("options,prune", VARIANTS)
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-6), (torch.float64, 1e-12)], ids=["fp32", "fp64"])
def test_fast_step_equals_the_reference_step(options, prune, dtype, tol):
    """The one-token step through the public API and the decoder generate uses (packed weights or not), over many
    consecutive tokens, equal the reference recurrent form: logits and state (the same arithmetic, reordered only
    where that is exact)."""
    model = make_model(dtype, prune, **options)
    reference = reference_of(model)
    with torch.no_grad():
        _, state = model(prompt(), mode="chunkwise", return_state=True)
        decoders = {"packed": RecurrentDecoder(model, state, 2), "unpacked": RecurrentDecoder(model, state, 2,
                                                                                           pack=False)}
        assert decoders["packed"].packed is not None and decoders["unpacked"].packed is None
        api_state, ref_state = state, state
        token = prompt(2, 1, seed=5)
        for _ in range(12):
            expected, ref_state = reference(token, mode="recurrent", state=ref_state, return_state=True)
            got, api_state = model(token, mode="recurrent", state=api_state, return_state=True)
            torch.testing.assert_close(got, expected, rtol=0, atol=tol)
            for decoder in decoders.values():
                torch.testing.assert_close(decoder(token), expected[:, -1], rtol=0, atol=tol)
            token = expected[:, -1:].argmax(-1)
        for decoder in (*decoders.values(), None):
            layers = api_state.layers if decoder is None else decoder.state().layers
            for got, want in zip(layers, ref_state.layers):
                assert (got is None) == (want is None)
                if want is not None:
                    torch.testing.assert_close(got, want, rtol=0, atol=tol)
        assert decoders["packed"].state().offset == ref_state.offset == 21 + 12


def test_the_reference_step_is_another_path(monkeypatch):
    """The equality above compares two paths: the fast step runs MultiScaleRetention.step, the reference does not."""
    from zoo.models.retnet import MultiScaleRetention

    calls = []
    original = MultiScaleRetention.step
    monkeypatch.setattr(MultiScaleRetention, "step", lambda self, *a, **k: calls.append(1) or original(self, *a, **k))
    model = make_model()
    token = prompt(1, 1)
    with torch.no_grad():
        _, state = model(prompt(1), mode="chunkwise", return_state=True)
        reference_of(model)(token, mode="recurrent", state=state)
        assert not calls
        model(token, mode="recurrent", state=state)
        assert len(calls) == 3  # one per block


def test_fast_step_is_not_taken_with_autograd():
    model = make_model()
    token = prompt(1, 1)
    model.zero_grad()
    logits = model(token, mode="recurrent", state=model.init_state(1))
    logits.sum().backward()
    assert model.blocks[0].retention.q_proj.weight.grad is not None  # gradients reach the retention projections


@pytest.mark.parametrize("decode", ["auto", "static", "forward"])
def test_generate_greedy_equals_the_reference_decode(decode):
    model = make_model()
    ids = prompt(3, 17)
    expected = reference_of(model).generate(ids, 25, decode="forward")
    assert torch.equal(model.generate(ids, 25, decode=decode), expected)


def test_sampling_is_the_same_in_every_decode_mode():
    model = make_model()
    ids = prompt(2, 9)
    outs = []
    for decode in ("static", "forward"):
        torch.manual_seed(3)
        outs.append(model.generate(ids, 15, do_sample=True, temperature=0.9, top_k=7, decode=decode))
    assert torch.equal(*outs)


def test_decoder_state_continues_with_the_public_api():
    """A decoder's state is an ordinary RetNetState: the forward API continues it."""
    model = make_model()
    with torch.no_grad():
        logits, state = model(prompt(1, 10), mode="parallel", return_state=True)
        decoder = RecurrentDecoder(model, state, 1)
        token = logits[:, -1:].argmax(-1)
        decoder(token)
        continued = model(token, mode="recurrent", state=decoder.state())
        full = model(torch.cat([prompt(1, 10), token, token], 1))
    torch.testing.assert_close(continued[:, -1], full[:, -1], rtol=1e-5, atol=1e-5)


# -- batched generation ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("prefill", ["parallel", "chunkwise"])
def test_prompts_of_different_lengths_generate_what_each_generates_alone(prefill):
    model = make_model()
    prompts = [prompt(1, n, seed=n)[0] for n in (3, 17, 9, 1)]
    batched = model.generate(prompts, 20, prefill=prefill, chunk_size=4)
    assert isinstance(batched, list) and [len(row) for row in batched] == [23, 37, 29, 21]
    for row, alone in zip(batched, prompts):
        assert torch.equal(row, model.generate(alone[None], 20, prefill=prefill, chunk_size=4)[0])


def test_left_padded_batch_with_attention_mask():
    model = make_model()
    prompts = [prompt(1, n, seed=n)[0] for n in (4, 11)]
    ids = torch.zeros(2, 11, dtype=torch.long)
    mask = torch.zeros(2, 11, dtype=torch.long)
    for row, p in enumerate(prompts):
        ids[row, 11 - len(p):], mask[row, 11 - len(p):] = p, 1
    out = model.generate(ids, 8, attention_mask=mask)
    assert out.shape == (2, 19)
    assert torch.equal(out[0, 7:], model.generate(prompts[0][None], 8)[0])
    assert torch.equal(out[1], model.generate(prompts[1][None], 8)[0])


@pytest.mark.parametrize("mode", ["parallel", "chunkwise", "recurrent"])
def test_padding_changes_no_token_logits_or_state(mode):
    """A padded row computes what the row computes alone, in every form (retention depends on relative positions)."""
    model = make_model()
    alone = prompt(1, 9)
    padded = torch.cat([torch.full((1, 5), 3), alone], dim=1)
    mask = torch.cat([torch.zeros(1, 5), torch.ones(1, 9)], dim=1).long()
    with torch.no_grad():
        want, want_state = model(alone, mode=mode, chunk_size=4, return_state=True)
        got, got_state = model(padded, mode=mode, chunk_size=4, return_state=True, attention_mask=mask)
        # the states differ only by the rotation of 5 positions; the next token's logits show they are equivalent
        token = want[:, -1:].argmax(-1)
        next_want = model(token, mode="recurrent", state=want_state)
        next_got = model(token, mode="recurrent", state=got_state)
    torch.testing.assert_close(got[:, 5:], want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(next_got, next_want, rtol=1e-5, atol=1e-5)


def test_bad_masks_and_decodes_are_refused():
    model = make_model()
    ids = prompt(2, 6)
    with pytest.raises(RetNetInputError, match="shape of input_ids"):
        model(ids, attention_mask=torch.ones(2, 5))
    with pytest.raises(RetNetInputError, match="only 0"):
        model(ids, attention_mask=torch.full((2, 6), 2))
    right_padded = torch.ones(2, 6, dtype=torch.long)
    right_padded[0, -1] = 0
    with pytest.raises(RetNetInputError, match="left padding"):
        model.generate(ids, 3, attention_mask=right_padded)
    with pytest.raises(RetNetInputError, match="1-D integer tensors"):
        model.generate([ids[0], ids], 3)
    with pytest.raises(RetNetInputError, match="Unknown decode"):
        model.generate(ids, 3, decode="fastest")
    if not torch.cuda.is_available():
        with pytest.raises(RetNetInputError, match="CUDA"):
            model.generate(ids, 3, decode="graph")


# -- the tables the forms share ---------------------------------------------------------------------------------


def test_cached_tables_made_in_inference_mode_serve_training():
    """The decay and rotary tables are cached across calls; ones first made under inference_mode must still work
    in a training step (they are normal tensors)."""
    model = make_model()
    ids = prompt(2, 13)
    with torch.inference_mode():
        model(ids, mode="parallel")
        model(ids, mode="chunkwise", chunk_size=5)
    model.train()
    for mode in ("parallel", "chunkwise"):
        model.zero_grad()
        model(ids, mode=mode, chunk_size=5).float().pow(2).mean().backward()
        assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_forward_without_state_equals_forward_with_state():
    """Skipping the state's computation (return_state=False) gives the same logits."""
    model = make_model()
    ids = prompt(2, 19)
    with torch.no_grad():
        for mode in ("parallel", "chunkwise"):
            torch.testing.assert_close(model(ids, mode=mode, chunk_size=6),
                                       model(ids, mode=mode, chunk_size=6, return_state=True)[0], rtol=0, atol=0)


# -- CUDA graph ---------------------------------------------------------------------------------------------


@NEEDS_CUDA
@pytest.mark.parametrize("prune", [False, True])
def test_cuda_graph_decoder_equals_the_eager_step(prune):
    model = make_model(prune=prune).cuda()
    with torch.no_grad():
        _, state = model(prompt().cuda(), mode="chunkwise", return_state=True)
        graph, eager = RecurrentDecoder(model, state, 2, graph=True), RecurrentDecoder(model, state, 2)
        token = prompt(2, 1).cuda()
        for _ in range(10):
            want = eager(token)
            torch.testing.assert_close(graph(token), want, rtol=1e-5, atol=1e-5)
            token = want.argmax(-1, keepdim=True)


@NEEDS_CUDA
def test_generate_on_cuda_uses_the_graph_and_equals_the_reference():
    model = make_model().cuda()
    ids = prompt(2, 17).cuda()
    reference = reference_of(model).generate(ids, 20, decode="forward")
    assert torch.equal(model.generate(ids, 20), reference)
    assert torch.equal(model.generate(ids, 20, decode="graph"), reference)


# -- the corners a review found ------------------------------------------------------------------------------


def test_generate_under_autocast_keeps_the_reference_path():
    """Under autocast the retention core must stay in fp32: generate decodes through forward, as the reference."""
    model = make_model()
    ids = prompt(2, 15)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = reference_of(model).generate(ids, 12, decode="forward")
        assert torch.equal(model.generate(ids, 12), expected)
        assert torch.equal(model.generate(ids, 12, decode="static"), expected)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_models_generate_as_the_reference(dtype):
    model = make_model(dtype)
    ids = prompt(2, 15)
    expected = reference_of(model).generate(ids, 12, decode="forward")
    assert torch.equal(model.generate(ids, 12), expected)
    with torch.no_grad():
        _, state = model(ids, mode="chunkwise", return_state=True)
    assert RecurrentDecoder(model, state, 2).packed is None  # packing only where it changes no rounding


def test_packed_weights_are_made_once_and_follow_weight_changes():
    model = make_model()
    ids = prompt(1, 8)
    first = model.packed_decode_weights()
    assert model.packed_decode_weights() is first
    with torch.no_grad():
        model.blocks[0].retention.q_proj.weight.mul_(1.5)
    assert model.packed_decode_weights() is not first
    assert torch.equal(model.generate(ids, 10), reference_of(model).generate(ids, 10, decode="forward"))
    assert "_decode_pack" not in copy.deepcopy(model).__dict__


def test_decoder_refuses_a_state_of_another_model_or_batch():
    model, pruned = make_model(), make_model(prune=True)
    with torch.no_grad():
        _, state = pruned(prompt(2, 5), return_state=True)
    with pytest.raises(RetNetInputError, match="does not fit"):
        model.decoder(state, 2)
    with pytest.raises(RetNetInputError, match="does not fit"):
        pruned.decoder(state, 3)
    with pytest.raises(RetNetInputError, match="Unknown decode"):
        pruned.decoder(state, 2, "bogus")


def test_fast_step_takes_a_state_of_a_wider_dtype():
    model = make_model()
    with torch.no_grad():
        _, state = model(prompt(1, 6), return_state=True)
        wide = type(state)([None if s is None else s.double() for s in state.layers], state.offset)
        torch.testing.assert_close(model(prompt(1, 1), mode="recurrent", state=wide),
                                   model(prompt(1, 1), mode="recurrent", state=state))


def test_bad_prompt_lists_are_refused():
    model = make_model()
    with pytest.raises(RetNetInputError, match="integer"):
        model.generate([torch.tensor([1.7, 2.9])], 3)
    with pytest.raises(RetNetInputError, match="without one"):
        model.generate([prompt(1, 3)[0]], 3, attention_mask=torch.ones(1, 3))
    if not torch.cuda.is_available():
        with pytest.raises(RetNetInputError, match="CUDA"):
            model.generate(prompt(1, 3), 1, decode="graph")


def test_decoder_made_in_inference_mode_works_outside_it():
    model = make_model()
    with torch.inference_mode():
        _, state = model(prompt(1, 6), return_state=True)
        decoder = model.decoder(state, 1)
    token = prompt(1, 1)
    logits = decoder(token)
    with torch.no_grad():
        expected = reference_of(model)(token, mode="recurrent", state=state)
    torch.testing.assert_close(logits, expected[:, -1], rtol=0, atol=1e-6)


def test_large_decay_matrices_are_not_kept_between_calls():
    from zoo.models.retnet import ops as retention

    retention._cached_decay_tables.cache_clear()
    small = retention.decay_tables((-0.1, -0.2), 16, torch.device("cpu"), torch.float32)
    assert retention.decay_tables((-0.1, -0.2), 16, torch.device("cpu"), torch.float32)[0] is small[0]
    n = int((retention.TABLE_CACHE_BYTES / 8) ** 0.5) + 1  # 2 heads x n x n x 4 bytes just over the budget
    retention.decay_tables((-0.1, -0.2), n, torch.device("cpu"), torch.float32)
    assert retention._cached_decay_tables.cache_info().currsize == 1


@pytest.mark.parametrize("prune", [False, True], ids=["default", "pruned"])
def test_int8_decode_rounds_every_projection_to_eight_bits(prune):
    """quantize='int8': each packed weight is its per-output signed 8-bit rounding (what the step multiplies by),
    and the logits follow the float decoder's closely but not exactly, step after step."""
    from zoo.models.retnet import Int8Projection

    model = make_model(prune=prune)
    logits, state = model(prompt(), mode="parallel", return_state=True)
    exact = RecurrentDecoder(model, state, batch_size=2, pack=True)
    rounded = RecurrentDecoder(model, state, batch_size=2, quantize="int8")
    projections = [w for block in rounded.packed[:-1] for sub in block if sub is not None for w in sub]
    projections.append(rounded.packed[-1][0])  # the LM head
    assert len(projections) == 2 * (6 - 2 * prune) + 1 and all(isinstance(w, Int8Projection) for w in projections)
    matrix = model.packed_decode_weights()[-1][0]  # the LM head, [dim, vocab]
    scale = matrix.abs().amax(dim=0) / 127
    want = (matrix / scale).round().clamp(-127, 127) * scale
    x = torch.randn(3, matrix.shape[0])
    step_error = (rounded.packed[-1][0](x) - x @ want).abs().max() / (x @ want).abs().max()
    assert step_error < 0.02  # only the input's own 8-bit rounding is left
    token = prompt(2, 1, seed=5)
    for _ in range(6):
        a, b = exact(token), rounded(token)
        assert 0 < (a - b).abs().max() < 0.25 * a.abs().max()  # (inputs rounded per call too: 7-bit ranges)
        token = a.argmax(-1, keepdim=True)
    assert model.generate(prompt(), 5, quantize="int8").shape == (2, 26)


def test_int8_decode_refuses_what_it_cannot_run():
    model = make_model()
    _, state = model(prompt(), mode="parallel", return_state=True)
    with pytest.raises(RetNetInputError, match="allowed: None or 'int8'"):
        RecurrentDecoder(model, state, batch_size=2, quantize="int4")
    with pytest.raises(RetNetInputError, match="a float32 model on the CPU"):
        RecurrentDecoder(model.to(torch.bfloat16), state, batch_size=2, quantize="int8")
    model = make_model()
    with pytest.raises(RetNetInputError, match="decode='static' or 'auto'"):
        model.generate(prompt(), 3, decode="forward", quantize="int8")
