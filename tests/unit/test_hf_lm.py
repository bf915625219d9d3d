"""Any transformers causal LM as a zoo model (zoo.models.hf_lm: ``create_model("hf/<folder>")``): the model's own
logits, its decoder layers offered only where the zoo's removal is proven equal to the layer zeroed, a plan applied
by the zoo's surgery, saved as our checkpoint and as a stock folder that AutoModelForCausalLM reloads with equal
logits. Tiny random models of the families of test_hf_causal, saved here (no download)."""

from __future__ import annotations

import copy
import itertools
import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

import zoo  # noqa: E402
from zoo.errors import ZooError  # noqa: E402
from zoo.jobs.runs import fingerprint, with_inputs  # noqa: E402
from zoo.models import hf_lm  # noqa: E402

from .test_healing import explicit_maps  # noqa: E402
from .test_hf_causal import CONFIGS, build  # noqa: E402

TOKENS = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(5))
REFUSED = {"post-norm opt": "differ"}  # LN(x + f(x)): removing it is not its branch contributing nothing
CHANGES = {"post-norm opt": ("opt", {"do_layer_norm_before": False})}


def saved(family: str, folder) -> torch.nn.Module:
    family, changes = CHANGES.get(family, (family, {}))
    model = build(family, **changes)
    model.save_pretrained(folder)
    return model


def logits_of(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model.eval()(TOKENS)


def zeroed_logits(model: zoo.models.hf_lm.HFCausalLM, indices: list[int]) -> torch.Tensor:
    """The model with every parameter of those decoder layers zeroed: what their removal must compute."""
    twin = copy.deepcopy(model)
    layers = twin.get_submodule(twin.layers_path)
    with torch.no_grad():
        for index in indices:
            for param in layers[index].parameters():
                param.zero_()
    return logits_of(twin)


def zeroed_module(model: torch.nn.Module, name: str) -> torch.Tensor:
    twin = copy.deepcopy(model)
    with torch.no_grad():
        for param in twin.get_submodule(name).parameters():
            param.zero_()
    return logits_of(twin)


def close(a: torch.Tensor, b: torch.Tensor, tolerance: float = 1e-5) -> bool:
    return float((a - b).abs().max()) <= tolerance * float(b.abs().max())


@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_a_saved_model_prunes_as_proven_and_ships_as_a_stock_folder(family, tmp_path):
    """Falcon's layers return a tuple: removed, they pass their stream on in it. OPT's MLP is two Linears in the
    layer, no sub-layer; its attention is one."""
    own = saved(family, tmp_path / f"{family}.v1.5")  # dots in the folder's name are the path's, not a tag
    model = zoo.create_model(f"hf/{tmp_path / f'{family}.v1.5'}", pretrained=True)
    with torch.no_grad():
        assert torch.equal(logits_of(model), own(input_ids=TOKENS, use_cache=False).logits)  # its weights
    units = zoo.depth_units(model)
    blocks = [u.name for u in units if u.kind == "block"]
    assert blocks == [f"{model.layers_path}.{i}" for i in range(4)] and all(u.removable for u in units)
    pruned = zoo.apply_plan(model, {"remove": [blocks[1], blocks[3]]}, inplace=False)
    assert close(logits_of(pruned), zeroed_logits(model, [1, 3]))  # the removal is the layers contributing nothing
    for sub in [u.name for u in units if u.kind == "sublayer"][:3]:  # each sub-layer's removal: its branch zeroed
        assert close(logits_of(zoo.apply_plan(model, {"remove": [sub]}, inplace=False)), zeroed_module(model, sub))
    report = zoo.export(pruned, tmp_path / "stock", format="hf")
    assert report.passed and report.max_rel_diff <= 1e-5
    stock = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "stock").eval()
    assert stock.config.num_hidden_layers == 2
    with torch.no_grad():
        assert close(stock(input_ids=TOKENS, use_cache=False).logits, logits_of(pruned))
    reloaded = zoo.load(zoo.save_checkpoint(pruned, tmp_path / "pruned.safetensors"))
    assert reloaded.removed_layers() == [1, 3] and torch.equal(logits_of(reloaded), logits_of(pruned))


@pytest.mark.parametrize("family", sorted(REFUSED))
def test_a_post_norm_layer_is_kept_with_why_and_a_model_with_nothing_removable_is_refused(family, tmp_path):
    """LN(x + f(x)): the layer is not removable, its attention is (zeros from it are the branch zeroed)."""
    saved(family, tmp_path / "model")
    model = zoo.create_model(f"hf/{tmp_path / 'model'}", pretrained=True)
    units = {u.name: u for u in zoo.depth_units(model)}
    assert not any(u.removable for u in units.values() if u.kind == "block")
    assert all(REFUSED[family] in why for why in model.refusals().values()) and len(model.refusals()) == 4
    offered = [n for n, u in units.items() if u.kind == "sublayer"]
    assert offered and all(n.endswith(".self_attn") for n in offered)
    for name in offered[:2]:
        assert close(logits_of(zoo.apply_plan(model, {"remove": [name]}, inplace=False)), zeroed_module(model, name))
    with pytest.raises(ZooError, match="none of its decoder layers is removable") as refused:
        zoo.create_model(f"hf/{tmp_path / 'model'}", pretrained=True, sublayers=False)
    assert REFUSED[family] in str(refused.value)


def test_the_packaged_config_builds_with_overrides_and_every_removal_is_its_layer_zeroed():
    model = zoo.create_model("hf/tiny_llama", num_hidden_layers=3, vocab_size=64)
    assert model.lm.config.num_hidden_layers == 3 and model.vocab_size == 64 and model.task == "language_model"
    for index in range(3):
        pruned = zoo.apply_plan(model, {"remove": [f"{model.layers_path}.{index}"]}, inplace=False)
        assert close(logits_of(pruned), zeroed_logits(model, [index])), index
    everything = zoo.apply_plan(model, {"remove": [u.name for u in zoo.depth_units(model)]}, inplace=False)
    with pytest.raises(zoo.errors.PlanError, match="no network is left"):
        everything.stock_model()


def test_a_folder_is_fingerprinted_by_its_files(tmp_path):
    """Results keyed by a run's config (a trained baseline) follow the folder's contents, not only its path."""
    saved("llama", tmp_path / "m")
    config = {"model": {"name": f"hf/{tmp_path / 'm'}"}}
    before = fingerprint(with_inputs(config))
    settings = json.loads((tmp_path / "m" / "config.json").read_text())
    (tmp_path / "m" / "config.json").write_text(json.dumps({**settings, "rms_norm_eps": 1e-5}))
    assert fingerprint(with_inputs(config)) != before
    assert with_inputs({"model": {"name": "mobilenetv2_050"}})["inputs"] == {}


def test_a_context_longer_than_the_positions_and_a_folder_without_config_are_refused(tmp_path):
    entry = zoo.models.registry.get_entry("hf/tiny_llama")
    with pytest.raises(ZooError, match="data.seq_len=512 is longer than the 256 positions"):
        entry.precheck({}, (512,))
    entry.precheck({}, (256,))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ZooError, match="has no config.json"):
        zoo.create_model(f"hf/{tmp_path / 'empty'}")


@pytest.mark.parametrize("family", ["llama", "gemma2", "gpt2", "mixtral"])
def test_a_decode_step_after_the_cached_context_is_the_next_tokens_logits_also_with_layers_removed(family, tmp_path):
    """The decode workload's step (the model's own KV cache of `context` tokens, prefilled by the network that steps):
    its logits are those of the whole sequence's last token, every step starts from the same cache, and a network
    whose first layer is removed (its slot filled from a kept layer's) still steps right."""
    saved(family, tmp_path / "m")
    model = zoo.create_model(f"hf/{tmp_path / 'm'}", pretrained=True)
    context = 8  # beyond gemma2's sliding window of 4
    token = TOKENS[:, :1]
    for net in (model, zoo.apply_plan(model, {"remove": [f"{model.layers_path}.0"]}, inplace=False)):
        inputs = net.decode_inputs(2, context)
        with torch.no_grad():
            first, again = net(token, **inputs), net(token, **inputs)
            whole = net(torch.cat([inputs["state"].prompt, token], dim=1))[:, -1:]
        assert torch.equal(first, again) and close(first, whole), family


def test_a_decode_state_shared_by_networks_of_other_removals_holds_the_context_in_every_layer():
    """A table's networks share one decode state: prefilled by a network without layers 0 and 2, every layer's slot
    still holds the context, so the baseline stepping after it attends over as many tokens as alone."""
    model = zoo.create_model("hf/tiny_llama", num_hidden_layers=4)
    pruned = zoo.apply_plan(model, {"remove": [f"{model.layers_path}.0", f"{model.layers_path}.2"]}, inplace=False)
    inputs = pruned.decode_inputs(2, 12)
    with torch.no_grad():
        pruned(TOKENS[:, :1], **inputs)
        model(TOKENS[:, :1], **inputs)
    cache = inputs["state"].cache
    assert [cache.get_seq_length(i) for i in range(4)] == [12] * 4


def test_a_decode_state_made_by_any_whole_layer_removal_holds_what_the_unpruned_model_holds_in_every_slot():
    """Gemma-2 alternates sliding-window and full-attention layers, and sizes each kind's attention mask from one
    slot of that kind: for every set of whole layers removed, the state the pruned network makes (its own step checked
    against the whole sequence when made) holds, slot by slot, as many tokens as the unpruned model's own prefill, so a
    removed full-attention layer's slot is not filled from a sliding window (found by the declared LM study: every
    plan without the first full-attention layer had no decode step)."""
    model = zoo.create_model("hf/tiny_gemma2", num_hidden_layers=4)
    context = 24  # beyond the packaged config's sliding window of 16

    def held(net: torch.nn.Module) -> list[tuple[int, ...]]:
        cache = net.decode_inputs(2, context)["state"].cache
        return [(*layer.keys.shape, getattr(layer, "cumulative_length", context)) for layer in cache.layers]

    unpruned = held(model)
    assert len({shape[2] for shape in unpruned}) == 2  # both kinds of slot, holding different lengths
    for size in (1, 2, 3):
        for removed in itertools.combinations(range(4), size):
            plan = {"remove": [f"{model.layers_path}.{i}" for i in removed]}
            assert held(zoo.apply_plan(model, plan, inplace=False)) == unpruned, removed


DOOR = ["data=bytes", "data.seq_len=16", "logger=none", "trainer.progress=false"]


@pytest.mark.parametrize("case, said", [
    ("vit", "not a causal language model"),
    ("no config", "has no config.json"),
    ("vocabulary", "ids from 64 up would index no row"),
    ("context", "data.seq_len=512 is longer than the 64 positions"),
])
def test_prune_py_refuses_what_a_transformers_model_cannot_do_in_one_line_before_any_work(case, said, tmp_path):
    """Exit 2, one line with what is allowed, before the untrained network's table or any baseline."""
    from ..helpers import prune_in_process

    folder = tmp_path / "model"
    folder.mkdir()
    extra = ["model.pretrained=true"]
    if case == "vit":
        transformers.ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                               intermediate_size=64).save_pretrained(folder)
    elif case in ("vocabulary", "context"):
        saved("llama", folder)  # 64 token ids, 64 positions; the bytes data has 256
        extra += ["data.seq_len=512"] if case == "context" else []
        if case == "context":
            extra += ["+model.overrides.vocab_size=256", "model.pretrained=false"]
    out = prune_in_process("model=hf", f"model.name={folder}", *DOOR, *extra, base=tmp_path)
    assert out.returncode == 2, out.stdout[-2000:]
    assert said in out.stdout and "Traceback" not in out.stdout, out.stdout[-2000:]
    assert not (tmp_path / "outputs").exists() and not (tmp_path / "cache").exists()


def test_a_lora_fine_tune_of_a_model_that_is_not_a_transformers_model_is_refused_before_any_work(tmp_path):
    from ..helpers import prune_in_process

    out = prune_in_process("model=mobilenetv2_035", "data.image_size=16", "finetune.lora_rank=4", "logger=none",
                           base=tmp_path)
    assert out.returncode == 2 and "fine-tunes a transformers model's linear layers through peft" in out.stdout
    assert not (tmp_path / "outputs").exists()


def test_a_decoder_layer_called_again_on_its_captured_decode_inputs_sees_the_same_cache():
    """What a table does with a segment in the decode workload (timing it, its peak memory): the layer is called
    again and again on what it received in a step; the cache must not grow between calls (Gemma-2's eager attention
    adds a mask sized for the context: it would not even run)."""
    model = zoo.create_model("hf/tiny_gemma2").eval()
    seen = {}
    layer = model.get_submodule(f"{model.layers_path}.1")
    handle = layer.register_forward_pre_hook(lambda m, a, k: seen.update(call=(a, k)), with_kwargs=True)  # the last
    # call: the step's (the first is the state's prefill)
    with torch.no_grad():
        model(TOKENS[:, :1], **model.decode_inputs(2, 24))
        handle.remove()
        args, kwargs = seen["call"]
        outputs = [layer(*args, **kwargs) for _ in range(3)]
    assert all(torch.equal(outputs[0], out) for out in outputs[1:])


def test_a_sub_layer_plan_reloads_from_its_checkpoint_and_is_refused_as_a_stock_folder(tmp_path):
    model = zoo.create_model("hf/tiny_qwen2", num_hidden_layers=3)
    plan = {"remove": [f"{model.layers_path}.0.mlp", f"{model.layers_path}.2.self_attn"]}
    pruned = zoo.apply_plan(model, plan, inplace=False)
    reloaded = zoo.load(zoo.save_checkpoint(pruned, tmp_path / "pruned.safetensors"))
    assert torch.equal(logits_of(reloaded), logits_of(pruned))
    with pytest.raises(zoo.errors.ExportError, match="no stock config"):
        zoo.export(pruned, tmp_path / "stock", format="hf")
    assert not (tmp_path / "stock").exists()


def test_a_decode_step_that_is_not_the_next_tokens_logits_is_refused(tmp_path):
    """A model whose step after cached tokens is not the whole sequence's last token has no decode workload (refused
    with why): here Llama with its cached keys perturbed after the prefill (what a cache a model does not fill as
    its step reads it would give); the same model unperturbed steps."""
    model = zoo.create_model("hf/tiny_llama", num_hidden_layers=2)
    assert model.decode_inputs(2, 8)["state"].context == 8
    original = hf_lm._held

    def perturbed(layer):
        layer.keys = layer.keys + 1.0
        return original(layer)

    hf_lm._held = perturbed
    try:
        with pytest.raises(ZooError, match="not the next token's logits"):
            model.decode_inputs(2, 8)
    finally:
        hf_lm._held = original


def test_a_transformers_decoder_heals_sub_layers_and_layers_where_its_stream_is_their_sum():
    """Llama's decoder layer is its input plus its attention and MLP outputs: a removed MLP heals into the same
    layer's o_proj, a removed layer into the MLP before it (down_proj), the fused model computing the explicit maps'
    logits. Gemma-2 normalises each branch after it (a sandwich norm): neither a sub-layer nor a layer has an op that
    reaches the stream by a per-channel factor, so both are left unhealed with why."""
    generator = torch.Generator().manual_seed(3)
    for family in ("tiny_llama", "tiny_gemma2"):
        torch.manual_seed(0)
        model = zoo.create_model(f"hf/{family}").eval()
        layers = [u.name for u in model.depth_unit_specs() if u.kind == "block"]
        calibration = [torch.randint(0, model.lm.config.vocab_size, (8, 32), generator=generator) for _ in range(4)]
        plan = {"remove": [f"{layers[1]}.mlp", layers[3]]}
        healed = zoo.apply_plan(model, plan, inplace=False, heal="linear", calibration=calibration, strict=False)
        if family == "tiny_gemma2":
            assert healed.zoo_heal == []
            assert "not its input plus its sub-layers" in healed.zoo_unhealed[plan["remove"][0]]
            assert "no Linear or full Conv" in healed.zoo_unhealed[layers[3]]
            continue
        assert healed.zoo_unhealed == {}
        assert [(p["gap"], p["into"]) for p in healed.zoo_heal] == [
            ([f"{layers[1]}.mlp"], f"{layers[1]}.self_attn.o_proj"), ([layers[3]], f"{layers[2]}.mlp.down_proj")]
        assert all(p["error_healed"] < p["error_unhealed"] for p in healed.zoo_heal)
        with torch.no_grad():
            ours, theirs = logits_of(healed), logits_of(explicit_maps(model, plan, calibration))
        assert close(ours, theirs, 1e-4)
