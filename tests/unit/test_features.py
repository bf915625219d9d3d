"""timm's model surface on every family: features_only backbones, forward_intermediates, gradient checkpointing
(identical outputs and gradients, less activation memory), RetNet hidden states, the training memory report."""

from __future__ import annotations

import pytest
import timm
import torch
from safetensors.torch import save_file

import zoo
from zoo.errors import ModelOptionError
from zoo.models.features import take_indices

CNNS = [f.reference for f in zoo.list_families(capability="features")]  # timm's feature-extraction interface
TIMM_CNNS = [f.reference for f in zoo.list_families(capability="features") if f.has("timm")]  # compared with timm
X = (2, 3, 96, 96)


@pytest.fixture(scope="module")
def timm_weights(tmp_path_factory):
    """A timm model per family with random weights (random BatchNorm statistics), saved in timm's format."""
    folder = tmp_path_factory.mktemp("weights")
    files = {}
    for name in TIMM_CNNS:
        torch.manual_seed(0)
        model = timm.create_model(name).eval()
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.normal_(0, 0.1)
                m.running_var.uniform_(0.5, 1.5)
                m.weight.data.uniform_(0.5, 1.5)
        files[name] = folder / f"{name}.safetensors"
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(files[name]))
    return files


@pytest.mark.parametrize("name", TIMM_CNNS)
def test_features_only_equals_timms(name, timm_weights):
    file = str(timm_weights[name])
    theirs = timm.create_model(name, features_only=True, pretrained=True,
                               pretrained_cfg_overlay={"file": file}).eval()
    ours = zoo.create_model(name, features_only=True, pretrained=file).eval()
    assert ours.feature_info.channels() == theirs.feature_info.channels()
    assert ours.feature_info.reduction() == theirs.feature_info.reduction()
    x = torch.randn(*X)
    with torch.no_grad():
        for a, b in zip(ours(x), theirs(x), strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    picked = zoo.create_model(name, features_only=True, out_indices=(-2, -1), pretrained=file).eval()
    assert picked.feature_info.channels() == theirs.feature_info.channels()[-2:]


@pytest.mark.parametrize("name", TIMM_CNNS)
def test_forward_intermediates_equal_timms(name, timm_weights):
    theirs = timm.create_model(name).eval()
    ours = zoo.create_model(name, pretrained=str(timm_weights[name])).eval()
    theirs.load_state_dict(ours.state_dict())
    x = torch.randn(*X)
    with torch.no_grad():
        for indices in (None, 2, [0, -1]):
            final_a, inter_a = ours.forward_intermediates(x, indices=indices, norm=True)
            final_b, inter_b = theirs.forward_intermediates(x, indices=indices, norm=True)
            torch.testing.assert_close(final_a, final_b, rtol=0, atol=0)
            assert len(inter_a) == len(inter_b)
            for a, b in zip(inter_a, inter_b):
                torch.testing.assert_close(a, b, rtol=0, atol=0)
        head = ours.forward_head(ours.forward_intermediates(x)[0])
        torch.testing.assert_close(head, ours(x), rtol=0, atol=0)


@pytest.mark.parametrize("name", CNNS)
def test_a_pruned_network_is_a_drop_in_backbone(name):
    model = zoo.create_model(name).eval()
    removable = [u.name for u in zoo.depth_units(model, input_size=X[1:]) if u.kind == "block" and u.removable]
    pruned = zoo.apply_plan(model, {"remove": removable[:3]}, inplace=False)
    x = torch.randn(*X)
    with torch.no_grad():
        full = [f.shape for f in zoo.models.features.features_only(model)(x)]
        assert [f.shape for f in zoo.models.features.features_only(pruned)(x)] == full
        assert [f.shape for f in pruned.forward_intermediates(x, intermediates_only=True)] == [
            f.shape for f in model.forward_intermediates(x, intermediates_only=True)]


def saved_activation_bytes(model: torch.nn.Module, x: torch.Tensor) -> tuple[int, torch.Tensor]:
    """Bytes of the distinct storages autograd keeps for the backward pass at the end of the forward pass
    (activation memory, counted exactly on any device), and the loss."""
    storages: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        if not isinstance(tensor, torch.nn.Parameter):
            storages.update(zoo.models.features.saved_storage_bytes(tensor))
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(x).float().pow(2).mean()
    return sum(storages.values()), loss


@pytest.mark.parametrize("name", CNNS)
def test_grad_checkpointing_gives_identical_outputs_and_gradients_with_less_memory(name):
    torch.manual_seed(0)
    plain = zoo.create_model(name, num_classes=10).train()
    checkpointed = zoo.create_model(name, num_classes=10).train()
    checkpointed.load_state_dict(plain.state_dict())
    checkpointed.set_grad_checkpointing(True)
    x = torch.randn(4, 3, 64, 64)
    plain_bytes, plain_loss = saved_activation_bytes(plain, x)
    ckpt_bytes, ckpt_loss = saved_activation_bytes(checkpointed, x)
    torch.testing.assert_close(ckpt_loss, plain_loss, rtol=0, atol=0)
    plain_loss.backward()
    ckpt_loss.backward()
    for (key, a), b in zip(plain.named_parameters(), checkpointed.parameters()):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-6, atol=1e-7, msg=key)
    assert ckpt_bytes < 0.6 * plain_bytes, (ckpt_bytes, plain_bytes)  # at least 40 % less activation memory


def test_retnet_grad_checkpointing_and_hidden_states():
    torch.manual_seed(0)
    plain = zoo.create_model("retnet_tiny").train()
    checkpointed = zoo.create_model("retnet_tiny").train()
    checkpointed.load_state_dict(plain.state_dict())
    checkpointed.set_grad_checkpointing(True)
    tokens = torch.randint(0, 256, (2, 32))
    plain_bytes, plain_loss = saved_activation_bytes(plain, tokens)
    ckpt_bytes, ckpt_loss = saved_activation_bytes(checkpointed, tokens)
    torch.testing.assert_close(ckpt_loss, plain_loss, rtol=0, atol=0)
    plain_loss.backward()
    ckpt_loss.backward()
    for a, b in zip(plain.parameters(), checkpointed.parameters()):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-6, atol=1e-7)
    assert ckpt_bytes < plain_bytes
    model = plain.eval()
    with torch.no_grad():
        hidden = model.hidden_states(tokens)
        assert len(hidden) == model.depth + 1 and all(h.shape == (2, 32, model.dim) for h in hidden)
        torch.testing.assert_close(model.lm_head(model.norm(hidden[-1])), model(tokens), rtol=0, atol=0)
        for mode in ("chunkwise", "recurrent"):
            torch.testing.assert_close(model.hidden_states(tokens, mode=mode, chunk_size=8)[-1], hidden[-1],
                                       rtol=1e-5, atol=1e-5)


def test_indices_follow_timms_convention():
    assert take_indices(5, None) == [0, 1, 2, 3, 4] and take_indices(5, 2) == [3, 4] and take_indices(5, [0, -1]) == [
        0, 4]
    with pytest.raises(zoo.ZooError, match="out of range"):
        take_indices(5, [7])
    with pytest.raises(zoo.ZooError, match="no feature stages"):
        zoo.create_model("retnet_tiny", features_only=True)


def test_forward_intermediates_while_training_with_checkpointing():
    model = zoo.create_model("tresnet_m", num_classes=10).train()
    x = torch.randn(2, 3, 64, 64)
    expected = [f.shape for f in model.forward_intermediates(x, intermediates_only=True)]
    model.set_grad_checkpointing(True)
    assert [f.shape for f in model.forward_intermediates(x, intermediates_only=True)] == expected


def test_trainer_grad_checkpointing_setting(tmp_path):
    from omegaconf import OmegaConf

    from zoo.jobs.train_config import TrainConfig
    from zoo.training import build_loaders, fit

    cfg = OmegaConf.structured(TrainConfig)
    cfg.data.image_size, cfg.data.batch_size = 16, 16
    cfg.trainer.max_epochs, cfg.trainer.limit_train_batches, cfg.trainer.progress = 1, 2, False
    cfg.trainer.grad_checkpointing, cfg.trainer.save_checkpoints = True, False
    model = zoo.create_model("mobilenetv2_035", num_classes=10)
    result = fit(model, build_loaders(cfg.data), cfg.optim, cfg.trainer)
    assert model.grad_checkpointing and result.memory["peak_rss_mb"] > 0


# ------------------------------------------------------------------------ review findings, kept fixed
@pytest.mark.parametrize("name", CNNS)
def test_models_stay_scriptable(name):
    model = zoo.create_model(name).eval()
    scripted = torch.jit.script(model)
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(scripted(x), model(x), rtol=0, atol=0)


def test_intermediates_in_forward_order_once_and_stop_early_as_timm():
    torch.manual_seed(0)
    ours = zoo.create_model("mobilenetv2_050").eval()
    theirs = timm.create_model("mobilenetv2_050").eval()
    theirs.load_state_dict(ours.state_dict())
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        a = ours.forward_intermediates(x, indices=[3, 1, 1], intermediates_only=True)
        assert [t.shape[1] for t in a] == [16, 48]  # forward order, each once
        final_a, inter_a = ours.forward_intermediates(x, indices=[1], stop_early=True)
        final_b, inter_b = theirs.forward_intermediates(x, indices=[1], stop_early=True)
        torch.testing.assert_close(final_a, final_b, rtol=0, atol=0)
    assert zoo.create_model("tresnet_m", features_only=True, out_indices=2).feature_info.channels() == [1024, 2048]
    with pytest.raises(zoo.ZooError, match="out_indices is for the backbone form"):
        zoo.create_model("tresnet_m", out_indices=(1, 2))
    assert zoo.create_model("tresnet_m").feature_info[0]["reduction"] == 4  # conv1 runs after SpaceToDepth(4)


def test_the_trainer_uses_the_configured_share(tmp_path):
    from omegaconf import OmegaConf

    from zoo.jobs.train_config import TrainConfig
    from zoo.training import build_loaders, fit

    cfg = OmegaConf.structured(TrainConfig)
    cfg.data.image_size, cfg.data.batch_size = 16, 16
    cfg.trainer.max_epochs, cfg.trainer.limit_train_batches, cfg.trainer.progress = 1, 1, False
    cfg.trainer.grad_checkpointing, cfg.trainer.save_checkpoints = 0.5, False
    model = zoo.create_model("mobilenetv2_035", num_classes=10)
    result = fit(model, build_loaders(cfg.data), cfg.optim, cfg.trainer)
    assert model.grad_checkpointing == 0.5 and result.memory["scope"] in ("training", "process")
    model.set_grad_checkpointing(0)
    assert model.grad_checkpointing is False  # 0 is off, as in timm


def test_the_cpu_peak_covers_the_training_not_the_process():
    from zoo.training.resources import peak_rss_mb, reset_peak_memory

    ballast = torch.ones(256 * 2**20 // 4)  # 256 MB, then freed
    ballast += 1
    del ballast
    high = peak_rss_mb()
    if reset_peak_memory(torch.device("cpu")) == "training":
        assert peak_rss_mb() < high - 100


TIMM_FEATURES = [
    ("resnet18", {}),  # FeatureListNet without flattening the stages, as timm builds ResNet's
    ("resnet18", {"out_indices": (1, 3)}),
    ("resnet18", {"feature_cls": "hook"}),
    ("resnet18", {"feature_cfg": {"feature_cls": "fx"}}),
    ("deit_tiny_patch16_224", {"img_size": 32}),  # the architecture's own feature config: a getter
    ("mobilenetv3_small_050", {}),  # a features class of its own (MobileNetV3Features)
]


@pytest.mark.parametrize(("arch", "options"), TIMM_FEATURES, ids=[f"{a}-{'-'.join(o) or 'default'}"
                                                                  for a, o in TIMM_FEATURES])
def test_timm_features_only_is_built_as_timm_builds_it(arch, options):
    """``create_model("timm/<arch>", features_only=True, ...)`` gives timm's feature class with timm's settings for
    that architecture and those options: the same module names and, with the same weights, the same outputs."""
    import copy

    ours = zoo.create_model(f"timm/{arch}", features_only=True, **copy.deepcopy(options)).eval()
    theirs = timm.create_model(arch, features_only=True, **copy.deepcopy(options)).eval()
    assert type(ours) is type(theirs) and list(ours.state_dict()) == list(theirs.state_dict())
    theirs.load_state_dict(ours.state_dict())
    x = torch.randn(2, 3, *((32, 32) if "img_size" in options else (64, 64)))
    with torch.no_grad():
        mine, timms = ours(x), theirs(x)
    assert len(mine) == len(timms) and all(torch.equal(a, b) for a, b in zip(mine, timms))
    assert ours.feature_info.channels() == theirs.feature_info.channels()


def test_feature_options_need_features_only_and_timms_refusals_are_option_errors():
    with pytest.raises(ModelOptionError, match="feature_cls is for the backbone form"):
        zoo.create_model("timm/resnet18", feature_cls="getter")
    with pytest.raises(ModelOptionError, match="timm refuses them"):
        zoo.create_model("timm/resnet18", features_only=True, feature_cls="no_such_wrapper")


FEATURE_FAMILIES = zoo.list_families(capability="features")


@pytest.mark.parametrize("family", FEATURE_FAMILIES, ids=lambda f: f.name)
def test_prune_intermediate_layers_keeps_each_tap_and_ends_the_features_there(family):
    """timm's prune_intermediate_layers contract on each declared family: pruned to the last stage without the head,
    the model is unchanged; pruned to stage i, its tap i is the unpruned model's and (with prune_norm) its
    forward_features ends there; the kept modules keep their names; every kept parameter trains."""
    import copy

    from ..helpers import small_model

    torch.manual_seed(0)
    model = small_model(family, num_classes=10).eval()
    x = torch.randn(2, *family.test_input_size)
    last = len(model.feature_info) - 1
    with torch.no_grad():
        expected, taps = model(x), model.forward_intermediates(x, intermediates_only=True)
        whole = copy.deepcopy(model)
        whole.prune_intermediate_layers([last], prune_head=False)
        torch.testing.assert_close(whole(x), expected, rtol=0, atol=0)
    names = set(model.state_dict())
    for i in range(last + 1):
        pruned = copy.deepcopy(model)
        with torch.no_grad():
            taken = pruned.prune_intermediate_layers([i], prune_norm=True)
            assert taken == [i] and set(pruned.state_dict()) <= names  # kept modules keep their names
            torch.testing.assert_close(pruned.forward_intermediates(x, indices=taken, intermediates_only=True)[0],
                                       taps[i], rtol=0, atol=0)
            if i < last:
                torch.testing.assert_close(pruned.forward_features(x), taps[i], rtol=0, atol=0)
        pruned.train()
        sum(t.sum() for t in pruned.forward_intermediates(x, indices=taken, intermediates_only=True)).backward()
        unused = [n for n, p in pruned.named_parameters() if p.requires_grad and p.grad is None]
        assert not unused, f"pruned to {i}: {unused}"


@pytest.mark.parametrize("feature_cls", ["list", "dict", "hook", "fx", "getter"])
@pytest.mark.parametrize("family", FEATURE_FAMILIES, ids=lambda f: f.name)
def test_every_timm_feature_class_wraps_a_declared_family(family, feature_cls):
    """features_only with timm's feature_cls (and feature_cfg) builds timm's wrapper over the family's model; its
    outputs are the model's forward_intermediates at the same indices, exactly."""
    import copy

    from zoo.models.features import features_only

    from ..helpers import small_model

    torch.manual_seed(0)
    model = small_model(family, num_classes=10).eval()
    x = torch.randn(2, *family.test_input_size)
    features = features_only(copy.deepcopy(model), feature_cls=feature_cls).eval()
    indices = list(features.feature_info.out_indices) if feature_cls != "getter" else list(features.out_indices)
    with torch.no_grad():
        outputs = features(x)
        wanted = model.forward_intermediates(x, indices=indices, intermediates_only=True)
    outputs = list(outputs.values()) if isinstance(outputs, dict) else list(outputs)
    assert len(outputs) == len(wanted) and features.feature_info.channels() == [t.shape[1] for t in wanted]
    for got, want in zip(outputs, wanted):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    built = zoo.create_model(family.small, **family.small_options, features_only=True, feature_cls=feature_cls,
                             out_indices=indices[-2:])
    assert len(built(x)) == 2
    with pytest.raises(ModelOptionError, match="feature_cls='nope'"):
        features_only(copy.deepcopy(model), feature_cls="nope")


@pytest.mark.parametrize("family", FEATURE_FAMILIES, ids=lambda f: f.name)
def test_fx_then_torchscript_in_chans_and_a_reset_classifier_as_timms(family):
    """A family's model traces with torch.fx and the traced module scripts (timm's fx-then-TorchScript test); it says
    its in_chans; reset_classifier keeps the model's device, dtype and mode, and '' pools nothing (a feature map)."""
    from ..helpers import small_model

    torch.manual_seed(0)
    model = small_model(family, num_classes=10, in_chans=1).eval()
    x = torch.randn(2, 1, *family.test_input_size[1:])
    scripted = torch.jit.script(torch.fx.symbolic_trace(model))
    with torch.no_grad():
        torch.testing.assert_close(scripted(x), model(x), rtol=0, atol=0)
    assert model.in_chans == 1
    model.to(dtype=torch.float64)
    model.reset_classifier(5)
    head = model.get_classifier()
    assert all(p.dtype == torch.float64 for p in head.parameters()) and not any(m.training for m in model.modules())
    model.reset_classifier(0, "")
    with torch.no_grad():
        assert model(x.double()).ndim == 4
