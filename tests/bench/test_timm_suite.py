"""timm's own model tests pass on the zoo's models wherever they pass on timm's.

Not copied here: the installed timm's source distribution (``pip download --no-binary :all: timm==<version>``, kept
in a cache keyed by the version) ships ``tests/test_models.py``; it runs twice on a spread of architectures, once on
timm's models (the control) and once with its ``create_model`` routed through ``zoo.create_model``
(``tests/timm_suite/depthzoo_timm_route.py``: ``timm/<name>`` for any timm model, the declared families by their
own names), with no fallback to timm's builder. Tests that need published weights fail in the control here (no
hub access) and are compared like any other: only what passes on timm's models is asked of ours.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest
import timm

from ..helpers import ROOT

# Discovered timm families: CNNs, ViTs, hybrids, MLPs, metaformers (14 timm model files); then the declared families,
# built by their own classes (zoo.create_model("mobilenetv2_100")) against timm's same-named models.
SPREAD = ("resnet18", "deit_tiny_patch16_224", "convnext_atto", "efficientnet_b0", "mobilenetv3_small_050",
          "regnetx_002", "poolformerv2_s12", "pvt_v2_b0", "edgenext_xx_small", "mixer_s16_224", "ghostnet_050",
          "mambaout_femto", "levit_128s", "efficientvit_b0", "mobilenetv2_100", "tresnet_m", "resnetv2_50x1_bit")
ROUTE = ROOT / "tests" / "timm_suite"


def timm_source(cache: Path) -> Path:
    """The installed timm's source distribution (downloaded once per version, written atomically)."""
    archive = cache / f"timm-{timm.__version__}.tar.gz"
    if not archive.exists():
        cache.mkdir(parents=True, exist_ok=True)
        staging = cache / f".download-{os.getpid()}"
        staging.mkdir(exist_ok=True)
        done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "-q",
                               "-d", str(staging), f"timm=={timm.__version__}"], capture_output=True, text=True)
        assert done.returncode == 0, f"cannot download timm's source distribution: {done.stderr[-500:]}"
        next(staging.glob("timm-*.tar.gz")).replace(archive)
    return archive


def run_suite(source: Path, workdir: Path, route: bool) -> tuple[dict[str, str], dict[str, int]]:
    """Each test of timm's tests/test_models.py on the spread, with its outcome, and how many models the zoo built
    for it."""
    report, log = workdir / f"junit-{route}.xml", workdir / f"route-{route}.jsonl"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "DEPTHZOO_ROUTE": "1" if route else "0",
           "DEPTHZOO_TIMM_ARCHS": ",".join(SPREAD), "DEPTHZOO_ROUTE_LOG": str(log),
           "PYTHONPATH": os.pathsep.join([str(ROUTE), str(ROOT), os.environ.get("PYTHONPATH", "")])}
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "depthzoo_timm_route", "-p", "no:cacheprovider",
                    "-n", "2", f"--junitxml={report}", "tests/test_models.py"], cwd=source, env=env,
                   capture_output=True, text=True, timeout=1500)
    outcomes = {}
    for case in ElementTree.parse(report).iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        kinds = {child.tag for child in case}
        outcomes[name] = ("failed" if kinds & {"failure", "error"} else "skipped" if "skipped" in kinds else "passed")
    builds = {}
    for line in log.read_text().splitlines() if log.exists() else []:
        row = json.loads(line)
        builds[row["test"].replace("tests/test_models.py::", "tests.test_models::")] = row["zoo_builds"]
    return outcomes, builds


@pytest.mark.timeout(3300)  # timm's suite twice on 17 architectures: 5-7 minutes each alone on 2 cores
def test_timms_model_tests_pass_on_ours_wherever_they_pass_on_timms(tmp_path):
    archive = timm_source(Path(os.environ.get("DEPTHZOO_CACHE", Path.home() / ".cache" / "depthzoo")) / "timm-sdist")
    with tarfile.open(archive) as tar:
        tar.extractall(tmp_path, filter="data")
    source = next(tmp_path.glob("timm-*"))
    control, _ = run_suite(source, tmp_path, route=False)
    ours, builds = run_suite(source, tmp_path, route=True)
    passed = sorted(t for t, outcome in control.items() if outcome == "passed")
    assert len(passed) >= 100, f"the control passed only {len(passed)} tests: the suite did not run"
    lost = [t for t in passed if ours.get(t) != "passed"]
    table = {arch: [0, 0] for arch in SPREAD}
    for test in passed:
        table[arch_of(test)][0] += 1
        table[arch_of(test)][1] += ours.get(test) == "passed"
    print(json.dumps({"timm": timm.__version__, "passed_on_timm": len(passed),
                      "passed_on_ours": sum(ours.get(t) == "passed" for t in passed), "by_architecture": table}))
    assert not lost, f"{len(lost)} of timm's tests pass on timm's models but not on ours: {lost[:10]}"
    unrouted = [t for t in passed if builds.get(t, 0) == 0]
    assert not unrouted, f"{len(unrouted)} tests built no model through the zoo: {unrouted[:5]}"


def arch_of(test: str) -> str:
    """The architecture a test of the spread is parametrized by (``test_model_forward[1-resnet18]``)."""
    params = test.partition("[")[2].rstrip("]")
    found = [a for a in SPREAD if any(part.partition(".")[0] == a for part in params.split("-"))]
    assert found, f"{test} names no architecture of the spread"
    return found[0]
