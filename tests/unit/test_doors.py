"""Every door refuses what cannot work before any work: the capability table of every family (each declared "cannot"
tried through prune.py, refused at validation with the family's reason, exit 2, no baseline or table made), folders
that cannot be written, plugins that do not import, stored benchmark files that are not results, and the Python
API's bad arguments. No user error reaches the "unexpected error (a bug)" path."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import zoo
from zoo.errors import BUG, ZooError
from zoo.models.registry import DEPLOY_KINDS

from ..helpers import prune_in_process, run_in_process

QUICK = ["trainer.max_epochs=1", "trainer.limit_train_batches=2", "trainer.progress=false", "logger=none",
         "prune.batch_size=2", "prune.calib_batches=1", "finetune.epochs=1"]


def family_overrides(family: zoo.models.registry.Family) -> list[str]:
    """A tiny prune config of the family's small member on its task's embedded data."""
    data = ["data=bytes", "data.seq_len=16"] if family.task == "language_model" else ["data.image_size=16"]
    options = [f"+model.overrides.{k}={v}" for k, v in family.small_options.items()]
    source, _, name = family.small.rpartition("/")  # timm/<name>, hf/<name> or a declared name
    model = [f"model={source}", f"model.name={name}"] if source else [f"model={family.small}"]
    return [*model, *data, *options, *QUICK]


SETTING = {"runtime": "prune.runtime", "export": "prune.export", "quantize": "prune.quantize",
           "workload": "prune.workload"}


def declared_refusals() -> list[tuple[str, str, str, str]]:
    """(family, kind, value, reason) of every "cannot" in every family's capability table."""
    return [(f.name, kind, value, why) for f in zoo.list_families(dynamic=True) for kind in DEPLOY_KINDS
            for value, why in f.deploy[kind].items() if why is not None]


def test_every_family_declares_every_runtime_format_quantisation_and_workload():
    """A runtime, export format or workload added to the code must be declared by every family (supported, or refused
    with a reason): none is assumed."""
    from zoo.deploy.export import FORMATS
    from zoo.deploy.quantization import QUANTIZE
    from zoo.jobs.prune_config import WORKLOADS
    from zoo.latency.runtime import RUNTIMES

    known = {"runtime": {r.removesuffix("_int8") for r in RUNTIMES}, "export": set(FORMATS),
             "quantize": set(QUANTIZE), "workload": set(WORKLOADS)}
    for family in zoo.list_families(dynamic=True):
        for kind in DEPLOY_KINDS:
            assert set(family.deploy[kind]) == known[kind], (family.name, kind)
    assert len(declared_refusals()) >= 8  # the table has refusals to enforce


@pytest.mark.parametrize("family, kind, value, reason", declared_refusals(),
                         ids=[f"{f}-{k}-{v}" for f, k, v, _ in declared_refusals()])
def test_every_declared_cannot_is_refused_before_any_work(family, kind, value, reason, tmp_path):
    """prune.py with the family's small member and the refused setting: exit 2 at validation, one line naming the
    setting and the family's reason, no traceback, and no baseline trained, table built or cache written."""
    declared = zoo.get_family(family)
    extra = ["prune.quantize=int8", "prune.runtime=onnxruntime"] if kind == "quantize" else []
    out = prune_in_process(*family_overrides(declared), f"{SETTING[kind]}={value}", *extra, base=tmp_path)
    said = out.stdout
    assert out.returncode == 2, said[-2000:]
    assert f"{SETTING[kind]}={value} is not possible for model={declared.small}" in said and reason[:40] in said
    assert "Traceback" not in said and BUG not in said
    assert not (tmp_path / "outputs").exists() and not (tmp_path / "cache").exists()


def test_an_option_a_family_cannot_deploy_is_refused_and_the_option_that_can_is_not(tmp_path):
    """A RetNet built with torchscale's rotary cannot be written as an fla folder (prune.export=hf): refused before
    the baseline; with rope=neox the same run passes validation (it goes on to train its baseline)."""
    retnet = zoo.get_family("retnet")
    out = prune_in_process(*family_overrides(retnet), "prune.export=hf", base=tmp_path / "a")
    assert out.returncode == 2 and "+model.overrides.rope=neox" in out.stdout
    assert not (tmp_path / "a" / "outputs").exists()
    assert retnet.refusal("export", "hf", {"rope": "neox"}) is None
    assert "decay=linspace" in retnet.refusal("export", "hf", {"rope": "neox", "decay": "linspace"})


@contextlib.contextmanager
def unwritable(folder: Path) -> Iterator[Path]:
    """`folder` exists and cannot be written for the rest of the block: immutable for root (chattr +i), read-only
    otherwise."""
    folder.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0:
        if shutil.which("chattr") is None or subprocess.run(["chattr", "+i", str(folder)]).returncode != 0:
            pytest.skip("root, and this filesystem cannot make a folder immutable (chattr +i)")
        try:
            yield folder
        finally:
            subprocess.run(["chattr", "-i", str(folder)])
    else:
        folder.chmod(0o555)
        try:
            yield folder
        finally:
            folder.chmod(0o755)


@pytest.mark.parametrize("where", ["paths.log_dir", "prune.cache_dir", "DEPTHZOO_CACHE"])
def test_a_folder_that_cannot_be_written_is_refused_at_validation(where, tmp_path, monkeypatch):
    """An existing folder the run would write into (outputs, caches, the latency cache with its timing lock) that
    cannot be written: refused before any work with the key to change, not a traceback at the first write."""
    with unwritable(tmp_path / "locked") as locked:
        overrides = [*family_overrides(zoo.get_family("mobilenetv2"))]
        if where == "DEPTHZOO_CACHE":
            monkeypatch.setenv("DEPTHZOO_CACHE", str(locked))
            out = prune_in_process(*overrides, base=tmp_path)
        else:
            run_dir = tmp_path / "run"
            cmd = [*overrides, f"{where}={locked}", f"hydra.run.dir={run_dir}"]
            if where == "prune.cache_dir":
                cmd.append(f"paths.log_dir={tmp_path / 'outputs'}")
            out = run_in_process("prune", *cmd)
            out = type("Out", (), {"returncode": out.code, "stdout": out.output})
        assert out.returncode == 2, out.stdout[-2000:]
        assert "cannot be written" in out.stdout and (where in out.stdout) and "Traceback" not in out.stdout
        assert not list(locked.iterdir())
    assert not (tmp_path / "outputs" / "baselines").exists()


def test_a_plugin_that_does_not_import_is_one_line(monkeypatch):
    """``DEPTHZOO_MODULES`` naming a module that does not import: train.py and prune.py stop with one line and exit 2
    (as ``python -m zoo list`` does), not a traceback."""
    import zoo.models.registry as registry

    monkeypatch.setenv("DEPTHZOO_MODULES", "no_such_depthzoo_plugin")
    monkeypatch.setattr(registry, "_loaded_plugins", set())
    for script in ("train", "prune"):
        out = run_in_process(script, "logger=none")
        assert out.code == 2 and "Cannot import model module 'no_such_depthzoo_plugin'" in out.output
        assert "Traceback" not in out.output and BUG not in out.output


@pytest.mark.parametrize("content, message", [
    (None, "cannot be read (No such file or directory)"),
    ("not json at all", "is not JSON"),
    ("[1, 2]", "holds a JSON list"),
    ('{"a": 1}', "names no suite"),
    ('{"suite": "no_such_suite"}', "is not a suite or a study"),
    ('{"suite": "latency_table"}', "is not one that suite writes"),
    ('{"suites": {"latency_table": {"result": 3}}}', "is not an object"),
])
def test_benchmarks_judge_refuses_what_is_not_a_result(content, message, tmp_path, capsys):
    from benchmarks.__main__ import main

    path = tmp_path / "stored.json"
    if content is not None:
        path.write_text(content)
    assert main(["judge", str(path)]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and BUG not in err and len(err.strip().splitlines()) == 1


def test_an_unexpected_error_still_shows_its_traceback_and_says_it_is_a_bug(capsys):
    from zoo.errors import run_command

    def broken() -> int:
        raise KeyError("a bug")

    assert run_command(broken) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and "KeyError: 'a bug'" in err and BUG in err

    def refused() -> int:
        raise ZooError("what was wrong; allowed: this")

    assert run_command(refused) == 2 and capsys.readouterr().err == "error: what was wrong; allowed: this\n"


def test_the_latency_cli_refuses_a_runtime_the_family_cannot_before_timing(tmp_path, capsys):
    from zoo.latency.__main__ import main

    assert main(["model=retnet_tiny", "runtime=onnxruntime", f"cache_dir={tmp_path}"]) == 2
    assert "is not possible for model=retnet_tiny" in capsys.readouterr().err and not list(tmp_path.iterdir())


def test_the_python_api_refuses_with_the_allowed_values(tmp_path):
    """Empty or malformed calibration data, input sizes the model cannot take, plans and options of the wrong type:
    a ZooError that names what is allowed, never a silent fallback or PyTorch's raw error."""
    model = zoo.create_model("mobilenetv2_035", num_classes=10).eval()
    onnx = tmp_path / "m.onnx"
    cases = [
        (lambda: zoo.export(model, onnx, input_size=(3, 32, 32), quantize="int8", calibration=[]),
         "calibration=[] holds no batch"),
        (lambda: zoo.export(model, onnx, input_size=(3, 32, 32), quantize="int8",
                            calibration=[torch.randn(2, 1, 32, 32)]), "each batch is a tensor [B, 3, 32, 32]"),
        (lambda: zoo.export(model, onnx, input_size=(3, 32, 32), quantize="int8",
                            calibration=torch.randn(2, 3, 32, 32)), "calibration is a list of input batches"),
        (lambda: zoo.export(model, tmp_path / "m.pt2", format="torch_export", input_size=(1, 32, 32)),
         "input_size=(1, 32, 32) does not fit mobilenetv2_035"),
        (lambda: zoo.export(torch.nn.Linear(2, 2), onnx), "pass example=..."),
        (lambda: zoo.depth_units(model, input_size=(32,)), "it takes (3, 224, 224) per sample"),
        (lambda: zoo.apply_plan(model, ["blocks.2.1"]), "A plan is a mapping"),
        (lambda: zoo.apply_plan(model, {"remove": [], "merge": "yes"}), "'merge' is true or false"),
        (lambda: zoo.remove_units(model, "blocks.2.1"), "takes a list of unit names"),
        (lambda: zoo.create_model("mobilenetv2_035", num_classes="ten"), "an integer >= 0"),
    ]
    for call, message in cases:
        with pytest.raises(ZooError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
            call()
    assert not onnx.exists()


def test_a_job_records_its_threads_and_why(tmp_path):
    """results.json says how many torch threads trained and calibrated, and where the number came from (here the
    test process's OMP_NUM_THREADS=1; trainer.threads wins over it)."""
    from zoo.training.resources import set_threads

    base = tmp_path / "train"
    before = torch.get_num_threads()
    out = run_in_process("train", "data.image_size=16", "trainer.max_epochs=1", "trainer.limit_train_batches=1",
                         "trainer.progress=false", "logger=none", "model=mobilenetv2_035", "trainer.threads=2",
                         f"paths.log_dir={base}", f"hydra.run.dir={base / 'run'}")
    assert out.code == 0, out.output[-2000:]
    threads = json.loads((base / "run" / "results.json").read_text())["threads"]
    assert threads["threads"] == 2 and threads["from"] == "trainer.threads" and threads["jobs_sharing_cores"] == 1
    try:
        auto = set_threads(None, sharing=4, why="a test")
        assert auto["from"] == "OMP_NUM_THREADS" and auto["threads"] == int(os.environ["OMP_NUM_THREADS"])
    finally:
        torch.set_num_threads(before)


def test_a_job_takes_the_cores_its_scheduler_gave_it_not_the_machines(tmp_path, monkeypatch):
    """A SLURM job given one CPU (SLURM_CPUS_PER_TASK=1) trains on one thread and says where the number came from;
    a cgroup quota (v2 cpu.max, v1 cfs quota) caps the cores the same way; the fewest of all limits wins."""
    from zoo.training.resources import allocated_cores, set_threads

    before = torch.get_num_threads()
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    v2, v1 = tmp_path / "v2", tmp_path / "v1"
    v2.mkdir()
    (v2 / "cpu.max").write_text("150000 100000\n")  # 1.5 CPUs: rounded up to 2
    (v1 / "cpu").mkdir(parents=True)
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("100000\n")
    (v1 / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    mask = len(os.sched_getaffinity(0))
    try:
        assert allocated_cores(v2) == (min(mask, 2), "the CPU affinity mask" if mask <= 2 else "the cgroup's CPU quota")
        assert allocated_cores(v1) == (1, "the cgroup's CPU quota")
        (v2 / "cpu.max").write_text("max 100000\n")
        assert allocated_cores(v2) == (mask, "the CPU affinity mask")
        monkeypatch.setenv("SLURM_CPUS_PER_TASK", "1")
        given = set_threads(None)
        assert (given["threads"], given["cores"], given["cores_from"]) == (1, 1, "SLURM_CPUS_PER_TASK")
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_srun_tasks_become_one_process_group():
    """Tasks that ``srun --ntasks=2`` started get torchrun's variables from SLURM's (rank, world, local rank, the
    rendezvous on the step's first node, a port from the job id); a process torchrun started, or a one-task step,
    gets none."""
    from zoo.training.distributed import slurm_group_env

    step = {"SLURM_STEP_NUM_TASKS": "2", "SLURM_PROCID": "1", "SLURM_LOCALID": "1", "SLURM_STEP_TASKS_PER_NODE": "2",
            "SLURM_STEP_NODELIST": "", "SLURM_JOB_ID": "20017"}
    assert slurm_group_env(step) == {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
                                     "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "20017"}
    assert slurm_group_env({**step, "SLURM_STEP_TASKS_PER_NODE": "2(x3)", "SLURM_STEP_NUM_TASKS": "6"})["WORLD_SIZE"] \
        == "6"
    assert slurm_group_env({**step, "MASTER_ADDR": "head", "MASTER_PORT": "29500"})["MASTER_ADDR"] == "head"
    assert slurm_group_env({**step, "WORLD_SIZE": "2"}) == {}  # torchrun's own
    assert slurm_group_env({**step, "SLURM_STEP_NUM_TASKS": "1"}) == {}
    assert slurm_group_env({}) == {}


def test_squeue_answers_in_sacct_terms():
    """Where a cluster keeps no accounting, job states come from squeue, read as submitit reads sacct: array tasks,
    a pending array's range, and a requeued job's state."""
    pytest.importorskip("submitit")
    from zoo.jobs.slurm import SqueueWatcher

    shown = "JOBID|STATE|NODELIST\n8_0|RUNNING|vm\n8_1|COMPLETED|vm\n9_[0-2]|PENDING|\n10|REQUEUED|\n"
    info = SqueueWatcher().read_info(shown)
    assert info["8_0"]["State"] == "RUNNING" and info["8_1"]["State"] == "COMPLETED" and info["8_0"]["NodeList"] == "vm"
    assert {info[f"9_{i}"]["State"] for i in range(3)} == {"PENDING"} and info["10"]["State"] == "REQUEUED"



def test_jobs_waiting_for_a_shared_baseline_lend_their_cores(tmp_path):
    """A job that finds the baseline's lock held marks itself waiting until it gets it; the holder counts the live
    waiters (a dead one's marker is dropped) and takes their cores while it trains, and gives them back. A thread count
    asked for (trainer.threads) is never changed."""
    import threading
    import time

    from zoo.training.resources import WaitedLock, set_threads, share_cores

    path = tmp_path / ".lock"
    before = torch.get_num_threads()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    try:
        with WaitedLock(path) as holder:
            holder.waiting.mkdir()
            (holder.waiting / f"{socket.gethostname().replace('-', '_')}-{2**22 + 1}").touch()  # no such process
            got = threading.Event()
            waiter = threading.Thread(target=lambda: WaitedLock(path).__enter__() and got.set(), daemon=True)
            waiter.start()
            deadline = time.monotonic() + 10
            while holder.waiters() != 1 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert holder.waiters() == 1 and not got.is_set()
            assert len(list(holder.waiting.iterdir())) == 1  # the dead process's marker is gone
            set_threads(None, sharing=2, why="a test")
            assert share_cores(holder.waiters()) == cores and torch.get_num_threads() == cores
            assert share_cores(0) == max(1, cores // 2)
            set_threads(1, sharing=2)
            assert share_cores(1) == 1
        assert got.wait(10) and not list(holder.waiting.iterdir())  # the waiter got the lock and unmarked itself
    finally:
        torch.set_num_threads(before)


def test_a_target_beyond_the_ceiling_is_refused_before_the_baseline_trains(tmp_path):
    """A target no plan can reach is refused from the latency table of the untrained architecture, before the
    baseline trains (no baseline checkpoint is written), in the words the search uses; the table it built is the one
    the job would use (cached by architecture)."""
    from ..helpers import TINY_PRUNE

    outcome = run_in_process("prune", *TINY_PRUNE, "prune.target_speedup=50", f"hydra.run.dir={tmp_path / 'run'}",
                             "logger=none", f"paths.log_dir={tmp_path / 'outputs'}",
                             f"prune.cache_dir={tmp_path / 'cache'}")
    assert outcome.code == 2, outcome.output[-3000:]
    assert "prune.target_speedup=50.0 cannot be reached: removing and merging every removable unit gives at most" \
        in outcome.output
    assert "ceiling ..." in outcome.output and "baseline ..." not in outcome.output  # the phase before the baseline
    assert not list((tmp_path / "outputs").glob("baselines/*/checkpoints/*.safetensors"))
    assert list((tmp_path / "cache").rglob("*.json"))  # the table, kept for the job that asks for less


def test_a_slurm_sweep_without_sbatch_is_refused_before_any_job(tmp_path, monkeypatch):
    """hydra/launcher=slurm on a machine without sbatch: one line saying what to use instead, exit 2, nothing run."""
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    from ..helpers import TINY_PRUNE

    monkeypatch.setenv("PATH", str(tmp_path))  # (a folder without sbatch)
    outcome = run_in_process("prune", "-m", *TINY_PRUNE, "hydra/launcher=slurm", "hydra.launcher.partition=debug",
                             f"paths.log_dir={tmp_path / 'outputs'}", "prune.target_speedup=1.25,1.5")
    assert outcome.code == 2, outcome.output[-2000:]
    assert "hydra/launcher=slurm submits with sbatch, which this machine does not have" in outcome.output
    assert "Traceback" not in outcome.output and not list(tmp_path.rglob("results.json"))


# The prune request's stages, in the order read_request checks them: (override, what its refusal says).
STAGED_FAULTS = [
    ("prune.bins=1", "prune.bins"),  # 1. ranges
    ("prune.search=annealing", "allowed: interaction"),  # 1. the prune job's choices
    ("prune.plan=/nonexistent/plan.json", "Cannot read plan file"),  # 2. files it names
    ("prune.workload=decode", "needs a language model with a decode state"),  # 3. what the family can do
    ("prune.device=cuda:7", "cuda"),  # 5. what this machine has
]


def test_the_prune_request_is_read_once_typed_and_checked_in_the_order_of_what_can_fail(tmp_path):
    """read_request turns the composed config into typed settings, the model's entry, family and tag, the runtimes
    and timing settings and the given plan, once; with two faults of different stages, the earlier stage's is the
    one refused (the order in its docstring), whichever way round they are given (neighbouring stages)."""
    from benchmarks.common import compose
    from zoo.jobs.prune_config import PruneSettings
    from zoo.jobs.prune_request import read_request
    from zoo.latency import TableSettings

    from ..helpers import TINY_PRUNE

    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"remove": ["blocks.2.1"], "merge": True}))
    base = [*TINY_PRUNE, f"paths.log_dir={tmp_path / 'outputs'}", f"prune.cache_dir={tmp_path / 'cache'}"]
    request = read_request(compose([*base, f"prune.plan={plan}", "prune.quantize=int8"], tmp_path / "run"))
    assert isinstance(request.prune, PruneSettings) and isinstance(request.table, TableSettings)
    assert request.model == "mobilenetv2_035" and request.family.name == "mobilenetv2" and request.tag is None
    tagged = read_request(compose([*base, "model=mobilenetv2_100", "model.tag=ra_in1k"], tmp_path / "run"))
    assert tagged.tag == "ra_in1k" and tagged.data_model_cfg["input_size"] == (3, 224, 224)
    assert request.plan == {"remove": ["blocks.2.1"], "merge": True} and request.prune.quantize == "int8"
    assert (request.planning_runtime, request.reported_runtimes) == ("onnxruntime_int8", ("onnxruntime",))
    assert request.table.runtime == "onnxruntime_int8" and request.device.type == "cpu"
    for (early, says), (late, _) in zip(STAGED_FAULTS, STAGED_FAULTS[1:]):
        for given in ([early, late], [late, early]):
            with pytest.raises(ZooError) as refused:
                read_request(compose([*base, *given], tmp_path / "run"))
            assert says in str(refused.value), (given, str(refused.value))
