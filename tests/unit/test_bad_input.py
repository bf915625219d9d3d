"""The bad-input catalogue: every user error of the command lines and the public API is one clear message (what was
wrong, what is allowed), exit status 2 for the command lines, no traceback, and nothing overwritten.

train.py and prune.py cases run their ``__main__`` path in this process (:func:`helpers.run_in_process`): the same
code as the command line without the interpreter start-up. Each runs against a directory that already holds another
run's results, which must be byte-identical afterwards; cases that can only fail once the run owns a directory (the
data is read) use a fresh directory and must leave no results in it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import zoo

from ..helpers import TINY_PRUNE, TINY_TRAIN, run_in_process, snapshot
from ..makers import bad_input_files


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    """Inputs the cases point at (``makers.bad_input_files``): another run's directory, checkpoints, plans, images."""
    return bad_input_files(tmp_path_factory.mktemp("bad-input"))



def _fill(args: tuple[str, ...], files: dict[str, Path]) -> list[str]:
    return [a.format(**{k: str(v) for k, v in files.items()}) for a in args]


def _check(outcome, message: str, files: dict[str, Path] | None = None) -> None:
    message = message.format(**{k: str(v) for k, v in (files or {}).items()}) if files else message
    assert outcome.code == 2, outcome.output[-3000:]
    assert message in outcome.output, outcome.output[-3000:]
    assert "Traceback" not in outcome.output, outcome.output[-3000:]


# ----------------------------------------------------------------------------------------------- train.py
TRAIN_CASES = [
    (["model=mobilenetv2_0355"], "model=mobilenetv2_0355 is not an option of the model group. Did you mean "
                                 "mobilenetv2_035?"),
    (["trainer.max_epoch=2"], "trainer.max_epoch is not a config key. Did you mean trainer.max_epochs?"),
    (["trainer.max_epochs=abc"], "trainer.max_epochs=abc: Value 'abc' of type 'str' could not be converted"),
    (["+trainer.foo=1"], "trainer.foo is not a config key"),
    (["data.batch_size=[1"], "Hydra's override grammar"),
    (["+model.overrides.dropout=0.1"], "mobilenetv2_050 has no option 'dropout'"),
    (["model=retnet_tiny", "data=bytes", "+model.overrides.dim=65"], "must be divisible by heads=2"),
    (["model=retnet_tiny", "data=bytes", "+model.overrides.dim=abc"], "retnet_tiny cannot be built with options"),
    (["trainer.precision=fp8"], "trainer.precision='fp8' is not allowed; choose one of: fp32, bf16, fp16"),
    (["trainer.device=tpu"], "trainer.device='tpu' is not allowed"),
    (["data=imagefolder"], "data.root is not set"),
    (["data=imagefolder", "data.root=/nonexistent/images"], "lacks /nonexistent/images/train"),
    (["data=text", "model=retnet_tiny"], "data.files is not set"),
    (["data=text", "model=retnet_tiny", "data.files=[/nonexistent/nope.txt]"], "matches no file"),
    (["model=retnet_tiny"], "model=retnet_tiny is a language model but data=digits does not fit it"),
    (["optim.opt=adamx"], "optim.opt='adamx' is not a timm optimizer. Did you mean adamax"),
    (["optim.sched=cosinus"], "optim.sched='cosinus' is not allowed"),
    (["optim.lr=-1"], "optim.lr=-1.0 is out of range: it must be > 0.0"),
    (["optim.lr=nan"], "optim.lr=nan is not a finite number: it must be > 0.0"),
    (["data.batch_size=0"], "data.batch_size=0 is out of range: it must be >= 1"),
    (["data.val_fraction=1.5"], "data.val_fraction=1.5 is out of range: it must be > 0.0 and < 1.0"),
    (["trainer.mixup_alpha=0.2", "data.batch_size=33"], "Mixup/CutMix needs an even data.batch_size"),
    (["logger.mode=onlin"], "logger.mode='onlin' is not allowed"),
    (["model.pretrained=/nonexistent/w.safetensors"], "Weight file or folder /nonexistent/w.safetensors does not "
                                                      "exist"),
    (["trainer.resume=/nonexistent/run"], "no training state found"),
    (["data.num_workers=-1"], "data.num_workers=-1 is out of range: it must be >= 0"),
    (["trainer.label_smoothing=1.5"], "trainer.label_smoothing=1.5 is out of range: it must be >= 0.0 and <= 0.999"),
    (["data.shift=-1"], "data.shift=-1 is out of range: it must be >= 0"),
    (["model=retnet_tiny", "data=bytes", "data.seq_len=0"], "data.seq_len=0 is out of range: it must be >= 1"),
    (["trainer.limit_train_batches=0"], "trainer.limit_train_batches=0 is out of range: it must be >= 1"),
    (["trainer.limit_val_batches=0"], "trainer.limit_val_batches=0 is out of range: it must be >= 1"),
    (["trainer.monitor=val/foo"], "trainer.monitor='val/foo' is not allowed; choose one of: val/loss, val/acc1"),
    (["data.image_size=0"], "data.image_size=0 is out of range: it must be >= 1"),
    (["trainer.ema_decay=2"], "trainer.ema_decay=2.0 is out of range: it must be >= 0.0 and <= 1.0"),
    (["trainer.mixup_alpha=-1"], "trainer.mixup_alpha=-1.0 is out of range: it must be >= 0.0"),
    (["model.num_classes=0"], "model.num_classes=0 is out of range: it must be >= 1"),
    (["optim.clip_mode=max"], "optim.clip_mode='max' is not allowed; choose one of: norm, value, agc"),
    (["paths.log_dir={base}/notes.txt"], "paths.log_dir={base}/notes.txt is a file, not a folder"),
    ([], "holds a train run of another config"),
    (["trainer.resume=auto"], "holds a train run of another config (model.name: 'tresnet_m' -> 'mobilenetv2_050'"),
]


@pytest.mark.parametrize("args, message", TRAIN_CASES, ids=[" ".join(a) or "existing-run" for a, _ in TRAIN_CASES])
def test_train_py_bad_input(args, message, files):
    before = snapshot(files["victim"])
    outcome = run_in_process("train", *_fill(tuple(args), files), f"hydra.run.dir={files['victim']}", "logger=none")
    _check(outcome, message, files)
    assert snapshot(files["victim"]) == before


@pytest.mark.skipif(torch.cuda.is_available(), reason="fp16 is allowed where CUDA is")
def test_train_py_refuses_fp16_on_cpu(files):
    before = snapshot(files["victim"])
    outcome = run_in_process("train", "trainer.precision=fp16", f"hydra.run.dir={files['victim']}", "logger=none")
    _check(outcome, "trainer.precision=fp16 needs a CUDA device")
    assert snapshot(files["victim"]) == before


FRESH_TRAIN_CASES = [  # errors that need the data or the weights read: the run owns a fresh directory by then
    (["data=imagefolder", "data.root={base}/images", "data.image_size=16", "data.batch_size=2"],
     "Cannot read image {base}/images/val/a/broken.jpg"),
    (["data.batch_size=5000"], "fewer than one batch of data.batch_size=5000"),
    (["model.num_classes=7"], "model.num_classes=7 but the data set has 10 classes"),
    (["model=mobilenetv2_050", "trainer.resume={ckpt}"], "no training state found"),
    (["model.pretrained={truncated}"], "Cannot read weight file {base}/truncated.safetensors"),
    (["data.val_fraction=0.001"], "data.val_fraction=0.001 cannot split the 1797 digits"),
    (["model.pretrained={evil}"], "{base}/evil.pth is refused for safety"),
    (["model=mobilenetv2_035", "model.pretrained=timm/mobilenetv2_035.no_such_tag"],
     "Hub id 'timm/mobilenetv2_035.no_such_tag' is not in the local Hugging Face cache and"),
]


@pytest.mark.parametrize("args, message", FRESH_TRAIN_CASES, ids=[a[-1] for a, _ in FRESH_TRAIN_CASES])
def test_train_py_bad_input_read_at_run_time(args, message, files, tmp_path):
    args = [*TINY_TRAIN, "data.num_workers=0", *_fill(tuple(args), files)]
    outcome = run_in_process("train", *args, f"hydra.run.dir={tmp_path / 'run'}", "logger=none")
    _check(outcome, message.format(**{k: str(v) for k, v in files.items()}))
    assert not (tmp_path / "run" / "results.json").exists() and not (tmp_path / "run" / "checkpoints").exists()
    assert not files["marker"].exists(), "the pickle's payload ran"
    assert "will likely succeed" not in outcome.output


def test_run_directory_that_cannot_be_created(files):
    outcome = run_in_process("train", f"hydra.run.dir={files['base']}/notes.txt", "logger=none")
    _check(outcome, "cannot create the run directory")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without CUDA")
def test_train_py_refuses_cuda_without_a_gpu(files):
    outcome = run_in_process("train", "trainer.device=cuda", f"hydra.run.dir={files['victim']}", "logger=none")
    _check(outcome, "trainer.device=cuda but no CUDA device is available here")


# ----------------------------------------------------------------------------------------------- prune.py
PRUNE_CASES = [
    (["prune.target_speedup=1.0"], "prune.target_speedup=1.0 is out of range: it must be > 1.0"),
    (["prune.target_speedup=nan"], "prune.target_speedup=nan is not a finite number: it must be > 1.0"),
    (["prune.target_speedup=inf"], "prune.target_speedup=inf is not a finite number: it must be > 1.0"),
    (["prune.device=cuda:7"], "Device 'cuda:7' is not available"),
    (["prune.device=tpux"], "Unknown device 'tpux'. Allowed devices are 'auto', 'cpu', 'cuda' and 'cuda:N'."),
    (["prune.search=annealing"], "prune.search='annealing'; allowed: interaction, dp, kbest, local, greedy, random"),
    (["prune.importance=taylor"], "prune.importance='taylor'; allowed: loss, tempered, similarity, finetune"),
    (["prune.workload=decode"], "needs a language model with a decode state"),
    (["prune.export=tflite"], "prune.export='tflite'; allowed: null, onnx, torch_export, hf"),
    (["prune.export_dynamic_size=true"], "it goes with prune.export=onnx or torch_export"),
    (["model=retnet_tiny", "data=bytes", "prune.export=onnx", "prune.export_dynamic_size=true"],
     "retnet_tiny takes no images: set prune.export_dynamic_size=false"),
    (["prune.export=hf"], "prune.export=hf is not possible for model=mobilenetv2_050 (the mobilenetv2 family): "
                          "writes a Hugging Face model folder"),
    (["prune.objectives=[val/ppl]"], "prune.objectives=['val/ppl']: give one or more of metric"),
    (["prune.objectives=[]"], "prune.objectives=[]: give one or more of"),
    (["prune.dtype=float16"], "float16"),
    (["prune.plan=/nonexistent/plan.json"], "Cannot read plan file /nonexistent/plan.json"),
    (["prune.plan={base}/bad_plan.json"], "is not JSON"),
    (["prune.plan={base}/plan_keys.json"], "Unknown plan keys ['prune']"),
    (["checkpoint=/nonexistent/model.safetensors"], "Weight file or folder /nonexistent/model.safetensors does "
                                                    "not exist"),
    (["checkpoint=true"], "Model 'mobilenetv2_035' has no published pretrained weights"),
    (["model.tag=in22k"], "Unknown pretrained tag 'in22k' for mobilenetv2_050; known tags: mobilenetv2_050.lamb_in1k"),
    (["++prune.table={{foo: 1}}"], "prune.table has unknown key(s) foo; allowed: warmup_s"),
    (["++prune.measure={{rounds: 3}}"], "prune.measure has unknown key(s) rounds"),
    (["prune.max_memory_mb=-1"], "prune.max_memory_mb=-1.0 is out of range: it must be > 0.0"),
    (["prune.threads=0"], "prune.threads=0 is out of range: it must be >= 1"),
    (["prune.batch_size=0"], "prune.batch_size=0 is out of range: it must be >= 1"),
    (["finetune.linearise_fraction=2"], "finetune.linearise_fraction=2.0 is out of range: it must be >= 0.0 and "
                                        "<= 1.0"),
    (["prune.target_speedup=null"], "Give a budget"),
    (["prune.targetspeedup=2"], "prune.targetspeedup is not a config key. Did you mean prune.target_speedup?"),
    (["finetune.lr=-1"], "finetune.lr=-1.0 is out of range: it must be > 0.0"),
    (["finetune.distill_temperature=0"], "finetune.distill_temperature=0.0 is out of range: it must be > 0.0"),
    (["prune.correction_plans=-1"], "prune.correction_plans=-1 is out of range: it must be >= 0"),
    (["++prune.table={{max_rounds: 0}}"], "TableSettings (prune.table): max_rounds=0 must be >= min_rounds"),
    (["++prune.measure={{min_rounds: 0}}"], "NetworkTimingSettings (prune.measure): min_rounds=0 must be >= 1"),
    (["prune.cache_dir={base}/notes.txt"], "prune.cache_dir={base}/notes.txt is a file, not a folder"),
    (["checkpoint={base}/notes.txt"], "checkpoint={base}/notes.txt is not a weight file; allowed are .safetensors"),
    (["checkpoint={base}/last.state.pt"], "is a training state, not weights"),
    (["checkpoint={other_ckpt}"], "holds model 'mobilenetv2_050', but model=mobilenetv2_035"),
    ([], "holds a prune run of another config (model.name: 'tresnet_m' -> 'mobilenetv2_050'"),
]


@pytest.mark.parametrize("args, message", PRUNE_CASES, ids=[" ".join(a) or "existing-run" for a, _ in PRUNE_CASES])
def test_prune_py_bad_input(args, message, files):
    if "float16" in message and torch.cuda.is_available():
        pytest.skip("float16 is allowed where CUDA is")
    before = snapshot(files["prune_victim"])
    if any(a.startswith("checkpoint=") for a in args):
        args = ["model=mobilenetv2_035", *args]
    outcome = run_in_process("prune", *_fill(tuple(args), files), f"hydra.run.dir={files['prune_victim']}",
                             "logger=none", f"paths.log_dir={files['base'] / 'outputs'}")
    _check(outcome, message, files)
    assert "xla" not in outcome.output  # torch's list of device types is not repeated
    assert snapshot(files["prune_victim"]) == before
    assert not (files["base"] / "outputs" / "baselines").exists(), "a baseline was trained for a refused run"


FRESH_PRUNE_CASES = [  # checked against the model: the run owns a fresh directory by then
    (["checkpoint={timm_050}"], "The weights fit mobilenetv2_050 best: use that model name"),
    (["checkpoint={timm_1000}"], "has a classifier for another number of classes than the data's 10"),
    (["checkpoint={ckpt}", "prune.plan={base}/unknown_plan.json"], "'body.layer1.0' are not depth units"),
]


@pytest.mark.parametrize("args, message", FRESH_PRUNE_CASES, ids=[a[-1] for a, _ in FRESH_PRUNE_CASES])
def test_prune_py_bad_input_read_at_run_time(args, message, files, tmp_path):
    outcome = run_in_process("prune", *TINY_PRUNE, *_fill(tuple(args), files), f"hydra.run.dir={tmp_path / 'run'}",
                             "logger=none", f"paths.log_dir={tmp_path / 'outputs'}",
                             f"prune.cache_dir={tmp_path / 'cache'}")
    _check(outcome, message)
    assert not (tmp_path / "run" / "results.json").exists()


# ------------------------------------------------------------------------------- the other command lines
@pytest.mark.parametrize("argv, message", [
    (["info", "tresnet_s"], "Closest names: tresnet_m"),
    (["list", "nomatch*"], "No registered model matches 'nomatch*'"),
])
def test_zoo_cli_bad_input(argv, message, capsys):
    from zoo.__main__ import main

    assert main(argv) == 2
    assert message in capsys.readouterr().err


LATENCY_CASES = [
    (["input_size=abc"], "input_size='abc' is not a size"),
    (["input_size=-5"], "input_size=-5 does not fit mobilenetv2_035"),
    (["input_size=[3,0,8]"], "every value >= 1"),
    (["json=/nonexistent/dir/summary.json"], "folder /nonexistent/dir does not exist"),
    (["device=tpux"], "Unknown device 'tpux'. Allowed devices are"),
    (["device=cuda:7"], "is not available"),
    (["batch_size=0"], "batch_size=0 must be an integer >= 1"),
    (["threads=0"], "threads=0 must be >= 1"),
    (["clock=cpu"], "Unknown clock 'cpu'"),
    (["estimator=mean"], "Unknown estimator 'mean'; allowed are median, p10, min"),
    (["foo=1"], "Bad argument (Key 'foo' not in 'LatencyConfig')"),
    (["model=nope"], "Unknown model 'nope'"),
    (["correct=-1"], "correct=-1 must be >= 0"),
    (["dtype=float16"], "float16"),
    (["cuda_timing=sometimes"], "Unknown cuda_timing 'sometimes'"),
    (["notkeyvalue"], "Arguments must be key=value"),
]


@pytest.mark.parametrize("argv, message", LATENCY_CASES, ids=[a[0] for a, _ in LATENCY_CASES])
def test_zoo_latency_cli_bad_input(argv, message, capsys, tmp_path):
    from zoo.latency.__main__ import main

    if "float16" in message and torch.cuda.is_available():
        pytest.skip("float16 is allowed where CUDA is")
    assert main(["model=mobilenetv2_035", "device=cpu", "min_rounds=1", "max_rounds=1", "warmup_s=0",
                 f"cache_dir={tmp_path}", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not list(tmp_path.glob("*.json")), "a table was measured for a refused command"


def _results(model: str = "mobilenetv2_035", metric: float = 90.0) -> dict:
    side = {"latency_ms": 2.0, "params": 100, "metrics": {"val/acc1": metric}}
    return {"model": model, "device": "cpu", "condition": {"device_name": "cpu"}, "search": "dp",
            "target_speedup": 1.5, "baseline": side, "pruned": {**side, "latency_ms": 1.3},
            "predicted_latency_ms": 1.35, "measured_speedup": 1.54, "prediction_error": 0.04}


def test_zoo_report_lists_every_unreadable_job_and_still_reports(tmp_path, capsys):
    from zoo.jobs.sweep_report import main

    jobs = {"good": _results(), "list": [1, 2], "null_latency": {**_results(), "pruned": {
        **_results()["pruned"], "latency_ms": None}}, "no_metric": {**_results(), "pruned": {
            **_results()["pruned"], "metrics": {}}}}
    for name, payload in jobs.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "results.json").write_text(json.dumps(payload))
    (tmp_path / "broken_failure").mkdir()
    (tmp_path / "broken_failure" / "failed.json").write_text("{not json")
    assert main([str(tmp_path)]) == 0
    err = capsys.readouterr().err
    assert "job list unreadable: results.json holds a list, not an object" in err
    assert "job null_latency unreadable: pruned.latency_ms is None, not a number" in err
    assert "job no_metric unreadable: results.json has no validation metric" in err
    assert "job broken_failure failed: failed.json is unreadable" in err
    for name in ("report.csv", "report.md", "pareto.png"):
        assert (tmp_path / name).stat().st_size > 0


def test_zoo_report_that_cannot_be_made_writes_nothing(tmp_path, capsys):
    from zoo.jobs.sweep_report import main

    assert main([str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "results.json").write_text("[]")
    assert main([str(tmp_path)]) == 2
    assert "No finished job" in capsys.readouterr().err
    assert not list(tmp_path.glob("report.*")) and not (tmp_path / "pareto.png").exists()


# ------------------------------------------------------------------------------------------ the Python API
def test_python_api_bad_input(files):
    from zoo.latency import LatencyDeviceError, build_table, measure

    with pytest.raises(zoo.UnknownModelError, match="Closest names: mobilenetv2_100"):
        zoo.create_model("mobilenet_v2_100")
    with pytest.raises(zoo.ZooError, match="has no option 'dropout'.*drop_rate"):
        zoo.create_model("mobilenetv2_035", dropout=0.1)
    with pytest.raises(zoo.ZooError, match="must be divisible by heads"):
        zoo.create_model("retnet_tiny", dim=65)
    with pytest.raises(zoo.WeightsError, match="no depthzoo metadata"):
        zoo.load(files["timm_file"])
    with pytest.raises(zoo.WeightsError, match="truncated.safetensors"):
        zoo.load(files["truncated"])
    with pytest.raises(zoo.ZooError, match="input_size=-5 does not fit"):
        build_table("mobilenetv2_035", input_size=-5, device="cpu")
    with pytest.raises(LatencyDeviceError) as err:
        measure(torch.nn.Linear(2, 2), torch.zeros(1, 2), device="tpux")
    assert "xla" not in str(err.value)
    with pytest.raises(zoo.PlanError, match="holds unit names"):
        zoo.apply_plan(zoo.create_model("mobilenetv2_035"), {"remove": [3]}, inplace=False)
    with pytest.raises(zoo.PlanError, match="merge: false"):
        zoo.apply_plan(zoo.create_model("mobilenetv2_035"), {"remove": [], "blend": True})
