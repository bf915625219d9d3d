"""Shared test helpers: the one way tests run the entry points (in a subprocess, or in this process for fast error
paths), the tiny configs, a snapshot of a directory to prove that a refused command left it exactly as it was, and
small model and hub helpers several test modules use. Fixtures are in ``conftest.py``."""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import io
import logging
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
QUICK_TIMING = ["++prune.table={warmup_s: 0.2, entry_warmup_s: 0.01, min_rounds: 3, max_rounds: 6}",
            "++prune.measure={warmup_s: 0.2, net_warmup_s: 0.02, min_rounds: 3, max_rounds: 6}"]
TINY_TRAIN = ["model=mobilenetv2_035", "data.image_size=16", "data.batch_size=32", "trainer.max_epochs=1",
              "trainer.limit_train_batches=4", "trainer.progress=false", "optim.warmup_epochs=0"]
TINY_PRUNE = [*TINY_TRAIN, "prune.batch_size=2", "prune.calib_batches=1", "finetune.epochs=1",
              "finetune.linearise_fraction=0.5", *QUICK_TIMING]
TINY_LM = ["model=retnet_tiny", "data=bytes", "data.seq_len=32", "data.batch_size=8", "trainer.max_epochs=1",
           "trainer.limit_train_batches=4", "trainer.limit_val_batches=2", "trainer.progress=false",
           "optim.warmup_epochs=0", "prune.batch_size=2", "prune.calib_batches=1", "finetune.epochs=1",
           "prune.target_speedup=1.25", *QUICK_TIMING]


def env_for(base: Path, **extra: str) -> dict[str, str]:
    """The environment of a test subprocess: offline W&B under `base`, one thread (tiny models run as fast, and a
    busy machine does not slow them more), no inherited launch id; `extra` variables on top."""
    env = {k: v for k, v in os.environ.items() if k not in ("DEPTHZOO_START_TIME", "DEPTHZOO_LAUNCH_ID")}
    env.update(WANDB_DIR=str(base), WANDB_MODE="offline", WANDB_SILENT="true", PYTHONUNBUFFERED="1",
               OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", HYDRA_FULL_ERROR="0", **extra)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    return env


def entry_cmd(script: str, *overrides: str, base: Path, run_dir: Path | None = None) -> list[str]:
    """``python <script>.py`` with outputs and caches under `base` (and the run directory, if given)."""
    cmd = [sys.executable, str(ROOT / f"{script}.py"), *overrides, f"paths.log_dir={base / 'outputs'}"]
    if script == "prune":
        cmd.append(f"prune.cache_dir={base / 'cache'}")
    if run_dir is not None:
        cmd.append(f"hydra.run.dir={run_dir}")
    return cmd


def run_entry(script: str, *overrides: str, base: Path, run_dir: Path | None = None, timeout: float = 300,
              env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run ``train.py``/``prune.py`` in a subprocess under `base` and wait for it: the one runner of the tests."""
    return subprocess.run(entry_cmd(script, *overrides, base=base, run_dir=run_dir), capture_output=True, text=True,
                          timeout=timeout, env={**env_for(base), **(env or {})}, cwd=base)


def run_prune(*overrides: str, base: Path, run_dir: Path | None = None, timeout: float = 300,
              env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``prune.py`` in ``base/run`` (or `run_dir`), outputs and caches under `base`."""
    return run_entry("prune", *overrides, base=base, run_dir=run_dir or base / "run", timeout=timeout, env=env)


def run_train(*overrides: str, run_dir: Path, timeout: float = 240) -> subprocess.CompletedProcess:
    """``train.py`` in `run_dir`, outputs under its parent."""
    return run_entry("train", *overrides, base=run_dir.parent, run_dir=run_dir, timeout=timeout)


@dataclass
class Outcome:
    code: int
    output: str


def _entry_module(script: str):
    name = f"_depthzoo_entry_{script}"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / f"{script}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[name] = module
    return sys.modules[name]


def run_in_process(script: str, *args: str) -> Outcome:
    """Run an entry point's ``__main__`` path (:func:`zoo.jobs.cli.guard` around its Hydra main) in this process.

    The same code as the command line, without the interpreter start-up; for error paths that stop early.
    Returns the exit status and everything printed or logged.
    """
    from zoo.jobs.cli import guard

    module = _entry_module(script)
    schema = module.PruneConfig if script == "prune" else module.TrainConfig
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    argv, sys.argv = sys.argv, [f"{script}.py", *args]
    code = 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            root = logging.getLogger()
            root.addHandler(handler)
            try:
                guard(module.main, schema, module.setup)
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
            finally:
                root.removeHandler(handler)
    finally:
        sys.argv = argv
    return Outcome(code, out.getvalue())


def prune_in_process(*overrides: str, base: Path, run_dir: Path | None = None) -> subprocess.CompletedProcess:
    """``prune.py`` as :func:`run_prune` runs it (outputs and caches under `base`, in ``base/run`` or `run_dir`), but
    in this process (:func:`run_in_process`); the outcome reads like a finished subprocess's (``returncode``,
    ``stdout``; ``stderr`` empty)."""
    cmd = entry_cmd("prune", *overrides, base=base, run_dir=run_dir or base / "run")
    outcome = run_in_process("prune", *cmd[2:])
    return subprocess.CompletedProcess(cmd, outcome.code, outcome.output, "")


def snapshot(directory: Path) -> dict[str, str]:
    """Every file under `directory` (hidden ones included) with a hash of its bytes; folders as entries too."""
    if not directory.exists():
        return {}
    state = {}
    for path in sorted(directory.rglob("*")):
        rel = str(path.relative_to(directory))
        state[rel] = "dir" if path.is_dir() else hashlib.sha256(path.read_bytes()).hexdigest()
    return state


def assert_same_weights(a: Path, b: Path) -> None:
    """The two ``.safetensors`` files hold the same tensor names and bit-identical values."""
    import torch
    from safetensors.torch import load_file

    ta, tb = load_file(str(a)), load_file(str(b))
    assert ta.keys() == tb.keys()
    different = [k for k in ta if not torch.equal(ta[k], tb[k])]
    assert not different, f"{len(different)} tensors differ, first {different[:3]}"


def max_rel_diff(a: Any, b: Any) -> float:
    """The largest difference of two tensors, relative to the largest value of the first."""
    return ((a - b).abs().max() / a.abs().max().clamp_min(1e-12)).item()


def randomise_norm_stats(model: Any, seed: int = 0) -> Any:
    """Give BatchNorm/GroupNorm non-trivial statistics so that weight loading is really checked."""
    import torch
    from torch import nn

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (nn.BatchNorm2d, nn.GroupNorm)):
                m.weight.copy_(torch.rand(m.weight.shape, generator=gen) + 0.5)
                m.bias.copy_(torch.rand(m.bias.shape, generator=gen) - 0.5)
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.copy_(torch.rand(m.running_mean.shape, generator=gen) - 0.5)
                m.running_var.copy_(torch.rand(m.running_var.shape, generator=gen) + 0.5)
    return model


def put_in_hf_cache(hf_home: Path, repo_id: str, weights: Path) -> None:
    """Place `weights` in a Hugging Face cache as `repo_id`'s model.safetensors (the layout huggingface_hub reads)."""
    import shutil

    repo = hf_home / "hub" / ("models--" + repo_id.replace("/", "--"))
    commit = "0" * 40
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True, exist_ok=True)
    shutil.copy(weights, snapshot / "model.safetensors")


def small_model(family: Any, **options: Any) -> Any:
    """The family's small member with its small options (a fast instance of the family's depth structure)."""
    import zoo

    return zoo.create_model(family.small, **{**family.small_options, **options})


def example_batch(family: Any, batch: int = 2, num_classes: int = 10) -> tuple[Any, Any]:
    """Inputs of the family's test size and targets for its task: images and class ids, or token ids and the next."""
    import torch

    if family.task == "language_model":
        tokens = torch.randint(0, 256, (batch, family.test_input_size[0] + 1))
        return tokens[:, :-1], tokens[:, 1:]
    return torch.randn(batch, *family.test_input_size), torch.randint(0, num_classes, (batch,))


def models_with(capability: str) -> list[str]:
    """Every registered model whose family declares `capability` (a new family is picked up with no list edited)."""
    import zoo

    return [n for n in zoo.list_models() if zoo.get_family(zoo.get_entry(n).family).has(capability)]


TABLE_MODEL, TABLE_SIZE = "mobilenetv2_035", 64  # the latency tests' network and input size


def _fast_table_settings() -> Any:
    from zoo.latency import TableSettings

    return TableSettings(warmup_s=0.1, entry_warmup_s=0.0, min_rounds=3, max_rounds=4)


FAST_TABLE = _fast_table_settings()  # a few short rounds: tables for tests, not for measurements


def small_table(cache_dir: Path, **kwargs: Any) -> Any:
    """TABLE_MODEL's latency table at TABLE_SIZE on the CPU with FAST_TABLE settings, cached in `cache_dir`."""
    from zoo.latency import build_table

    return build_table(TABLE_MODEL, input_size=TABLE_SIZE, device="cpu", cache_dir=str(cache_dir),
                       settings=FAST_TABLE, **kwargs)


def assert_tiny_prune_results(base: Path, stdout: str, search: str = "interaction") -> None:
    """What the tiny digits prune run with ``prune.export=onnx`` (TINY_PRUNE) leaves in ``base/run``: every results
    key, the ONNX export checked at two batch sizes, the measured-target loop's verdict, results.json written last
    and the pruned checkpoint rebuilt from its plan. Shared by the in-process (unit, `search` dp) and subprocess
    (e2e, the default search) runs."""
    import json

    import pytest
    import torch

    import zoo
    from zoo.jobs.runs import read_record

    results = json.loads((base / "run" / "results.json").read_text())
    for key in ("model", "device", "target_speedup", "plan", "baseline", "pruned", "predicted_latency_ms",
                "measured_speedup", "table", "timings_s", "checkpoint"):
        assert key in results
    assert results["model"] == "mobilenetv2_035" and results["plan"]["remove"]
    export = results["export"]  # prune.export=onnx: the pruned, merged model in onnxruntime
    assert export["passed"] and export["max_rel_diff"] <= 1e-4 and (base / "run" / "pruned.onnx").is_file()
    assert export["checked_shapes"] == [[[2, 3, 16, 16]], [[3, 3, 16, 16]]]  # a dynamic batch, checked at two sizes
    assert export["dynamic_axes"] == {next(iter(export["dynamic_axes"])): {"0": "batch"}} and export["opset"]
    health = results["baseline"]["health"]  # computed from the baseline's top-1 and the classes, and said loudly
    assert health["trained"] == (health["top1"] > health["chance"] + 5.0) and health["chance"] == 10.0
    assert health["trained"] or "THE BASELINE DID NOT LEARN" in stdout
    for side in ("baseline", "pruned"):
        assert results[side]["latency_ms"] > 0 and results[side]["params"] > 0 and "val/acc1" in results[side][
            "metrics"]
    # merged convs can hold more parameters than the convs they replace; depth is what goes down
    assert results["table"]["entries"] > 0 and results["table"]["measured_now"] > 0
    assert set(results["timings_s"]) >= {"baseline", "latency_table", "importance", "search", "target_check",
                                         "finetune", "measure"}
    check = results["target_check"]  # the measured-target loop ran, and its verdict follows the final measurement
    assert check["corrections"] and check["wanted_speedup"] == 1.5
    assert check["miss"] == pytest.approx(results["measured_speedup"] / 1.5 - 1)
    assert check["met"] == (abs(check["miss"]) <= check["tolerance"])
    assert results["search"] == search and results["search_result"]["method"] == search
    assert "measured speed-up" in stdout
    written_last = (base / "run" / "results.json").stat().st_mtime_ns  # the results file is the last one written
    assert all(p.stat().st_mtime_ns <= written_last for p in (base / "run").rglob("*")
               if p.is_file() and p.parent.name != "logs")  # (W&B's service appends its debug logs on its own)
    assert results["fingerprint"] == read_record(base / "run")["fingerprint"]
    pruned = zoo.load(results["checkpoint"]).eval()  # rebuilt from the plan in the checkpoint
    assert pruned.zoo_plan["remove"] == results["plan"]["remove"]
    assert sum(p.numel() for p in pruned.parameters()) == results["pruned"]["params"]
    convs = lambda m: sum(isinstance(c, torch.nn.Conv2d) for c in m.modules())  # noqa: E731
    assert convs(pruned) < convs(zoo.create_model("mobilenetv2_035"))
    with torch.no_grad():
        assert pruned(torch.zeros(1, 3, 16, 16)).shape == (1, 10)


def in_onnxruntime(path: Path, qdq_in_float: bool = False):
    """The ONNX file at `path` as onnxruntime computes it on the CPU, called like a one-input model (`qdq_in_float`:
    its Q/DQ pairs computed as such, as TensorRT does, not fused into onnxruntime's int8 kernels)."""
    import torch

    from zoo.deploy.export import onnx_session

    session = onnx_session(path, qdq_in_float=qdq_in_float)
    name = session.get_inputs()[0].name
    return lambda x: torch.from_numpy(session.run(None, {name: x.numpy()})[0])


def agreement(model: Any, written: Any, batches: list[Any]) -> tuple[float, float]:
    """Recomputed here: the top-1 agreement of a written INT8 model with `model` over `batches`, and the largest
    output difference."""
    import torch

    with torch.no_grad():
        pairs = [(model(x), written(x)) for x in batches]
    agree = sum(int((a.argmax(-1) == b.argmax(-1)).sum()) for a, b in pairs) / sum(len(a) for a, _ in pairs)
    return agree, max((a - b).abs().max().item() for a, b in pairs)
