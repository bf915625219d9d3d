"""Any transformers causal LM's decoder layers (zoo.models.hf_causal): found by structure, each proven (its removal
equals the layer with every parameter zeroed), removed as a stock config says it, and saved as a folder that
AutoModelForCausalLM loads with equal logits. Tiny random configs of nine families, built here (no download)."""

from __future__ import annotations

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")

from zoo.errors import PlanError, ZooError  # noqa: E402
from zoo.models import hf_causal  # noqa: E402

SMALL = {"vocab_size": 64, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 4,
         "num_attention_heads": 4, "max_position_embeddings": 64, "bos_token_id": 0, "eos_token_id": 0}
CONFIGS = {
    "llama": lambda: transformers.LlamaConfig(**SMALL, num_key_value_heads=2),
    "qwen2": lambda: transformers.Qwen2Config(**SMALL, num_key_value_heads=2),
    "gemma2": lambda: transformers.Gemma2Config(**SMALL, num_key_value_heads=2, head_dim=8, sliding_window=4),
    "phi3": lambda: transformers.Phi3Config(**SMALL, pad_token_id=0),
    "mixtral": lambda: transformers.MixtralConfig(**SMALL, num_key_value_heads=2, num_local_experts=4),
    "gpt_neox": lambda: transformers.GPTNeoXConfig(**SMALL),
    "gpt2": lambda: transformers.GPT2Config(vocab_size=64, n_embd=32, n_layer=4, n_head=4, n_positions=64,
                                            bos_token_id=0, eos_token_id=0),
    "falcon": lambda: transformers.FalconConfig(vocab_size=64, hidden_size=64, num_hidden_layers=4,
                                                num_attention_heads=4, new_decoder_architecture=True, num_kv_heads=2,
                                                bos_token_id=0, eos_token_id=0),  # its layers return a tuple
    "opt": lambda: transformers.OPTConfig(vocab_size=64, hidden_size=32, ffn_dim=64, num_hidden_layers=4,
                                          num_attention_heads=4, max_position_embeddings=64, word_embed_proj_dim=32,
                                          bos_token_id=0, eos_token_id=0, pad_token_id=1),
}


def build(family: str, **changes):
    torch.manual_seed(0)
    config = CONFIGS[family]()
    for key, value in changes.items():
        setattr(config, key, value)
    return transformers.AutoModelForCausalLM.from_config(config).eval()


def logits(model, seed: int = 3) -> torch.Tensor:
    tokens = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        return model(input_ids=tokens, use_cache=False).logits


@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_every_layer_is_proven_and_a_whole_layer_plan_saves_as_a_stock_folder(family, tmp_path):
    model = build(family)
    path, layers = hf_causal.decoder_layers(model)
    proofs = hf_causal.prove_layers(model)
    whole = [p for p in proofs if p.kind == "layer"]
    assert [p.name for p in whole] == [f"{path}.{i}" for i in range(4)] and all(p.removable for p in whole), proofs
    pruned = hf_causal.remove_layers(model, [1, 2], proofs)
    zeroed = copy.deepcopy(model)  # what the proof says the removal is: those layers contributing nothing
    with torch.no_grad():
        for index in (1, 2):
            for param in hf_causal.decoder_layers(zeroed)[1][index].parameters():
                param.zero_()
    torch.testing.assert_close(logits(pruned), logits(zeroed), rtol=1e-5, atol=1e-5)
    assert len(hf_causal.decoder_layers(pruned)[1]) == 2 and len(layers) == 4  # the model itself is untouched
    folder, _ = hf_causal.save_stock(pruned, tmp_path / "stock")
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    assert reloaded.config.num_hidden_layers == 2
    torch.testing.assert_close(logits(reloaded), logits(pruned), rtol=1e-5, atol=1e-5)
    kinds = getattr(model.config, "layer_types", None)
    if kinds is not None:  # a per-layer list keeps the kept layers' entries
        assert reloaded.config.layer_types == [kinds[0], kinds[3]]


def test_a_post_norm_layer_is_refused_with_why():
    model = build("opt", do_layer_norm_before=False)  # LN(x + f(x)): removing it is not f contributing nothing
    proofs = [p for p in hf_causal.prove_layers(model) if p.kind == "layer"]
    assert not any(p.removable for p in proofs) and all("not the layer contributing nothing" in p.reason
                                                        for p in proofs)
    with pytest.raises(PlanError, match="cannot be removed.*removable layers: none"):
        hf_causal.remove_layers(model, [1], proofs)
    with pytest.raises(PlanError, match="leaves no network"):
        hf_causal.remove_layers(build("llama"), range(4))


def test_a_removal_its_config_does_not_say_is_refused():
    """remove_layers checks its result against the layers zeroed: a per-layer list left uncut (Gemma-2's sliding and
    full layers with a 4-token window) would make the kept layers attend differently."""
    model = build("gemma2")
    pruned = hf_causal.remove_layers(model, [1])  # sliding, sliding, full
    assert pruned.config.layer_types == ["sliding_attention", "sliding_attention", "full_attention"]
    pruned.config.layer_types = list(reversed(pruned.config.layer_types))  # the wrong layers slide
    with pytest.raises(ZooError, match="do not say the removal"):
        hf_causal.check_removal(model, pruned, [1])


def test_a_folder_that_does_not_reload_as_the_model_is_not_written(tmp_path):
    """State a folder does not carry (a non-persistent buffer changed in memory) makes the reloaded logits differ:
    nothing is written."""
    pruned = hf_causal.remove_layers(build("llama"), [2])
    with torch.no_grad():
        pruned.model.rotary_emb.inv_freq.mul_(3.0)  # recomputed from the config on load
    with pytest.raises(ZooError, match="logits differ"):
        hf_causal.save_stock(pruned, tmp_path / "stock")
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_attention_and_mlp_sublayers_are_proven_and_removed_to_zeros(family, tmp_path):
    """Each layer's children with a weight matrix whose output is shaped like its input are sub-layers; removing one
    (zeros in its output's structure, nothing computed) equals its parameters zeroed. OPT's MLP is two Linears in the
    layer itself, not one module: refused, with why. A stock folder cannot say a removed sub-layer: refused."""
    model = build(family)
    path, layers = hf_causal.decoder_layers(model)
    subs = [p for p in hf_causal.prove_layers(model) if p.kind == "sublayer" and p.index == 1]
    offered = [p.name for p in subs if p.removable]
    assert len(offered) == 2 if family != "opt" else offered == [f"{path}.1.self_attn"], subs
    if family == "opt":
        assert {p.reason for p in subs if not p.removable} == {"its output is not shaped like its input"}
    pruned = hf_causal.remove_sublayers(model, offered[-1:])
    zeroed = copy.deepcopy(model)
    with torch.no_grad():
        for param in zeroed.get_submodule(offered[-1]).parameters():
            param.zero_()
    assert isinstance(pruned.get_submodule(offered[-1]), hf_causal.ZeroOutput)
    torch.testing.assert_close(logits(pruned), logits(zeroed), rtol=1e-5, atol=1e-5)
    assert float((logits(pruned) - logits(model)).abs().max()) > 1e-4  # the sub-layer mattered
    with pytest.raises(ZooError, match="no stock config"):
        hf_causal.save_stock(pruned, tmp_path / "stock")
    with pytest.raises(PlanError, match="cannot be removed"):
        hf_causal.remove_sublayers(model, [f"{path}.1"])


def test_load_takes_a_causal_lm_folder_and_refuses_what_is_not_one(tmp_path, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # (read at import: the library's constant too, so nothing is fetched)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    model = build("llama")
    model.save_pretrained(tmp_path / "llama")
    loaded = hf_causal.load(tmp_path / "llama")
    torch.testing.assert_close(logits(loaded), logits(model))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ZooError, match="has no config.json"):
        hf_causal.load(tmp_path / "empty")
    transformers.T5Config(vocab_size=64, d_model=32, num_layers=1).save_pretrained(tmp_path / "t5")
    with pytest.raises(ZooError, match="'t5' model, not a causal language model"):
        hf_causal.load(tmp_path / "t5")
    config = transformers.LlamaConfig(**SMALL)
    config.auto_map = {"AutoModelForCausalLM": "modeling_mine.MyModel"}
    config.save_pretrained(tmp_path / "custom")
    with pytest.raises(ZooError, match="trust_remote_code=True"):
        hf_causal.load(tmp_path / "custom")
    with pytest.raises(ZooError, match="HF_HUB_OFFLINE=1"):
        hf_causal.load("no-such-user/no-such-model")


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_block_influence_is_shortgpts_on_a_transformers_model(family):
    """The peer check: zoo's Block Influence of each decoder layer (1 - mean cosine of its input and output, from
    hooks) equals ShortGPT's definition computed from transformers' own ``output_hidden_states`` on the same
    batches. (For the last layer transformers returns the stream after the final norm, so the two definitions part
    there; the layers before it are compared.)"""
    from zoo.pruning.importance import block_influence

    model = build(family)
    path, layers = hf_causal.decoder_layers(model)
    batches = [(torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(s)), None) for s in (5, 6)]
    ours = block_influence(model, [f"{path}.{i}" for i in range(len(layers))], batches)
    cosines: list[list[torch.Tensor]] = [[] for _ in layers]
    with torch.no_grad():
        for tokens, _ in batches:
            states = model(input_ids=tokens, output_hidden_states=True).hidden_states
            for i in range(len(layers)):
                cosines[i].append(torch.nn.functional.cosine_similarity(states[i], states[i + 1], dim=-1).flatten())
    shortgpt = [1.0 - float(torch.cat(c).mean()) for c in cosines]
    for i in range(len(layers) - 1):
        assert ours[f"{path}.{i}"] == pytest.approx(shortgpt[i], abs=1e-6)
    assert len(set(round(v, 4) for v in ours.values())) > 1  # the layers differ: the comparison can fail


def word_tokenizer(words: int):
    """A word-level tokenizer of `words` tokens, built here (tokenizers, no download)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, **{f"w{i}": i + 1 for i in range(words - 1)}}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]")


def test_text_inputs_the_model_cannot_take_are_refused_and_the_tokenizer_travels(tmp_path):
    model = build("llama")
    hf_causal.check_text_inputs(model, word_tokenizer(64), context=64)
    with pytest.raises(ZooError, match="tokenizer has 65 tokens but the model embeds 64"):
        hf_causal.check_text_inputs(model, word_tokenizer(65))
    with pytest.raises(ZooError, match="context of 65 tokens is longer than the model's 64 positions"):
        hf_causal.check_text_inputs(model, context=65)
    folder, _ = hf_causal.save_stock(hf_causal.remove_layers(model, [3]), tmp_path / "stock", word_tokenizer(64))
    again = transformers.AutoTokenizer.from_pretrained(folder)
    assert again("w1 w2 w62 w99")["input_ids"] == [2, 3, 63, 0]  # the same ids: the unknown word last
