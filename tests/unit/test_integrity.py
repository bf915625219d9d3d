"""Study integrity: run identity and directory reuse, unique run directories, loud failures, one way to prune,
caches that cannot lie, verdicts that are computed."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

import zoo
from zoo.errors import CorruptFileError, RunConflictError
from zoo.files import read_sealed_json, write_sealed_json
from zoo.jobs import runs
from zoo.jobs.cli import job_dir_name

from ..helpers import snapshot

CONFIG = {"model": {"name": "mobilenetv2_035"}, "trainer": {"seed": 1, "progress": True, "resume": None},
          "paths": {"output_dir": "/a"}, "logger": {"mode": "offline"}}


# ------------------------------------------------------------------------------------------- run identity
def test_fingerprint_ignores_outputs_and_logging_but_not_what_determines_results():
    moved = {**CONFIG, "paths": {"output_dir": "/b"}, "logger": {"mode": "disabled"},
             "trainer": {**CONFIG["trainer"], "progress": False, "resume": "auto"}}
    assert runs.fingerprint(moved) == runs.fingerprint(CONFIG)
    reseeded = {**CONFIG, "trainer": {**CONFIG["trainer"], "seed": 2}}
    assert runs.fingerprint(reseeded) != runs.fingerprint(CONFIG)
    assert runs.describe_differences(runs.determining(CONFIG), runs.determining(reseeded)).startswith(
        "trainer.seed: 1 -> 2")


def test_a_directory_is_reused_only_by_the_same_config(tmp_path):
    kwargs = {"finished": "results.json", "force_hint": "force=true", "dir_hint": "a new dir"}
    assert runs.check_reuse(tmp_path, "prune", CONFIG, **kwargs) == "fresh"
    other = {**CONFIG, "trainer": {**CONFIG["trainer"], "seed": 3}}
    runs.write_record(tmp_path, "prune", other)
    assert runs.check_reuse(tmp_path, "prune", CONFIG, **kwargs) == "fresh"  # a record alone protects nothing
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "run.json").unlink()
    with pytest.raises(RunConflictError, match="no recorded config"):  # results of an unknown run
        runs.check_reuse(tmp_path, "prune", CONFIG, **kwargs)
    runs.write_record(tmp_path, "prune", CONFIG)
    assert runs.check_reuse(tmp_path, "prune", CONFIG, **kwargs) == "resume"
    write_sealed_json(tmp_path / "results.json", {"fingerprint": runs.fingerprint(CONFIG)})
    assert runs.check_reuse(tmp_path, "prune", CONFIG, **kwargs) == "finished"
    (tmp_path / "results.json").write_text((tmp_path / "results.json").read_text().replace("}", ', "x": 1}'))
    assert runs.check_reuse(tmp_path, "prune", CONFIG, **kwargs) == "resume"  # damaged results: not finished
    with pytest.raises(RunConflictError, match=r"another config \(trainer.seed: 1 -> 3\).*force=true"):
        runs.check_reuse(tmp_path, "prune", other, **kwargs)
    with pytest.raises(RunConflictError, match="it is a prune run, this is a train run"):
        runs.check_reuse(tmp_path, "train", CONFIG, **kwargs)
    with pytest.raises(RunConflictError, match="already holds a prune run of this config"):
        runs.check_reuse(tmp_path, "prune", CONFIG, **{**kwargs, "new_only": True, "finished": None})
    (tmp_path / "run.json").write_text("{}")
    with pytest.raises(RunConflictError, match="damaged run record"):
        runs.check_reuse(tmp_path, "prune", CONFIG, **kwargs)


def test_the_contents_of_named_files_are_part_of_the_identity(tmp_path):
    plan = tmp_path / "plan.json"
    plan.write_text('{"remove": []}')
    config = {**CONFIG, "prune": {"plan": str(plan)}}
    before = runs.fingerprint(runs.with_inputs(config))
    assert runs.fingerprint(runs.with_inputs(config)) == before
    plan.write_text('{"remove": ["blocks.2.1"]}')  # same path, other contents: another config
    assert runs.fingerprint(runs.with_inputs(config)) != before


def test_refused_claim_changes_nothing_and_force_discards(tmp_path):
    runs.write_record(tmp_path, "train", CONFIG)
    (tmp_path / "results.json").write_text("{}")
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "last.safetensors").write_bytes(b"x")
    before = snapshot(tmp_path)
    other = {**CONFIG, "model": {"name": "tresnet_m"}}
    (tmp_path / "plan.json").write_text("{}")  # an output of another kind of run: force removes it too
    before = snapshot(tmp_path)
    with pytest.raises(RunConflictError):
        runs.claim(tmp_path, "train", other)
    assert snapshot(tmp_path) == before
    taken = runs.claim(tmp_path, "train", other, force=True)
    taken.release()
    assert not [p for p in ("results.json", "checkpoints", "plan.json") if (tmp_path / p).exists()]
    assert runs.read_record(tmp_path)["config"]["model"]["name"] == "tresnet_m"


def test_job_directories_are_named_after_their_determining_overrides():
    a = job_dir_name(["prune.target_speedup=1.5", "prune.search=dp", "logger=none", "paths.log_dir=/x",
                      "prune.force=true"])
    assert a == "prune.search=dp,prune.target_speedup=1.5"  # sorted; location, logging and reuse switches left out
    assert job_dir_name(["trainer.log_every=5"]) != job_dir_name(["trainer.log_every=10"])
    assert job_dir_name(["prune.target_speedup=1.5", "prune.search=dp"]) == a
    assert job_dir_name(["prune.search=dp", "prune.target_speedup=2.0"]) != a
    odd = job_dir_name(["data.files=[a/b.txt]", "++prune.table={warmup_s: 0.2}"])
    assert "/" not in odd and " " not in odd and "~" in odd
    assert odd != job_dir_name(["data.files=[a_b.txt]", "++prune.table={warmup_s: 0.2}"])
    assert len(job_dir_name([f"+model.overrides.k{i}={i}" for i in range(40)])) <= 100


# ------------------------------------------------------------------------------------- one way to prune
FAMILIES = zoo.list_families()


def _random_plan(model: torch.nn.Module, rng: random.Random) -> list[str]:
    units = [u for u in model.depth_unit_specs() if u.removable]
    chosen = rng.sample(units, k=max(1, len(units) // 3))
    blocks = {u.name for u in chosen if u.kind != "act"}
    return [u.name for u in chosen if not any(u.name.startswith(b + ".") for b in blocks)]


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
@pytest.mark.parametrize("way", ["remove_units", "merged", "linearised", "blended", "two_plans", "fused"])
def test_every_way_to_prune_saves_and_loads_bit_identically(family, way, tmp_path):
    from ..helpers import example_batch, randomise_norm_stats, small_model

    rng = random.Random(f"{family.small}-{way}")
    torch.manual_seed(0)
    options = {"num_classes": 7} if family.task == "classification" else {}
    model = randomise_norm_stats(small_model(family, **options)).eval()
    remove = _random_plan(model, rng)
    if way == "remove_units":
        pruned = zoo.remove_units(model, remove)
    elif way == "blended":
        pruned = zoo.apply_plan(model, {"remove": remove, "merge": False}, inplace=False, blend=True)
        zoo.pruning.surgery.set_linearisation(pruned, 0.37)
    elif way == "two_plans":  # a pruned model pruned again records both plans
        once = zoo.apply_plan(model, {"remove": remove}, inplace=False)
        second = _random_plan(once, rng)
        pruned = zoo.apply_plan(once, {"remove": second})
        remove = remove + second
    else:
        pruned = zoo.apply_plan(model, {"remove": remove, "merge": way != "linearised"}, inplace=False)
        if way == "fused":
            pruned = zoo.fuse(pruned)
    pruned.eval()
    assert pruned.zoo_plan["remove"] == remove
    loaded = zoo.load(zoo.save_checkpoint(pruned, tmp_path / "pruned.safetensors")).eval()
    x, _ = example_batch(family)
    with torch.no_grad():
        assert torch.equal(pruned(x), loaded(x))


def test_no_import_cycle_between_depth_and_surgery():
    import ast

    def imported(module: str) -> set[str]:
        tree = ast.parse((Path(zoo.__file__).parent / f"{module}.py").read_text())
        return {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}

    assert "..models.depth" in {f"..{m}" for m in imported("pruning/surgery")}
    assert not any("surgery" in m or "pruning" in m for m in imported("models/depth"))


# --------------------------------------------------------------------------------- caches that cannot lie
def test_sealed_json_detects_truncation_edits_and_foreign_files(tmp_path):
    path = write_sealed_json(tmp_path / "x.json", {"a": [1, 2], "b": "c"})
    assert read_sealed_json(path) == {"a": [1, 2], "b": "c"}
    text = path.read_text()
    for damaged in (text[: len(text) // 2], text.replace('"c"', '"d"'), json.dumps({"a": [1, 2]})):
        path.write_text(damaged)
        with pytest.raises(CorruptFileError):
            read_sealed_json(path)


def test_importance_cache_that_covers_other_segments_is_recomputed(tmp_path, caplog):
    from zoo.pruning.importance import cached_scores
    from zoo.pruning.surgery import segments

    segs = segments(zoo.create_model("mobilenetv2_035"))
    scores = [{v: float(len(v)) for v in seg.variants()} for seg in segs]
    calls = []

    def compute():
        calls.append(1)
        return scores

    key = {"weights": "abc", "score": "loss"}
    assert cached_scores(tmp_path, key, segs, compute) == (scores, False)
    assert cached_scores(tmp_path, key, segs, compute) == (scores, True) and len(calls) == 1
    (path,) = tmp_path.glob("importance-*.json")
    payload = read_sealed_json(path)
    write_sealed_json(path, {**payload, "scores": payload["scores"][:2]})  # valid JSON, 2 of 17 segments
    assert cached_scores(tmp_path, key, segs, compute) == (scores, False) and len(calls) == 2
    assert "holds 2 segments, the model has 17" in caplog.text
    path.write_text(path.read_text().replace("1.0", "0.5", 1))  # edited: the checksum no longer matches
    assert cached_scores(tmp_path, key, segs, compute)[1] is False and len(calls) == 3


