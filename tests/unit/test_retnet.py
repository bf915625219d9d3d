"""RetNet: equivalence of the parallel, recurrent and chunkwise forms, state, generation, precision, zoo plumbing."""

from __future__ import annotations

import pytest
import torch

import zoo
from zoo.models.retnet import RETNET_SIZES, RetNetInputError, RetNetState

VOCAB = 97
MODES = ("parallel", "recurrent", "chunkwise")


def make_tiny(dtype: torch.dtype = torch.float32, seed: int = 0, **overrides) -> torch.nn.Module:
    torch.manual_seed(seed)
    return zoo.create_model("retnet_tiny", vocab_size=VOCAB, **overrides).to(dtype).eval()


def random_ids(batch: int, length: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


def all_forms(model, ids, chunk_size, state=None):
    with torch.no_grad():
        return {mode: model(ids, mode=mode, chunk_size=chunk_size, state=state, return_state=True) for mode in MODES}


def assert_forms_agree(model, ids, chunk_size, tol, state=None):
    outs = all_forms(model, ids, chunk_size, state)
    ref_logits, ref_state = outs["parallel"]
    for mode in ("recurrent", "chunkwise"):
        logits, state_out = outs[mode]
        assert relative_error(logits, ref_logits) <= tol, mode
        assert state_out.offset == ref_state.offset
        for got, want in zip(state_out.layers, ref_state.layers):
            assert (got is None) == (want is None)
            if want is not None:
                assert got.dtype == want.dtype and relative_error(got, want) <= tol, mode


# -- equivalence of the three forms --------------------------------------------------------------------------

CASES = [  # (batch, length, chunk): T not a multiple of the chunk, T < chunk, chunk 1, T == chunk
    pytest.param(2, 37, 8, id="T-not-multiple"),
    pytest.param(1, 5, 16, id="T-lt-chunk"),
    pytest.param(3, 13, 1, id="chunk-1"),
    pytest.param(2, 32, 16, id="T-multiple"),
]


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-10), (torch.float32, 1e-4)], ids=["fp64", "fp32"])
@pytest.mark.parametrize("batch,length,chunk", CASES)
def test_forms_agree_at_default_config(dtype, tol, batch, length, chunk):
    model = make_tiny(dtype)
    assert model.blocks[0].retention.norm_eps > 0  # the default config, not eps=0
    assert_forms_agree(model, random_ids(batch, length), chunk, tol)


@pytest.mark.parametrize("overrides", [dict(heads=4, decay="linspace"), dict(heads=8, dim=128, tie_embeddings=True)])
def test_forms_agree_other_configs(overrides):
    model = make_tiny(torch.float32, **overrides)
    assert_forms_agree(model, random_ids(2, 70), 16, 1e-4)


def test_forms_agree_on_a_long_sequence_fp32():
    model = make_tiny(torch.float32, heads=4)  # slow decays: long memory
    assert_forms_agree(model, random_ids(1, 600), 64, 1e-4)


# -- state: prefill, continuation ----------------------------------------------------------------------------


@pytest.mark.parametrize("prefill", ["parallel", "chunkwise"])
def test_prefill_state_equals_token_by_token_state(prefill):
    model = make_tiny(torch.float64)
    ids = random_ids(2, 23)
    with torch.no_grad():
        _, prefilled = model(ids, mode=prefill, chunk_size=5, return_state=True)
        stepped = None
        for t in range(ids.shape[1]):
            _, stepped = model(ids[:, t : t + 1], mode="recurrent", state=stepped, return_state=True)
    assert prefilled.offset == stepped.offset == 23
    for a, b in zip(prefilled.layers, stepped.layers):
        assert a.dtype == torch.float64 and torch.allclose(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("mode", MODES)
def test_continuing_from_a_state_equals_one_pass(mode):
    model = make_tiny(torch.float64)
    ids = random_ids(2, 30)
    with torch.no_grad():
        full = model(ids)
        head, state = model(ids[:, :11], mode="chunkwise", chunk_size=4, return_state=True)
        tail = model(ids[:, 11:], mode=mode, chunk_size=4, state=state)
    assert relative_error(torch.cat([head, tail], 1), full) < 1e-10


def test_state_in_fp32_for_fp32_model_and_not_mutated():
    model = make_tiny(torch.float32)
    ids = random_ids(1, 9)
    with torch.no_grad():
        _, state = model(ids, return_state=True)
        before = [s.clone() for s in state.layers]
        model(ids, mode="recurrent", state=state)
    assert all(s.dtype == torch.float32 for s in state.layers)
    assert all(torch.equal(a, b) for a, b in zip(before, state.layers))
    assert state.nbytes() == 2 * 1 * 2 * 32 * 64 * 4  # depth x batch x heads x d_k x d_v x fp32


# -- generation ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("prefill", ["parallel", "chunkwise"])
def test_greedy_generate_equals_repeated_parallel_argmax(prefill):
    model = make_tiny(torch.float64)
    prompt = random_ids(2, 7)
    out = model.generate(prompt, max_new_tokens=12, prefill=prefill, chunk_size=3)
    reference = prompt
    with torch.no_grad():
        for _ in range(12):
            next_token = model(reference, mode="parallel")[:, -1].argmax(-1, keepdim=True)
            reference = torch.cat([reference, next_token], 1)
    assert torch.equal(out, reference)


def test_sampling_shapes_and_top1_is_greedy():
    model = make_tiny()
    prompt = random_ids(3, 4)
    torch.manual_seed(0)
    sampled = model.generate(prompt, 6, temperature=0.8, top_k=5, do_sample=True)
    assert sampled.shape == (3, 10) and torch.equal(sampled[:, :4], prompt)
    assert int(sampled.max()) < VOCAB
    assert torch.equal(model.generate(prompt, 6, top_k=1, do_sample=True), model.generate(prompt, 6))
    assert torch.equal(model.generate(prompt, 0), prompt)


# -- precision -----------------------------------------------------------------------------------------------


def _cpu_supports_autocast(dtype: torch.dtype) -> bool:
    try:
        with torch.autocast("cpu", dtype=dtype):
            torch.nn.functional.linear(torch.ones(2, 2), torch.ones(2, 2))
        return True
    except (RuntimeError, TypeError):
        return False


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_autocast_long_sequence_is_finite(dtype):
    if not _cpu_supports_autocast(dtype):
        pytest.skip(f"CPU autocast does not support {dtype} in this torch build")
    model = make_tiny(torch.float32, heads=8, dim=128)  # the slowest decay has a ~8k-token memory
    with torch.no_grad():  # large activations: the un-normalised decay sums reach well past fp16's 65504
        for name, p in model.named_parameters():
            if name.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight")):
                p.mul_(40)
    ids = torch.full((1, 2048), 5)  # one repeated token: the decay sums add up coherently
    with torch.no_grad(), torch.autocast("cpu", dtype=dtype):
        logits, state = model(ids, mode="chunkwise", chunk_size=256, return_state=True)
        step_logits, step_state = model(ids[:, :1], mode="recurrent", state=state, return_state=True)
        parallel = model(ids[:, :1024], mode="parallel")
    assert torch.isfinite(logits).all() and torch.isfinite(step_logits).all() and torch.isfinite(parallel).all()
    assert all(s.dtype == torch.float32 and torch.isfinite(s).all() for s in step_state.layers)
    assert max(s.abs().max().item() for s in state.layers) > 65504  # fp16 would have overflowed here


@pytest.mark.parametrize("mode", ["parallel", "chunkwise"])
def test_gradients_flow(mode):
    model = make_tiny(torch.float64).train()
    ids = random_ids(2, 20)
    loss = torch.nn.functional.cross_entropy(model(ids[:, :-1], mode=mode, chunk_size=6).flatten(0, 1),
                                             ids[:, 1:].flatten())
    loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters()}
    assert all(g is not None and torch.isfinite(g).all() and g.abs().sum() > 0 for g in grads.values()), grads.keys()


def test_parallel_and_chunkwise_gradients_agree():
    model = make_tiny(torch.float64)
    ids = random_ids(1, 19)
    grads = {}
    for mode in ("parallel", "chunkwise"):
        model.zero_grad()
        model(ids, mode=mode, chunk_size=4).logsumexp(-1).sum().backward()
        grads[mode] = torch.cat([p.grad.flatten() for p in model.parameters()])
    assert relative_error(grads["chunkwise"], grads["parallel"]) < 1e-10


# -- registry, sizes, checkpoints ----------------------------------------------------------------------------

PAPER = {"retnet_1_3b": (24, 2048, 8), "retnet_2_7b": (32, 2560, 10), "retnet_6_7b": (32, 4096, 16)}


def test_every_registered_size_builds():
    names = zoo.list_models("retnet_*")
    assert set(names) == set(RETNET_SIZES)
    for name in names:
        info = zoo.model_info(name)
        assert info["family"] == "retnet" and info["params"] > 0 and info["num_classes"] is None
        with torch.device("meta"):
            model = zoo.create_model(name)
        attn = model.blocks[0].retention
        assert attn.key_dim * attn.heads == model.dim and attn.value_dim * attn.heads == 2 * model.dim
        assert model.ffn_dim == 2 * model.dim
        if name in PAPER:
            assert (model.depth, model.dim, model.heads) == PAPER[name]
            assert (attn.key_dim, attn.value_dim) == (256, 512)  # the paper's head dims
            assert model.lm_head.weight.device.type == "meta"
    assert zoo.model_info("retnet_1_3b")["params"] > 1.3e9
    small = zoo.create_model("retnet_small", vocab_size=500, depth=3, tie_embeddings=True)
    assert small.lm_head.weight.shape == (500, 256) and len(small.blocks) == 3
    assert small.lm_head.weight is small.embed.weight
    assert small.example_input(2).dtype == torch.long and small.example_input(2).shape == (2, 256)


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_checkpoint_roundtrip(tmp_path, tied):
    model = make_tiny(tie_embeddings=tied)
    ids = random_ids(2, 9)
    path = zoo.save_checkpoint(model, tmp_path / "retnet.safetensors", step=3)
    loaded = zoo.load(path).eval()
    again = zoo.create_model("retnet_tiny", pretrained=path).eval()
    with torch.no_grad():
        want = model(ids)
        assert torch.equal(loaded(ids), want) and torch.equal(again(ids), want)
    assert (loaded.lm_head.weight is loaded.embed.weight) == tied
    assert zoo.read_checkpoint_meta(path)["overrides"]["tie_embeddings"] is tied


def test_pruned_checkpoint_roundtrip(tmp_path):
    model = zoo.apply_plan(make_tiny(), {"remove": ["blocks.0.retention", "blocks.1.ffn"]})
    path = zoo.save_checkpoint(model, tmp_path / "pruned.safetensors")
    loaded = zoo.load(path).eval()
    ids = random_ids(1, 12)
    with torch.no_grad():
        assert torch.equal(loaded(ids, mode="recurrent"), model(ids, mode="recurrent"))
    assert isinstance(loaded.blocks[0].retention, torch.nn.Identity)


# -- depth units ---------------------------------------------------------------------------------------------


def test_depth_units_are_the_sublayers():
    model = make_tiny()
    units = zoo.depth_units(model, input_size=(16,))
    assert [u.name for u in units] == ["blocks.0.retention", "blocks.0.ffn", "blocks.1.retention", "blocks.1.ffn"]
    assert all(u.removable and u.in_shape == u.out_shape == (16, 64) and u.params > 0 for u in units)
    assert units[0].signature == units[2].signature  # equal sub-layers share latency entries


@pytest.mark.parametrize("unit", ["blocks.0.retention", "blocks.0.ffn", "blocks.1.retention", "blocks.1.ffn"])
def test_removing_any_unit_keeps_all_forms_working_and_equal(unit):
    model = zoo.remove_units(make_tiny(), [unit])
    assert unit not in [u.name for u in model.depth_unit_specs()]
    assert_forms_agree(model, random_ids(2, 21), 8, 1e-4)
    _, state = model(random_ids(2, 5), return_state=True)
    assert (state.layers[int(unit.split(".")[1])] is None) == unit.endswith("retention")
    assert model.generate(random_ids(1, 3), 4).shape == (1, 7)


def test_all_retention_removed_is_still_a_model():
    model = zoo.remove_units(make_tiny(), ["blocks.0.retention", "blocks.1.retention"])
    assert_forms_agree(model, random_ids(1, 10), 4, 1e-6)


# -- bad input -----------------------------------------------------------------------------------------------


def test_bad_token_ids_and_shapes():
    model = make_tiny()
    for bad in (torch.tensor([[0, VOCAB]]), torch.tensor([[-1, 3]])):
        with pytest.raises(RetNetInputError, match=r"Token ids must lie in \[0, 96\]"):
            model(bad)
    with pytest.raises(RetNetInputError, match="length >= 1"):
        model(torch.zeros(1, 0, dtype=torch.long))
    with pytest.raises(RetNetInputError, match=r"\[batch, length\]"):
        model(torch.zeros(5, dtype=torch.long))
    with pytest.raises(RetNetInputError, match="integer tensor"):
        model(torch.zeros(1, 5))
    with pytest.raises(RetNetInputError, match="length >= 1"):
        model.generate(torch.zeros(1, 0, dtype=torch.long), 3)


def test_bad_mode_and_chunk_size():
    model = make_tiny()
    ids = random_ids(1, 4)
    with pytest.raises(RetNetInputError, match="Unknown mode 'chunked'"):
        model(ids, mode="chunked")
    for chunk in (0, -3, 2.5, True):
        with pytest.raises(RetNetInputError, match="chunk_size must be an integer >= 1"):
            model(ids, mode="chunkwise", chunk_size=chunk)
    with pytest.raises(ValueError, match="chunk_size"):
        zoo.create_model("retnet_tiny", chunk_size=0)
    with pytest.raises(ValueError, match="decay"):
        zoo.create_model("retnet_tiny", decay="cosine")
    with pytest.raises(ValueError, match="divisible by heads"):
        zoo.create_model("retnet_tiny", heads=3)
    with pytest.raises(RetNetInputError, match="prefill"):
        model.generate(ids, 2, prefill="recurrent")
    with pytest.raises(RetNetInputError, match="top_k"):
        model.generate(ids, 2, top_k=0, do_sample=True)
    with pytest.raises(RetNetInputError, match="temperature"):
        model.generate(ids, 2, temperature=0.0, do_sample=True)


def test_state_from_another_model_or_batch_is_refused():
    model = make_tiny()
    ids = random_ids(2, 6)
    with torch.no_grad():
        _, other_size = zoo.create_model("retnet_tiny", vocab_size=VOCAB, dim=128, heads=2)(ids, return_state=True)
        _, deeper = zoo.create_model("retnet_tiny", vocab_size=VOCAB, depth=3)(ids, return_state=True)
        _, pruned = zoo.remove_units(model, ["blocks.1.retention"])(ids, return_state=True)
        _, own = model(ids, return_state=True)
    for state, batch in ((other_size, 2), (deeper, 2), (pruned, 2), (own, 1)):
        with pytest.raises(RetNetInputError, match="state does not fit this model"):
            model(ids[:batch], mode="recurrent", state=state)
    with pytest.raises(RetNetInputError, match="RetNetState"):
        model(ids, state=[None, None])
    assert isinstance(own, RetNetState) and model(ids, mode="recurrent", state=own).shape == (2, 6, VOCAB)


def test_no_positional_limit_in_the_recurrent_form():
    model = make_tiny()
    state = model.init_state(1)
    state.offset = 10**7  # far beyond any context length seen in training
    with torch.no_grad():
        logits = model(random_ids(1, 3), mode="recurrent", state=state)
    assert torch.isfinite(logits).all()


# -- optional CUDA fast path ---------------------------------------------------------------------------------


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("mode", ["chunkwise", "recurrent"])
def test_cuda_matches_parallel(mode):
    model = make_tiny(torch.float32, heads=4).cuda()
    ids = random_ids(2, 300).cuda()
    with torch.no_grad():
        ref, ref_state = model(ids, return_state=True)
        out, state = model(ids, mode=mode, chunk_size=64, return_state=True)
    assert relative_error(out, ref) <= 1e-3
    assert all(relative_error(a, b) <= 1e-3 for a, b in zip(state.layers, ref_state.layers))


# -- benchmark smoke test ------------------------------------------------------------------------------------
