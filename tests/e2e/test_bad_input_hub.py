"""The bad-input catalogue: every user error of the command lines and the public API is one clear message (what was
wrong, what is allowed), exit status 2 for the command lines, no traceback, and nothing overwritten.

train.py and prune.py cases run their ``__main__`` path in this process (:func:`helpers.run_in_process`): the same
code as the command line without the interpreter start-up. Each runs against a directory that already holds another
run's results, which must be byte-identical afterwards; cases that can only fail once the run owns a directory (the
data is read) use a fresh directory and must leave no results in it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import zoo
from zoo.jobs import runs


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    """Inputs the cases point at: another run's directory, checkpoints, weight files, plans, image folders."""
    base = tmp_path_factory.mktemp("bad-input")
    victim = base / "victim"
    runs.write_record(victim, "train", {"model": {"name": "tresnet_m"}, "trainer": {"seed": 7}})
    (victim / "results.json").write_text('{"metrics": {"val/acc1": 91.0}}')
    (victim / "checkpoints").mkdir()
    (victim / "checkpoints" / "best.safetensors").write_bytes(b"weights of another run")
    prune_victim = base / "prune-victim"
    runs.write_record(prune_victim, "prune", {"model": {"name": "tresnet_m"}})
    (prune_victim / "results.json").write_text("{}")
    (prune_victim / "plan.json").write_text('{"remove": []}')
    mbv2 = zoo.create_model("mobilenetv2_035", num_classes=10)
    paths = {"victim": victim, "prune_victim": prune_victim, "base": base,
             "ckpt": zoo.save_checkpoint(mbv2, base / "mbv2_035.safetensors"),
             "other_ckpt": zoo.save_checkpoint(zoo.create_model("mobilenetv2_050", num_classes=10),
                                               base / "mbv2_050.safetensors")}
    timm_file = base / "timm_format.safetensors"
    save_file({k: v.contiguous() for k, v in mbv2.state_dict().items()}, str(timm_file))
    paths["timm_file"] = timm_file
    paths["timm_050"] = base / "timm_mobilenetv2_050.pth"
    torch.save(zoo.create_model("mobilenetv2_050", num_classes=10).state_dict(), paths["timm_050"])
    paths["timm_1000"] = base / "timm_mobilenetv2_035_in1k.pth"
    torch.save(zoo.create_model("mobilenetv2_035").state_dict(), paths["timm_1000"])
    truncated = base / "truncated.safetensors"
    truncated.write_bytes(paths["ckpt"].read_bytes()[:5000])
    paths["truncated"] = truncated
    paths["marker"] = base / "pickle-ran"

    class Payload:  # unpickling it would create the marker file
        def __reduce__(self):
            return (os.system, (f"touch {paths['marker']}",))

    torch.save({"conv_stem.weight": torch.zeros(1), "extra": Payload()}, base / "evil.pth")
    paths["evil"] = base / "evil.pth"
    (base / "bad_plan.json").write_text('{"remove": ["blocks.2.1"')
    (base / "unknown_plan.json").write_text('{"remove": ["body.layer1.0"]}')
    (base / "plan_keys.json").write_text('{"remove": [], "prune": true}')
    for split in ("train", "val"):
        for cls in ("a", "b"):
            folder = base / "images" / split / cls
            folder.mkdir(parents=True)
            from PIL import Image

            Image.new("RGB", (20, 20), color=(10 * len(cls), 50, 90)).save(folder / "ok.png")
    (base / "images" / "val" / "a" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    (base / "notes.txt").write_text("real text " * 400)
    from zoo.training import state

    state.save_state({"model_name": "mobilenetv2_035", "step": 1}, base / "last.state.pt")
    return paths


# ----------------------------------------------------------------------------------------------- train.py


# ----------------------------------------------------------------------------------------------- prune.py


def test_hub_id_that_is_not_cached_fails_at_once_without_offline_mode(tmp_path):
    """Without HF_HUB_OFFLINE a typo'd hub id must not spend a minute in download retries: it fails at once with the
    download command (no network here), or says the repo does not exist (where the Hub is reachable)."""
    import subprocess
    import sys
    import time

    from ..helpers import env_for

    env = {k: v for k, v in env_for(tmp_path).items() if k != "HF_HUB_OFFLINE"}
    env["HF_HOME"] = str(tmp_path / "hf")
    code = ("import zoo\ntry:\n    zoo.create_model('mobilenetv2_035', pretrained='timm/mobilenetv2_035.no_such_tag')\n"
            "except zoo.WeightsError as exc:\n    print(exc)")
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    elapsed = time.perf_counter() - start
    assert ("the Hub cannot be reached from here" in proc.stdout and "hf download" in proc.stdout) or \
        "does not exist on the Hugging Face Hub" in proc.stdout, proc.stdout + proc.stderr[-2000:]
    assert elapsed < 25, f"took {elapsed:.0f} s"
