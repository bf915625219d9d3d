"""A hub id that is neither cached nor reachable, without offline mode: it must fail at once (a real process, the
hub client's own retries), with the command to download it elsewhere. The rest of the bad-input catalogue runs in
process: ``tests/unit/test_bad_input.py``."""

from __future__ import annotations


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
