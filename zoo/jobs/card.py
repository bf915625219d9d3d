"""The model card of a pruned checkpoint, in Hugging Face's format (``huggingface_hub.ModelCard``: a YAML metadata
block, then Markdown): the base model and where it came from, the plan, the speed-ups measured per device and
runtime, the quality before and after, the command that made it, and how to load it (depthzoo; transformers + fla
for an ``hf`` export; onnxruntime for an ONNX export). ``prune.py`` writes it as ``README.md`` beside
``pruned.safetensors`` (and into the ``hf/`` folder), so either folder is ready for ``huggingface-cli upload``."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from ..files import atomic_write

METRICS = {"val/acc1": ("accuracy", "top-1 accuracy (%)"), "val/acc5": ("accuracy", "top-5 accuracy (%)"),
           "val/ppl": ("perplexity", "perplexity"), "val/loss": ("loss", "validation loss")}


def base_model(results: dict[str, Any]) -> str | None:
    """The Hugging Face id of the weights pruning started from (a timm tag's hub id, or a hub id given as the
    checkpoint), or None when the baseline is a local file or was trained by depthzoo."""
    from ..weights.tags import pretrained_cfg

    if results.get("tag"):
        hub = pretrained_cfg(results["model"], results["tag"]).get("hf_hub_id") or ""
        return hub.removeprefix("hf-hub:") or None
    source = str(results["baseline"].get("source") or "")
    looks_like_hub_id = source.count("/") == 1 and not Path(source).exists() and not source.startswith((".", "/"))
    return source if looks_like_hub_id else None


def command_line(overrides: list[str] | None) -> str:
    """The ``prune.py`` command with the run's overrides, quoted for a shell."""
    return " ".join(["python prune.py", *(shlex.quote(o) for o in overrides or [])])


def _metrics_table(results: dict[str, Any]) -> list[str]:
    rows = ["| metric | baseline | pruned |", "|---|---|---|"]
    for key, (_, label) in METRICS.items():
        before, after = results["baseline"]["metrics"].get(key), results["pruned"]["metrics"].get(key)
        if before is not None and after is not None:
            rows.append(f"| {label} | {before:.2f} | {after:.2f} |")
    return rows


def _speed_table(results: dict[str, Any]) -> list[str]:
    """One row per runtime the plan was measured in (``results["runtimes"]``), the one it was chosen in marked."""
    device = results["condition"].get("device_name", results["device"])
    batch = results["condition"].get("batch_size")
    runtimes = results.get("runtimes") or {results["condition"].get("runtime", "eager"): {
        "baseline_ms": results["baseline"]["latency_ms"], "pruned_ms": results["pruned"]["latency_ms"],
        "measured_speedup": results["measured_speedup"], "chosen_here": True}}
    rows = ["| device | runtime | batch | baseline (ms) | pruned (ms) | measured speed-up |",
            "|---|---|---|---|---|---|"]
    for runtime, row in runtimes.items():
        chosen = " (planned here)" if row.get("chosen_here") else ""
        rows.append(f"| {device} | {runtime}{chosen} | {batch} | {row['baseline_ms']:.3f} | {row['pruned_ms']:.3f} | "
                    f"{row['measured_speedup']:.2f}x |")
    return rows


def _how_to_load(results: dict[str, Any], task: str) -> list[str]:
    lines = ["```python", "import zoo", "", 'model = zoo.load("pruned.safetensors")  # pip install depthzoo', "```"]
    export = results.get("export") or {}
    if export.get("format") == "hf" and export.get("passed") is not False:
        lines += ["", "With transformers and flash-linear-attention (this folder as it is):", "", "```python",
                  "import fla  # registers fla's models with transformers", "from transformers import "
                  "AutoModelForCausalLM", "", 'model = AutoModelForCausalLM.from_pretrained("<this folder or repo>")',
                  "```"]
    if export.get("format") == "onnx" and export.get("passed"):
        axes = export.get("dynamic_axes") or {}
        lines += ["", f"With onnxruntime (`{Path(export['path']).name}`, opset {export.get('opset')}, dynamic axes "
                      f"{axes}):", "", "```python", "import onnxruntime as ort", "",
                  f'session = ort.InferenceSession("{Path(export["path"]).name}")',
                  "logits = session.run(None, {session.get_inputs()[0].name: inputs})[0]", "```"]
    return lines


def _baseline_warning(results: dict[str, Any]) -> list[str]:
    """A warning above the quality table when the baseline did not learn (``results.json`` ``baseline.health``)."""
    health = results["baseline"].get("health") or {}
    if health.get("trained", True):
        return []
    return [f"> **Warning: the baseline did not learn** ({health.get('why')}). The accuracy below says nothing about "
            f"what pruning costs.", ""]


def model_card(results: dict[str, Any], overrides: list[str] | None, task: str) -> Any:
    """The card of a prune run's results (``results.json``), as a ``huggingface_hub.ModelCard``."""
    from huggingface_hub import EvalResult, ModelCard, ModelCardData

    name = f"{results['model']}-depth-pruned-{results['measured_speedup']:.2f}x"
    pipeline = "text-generation" if task == "language_model" else "image-classification"
    evals = [EvalResult(task_type=pipeline, dataset_type=results["data"], dataset_name=results["data"],
                        dataset_split="validation", metric_type=kind, metric_name=label, metric_value=round(value, 4))
             for key, (kind, label) in METRICS.items()
             if (value := results["pruned"]["metrics"].get(key)) is not None]
    base = base_model(results)
    data = ModelCardData(base_model=base, library_name="depthzoo", pipeline_tag=pipeline, model_name=name,
                         tags=["depthzoo", "depth-pruning", results["model"]], eval_results=evals or None)
    removed = results["plan"]["remove"]
    source = base or results["baseline"].get("source") or "trained by depthzoo"
    body = [
        f"# {name}", "",
        f"`{results['model']}` depth-pruned by depthzoo: "
        f"{len(removed)} depth units removed (blocks, sub-layers or activations, with the convolutions around a "
        f"removed activation merged), chosen by the `{results['search']}` search on a latency table measured on "
        f"{results['condition'].get('device_name', results['device'])} for a target of "
        f"{results['target_speedup']}x, then fine-tuned on `{results['data']}`.", "",
        f"- **Base model:** {source}", f"- **Task data:** `{results['data']}`",
        f"- **Parameters:** {results['baseline']['params']:,} -> {results['pruned']['params']:,}", "",
        "## Speed (measured side by side with the base model)", "", *_speed_table(results), "",
        "## Quality", "", *_baseline_warning(results), *_metrics_table(results), "",
        "## Plan", "", "Removed depth units (`zoo.apply_plan` replays them on the base model):", "",
        *(f"- `{unit}`" for unit in removed), "",
        "## How it was made", "", "```bash", command_line(overrides), "```", "",
        "The run's `results.json` holds every measurement; `.hydra/config.yaml` the whole configuration.", "",
        "## How to load it", "", *_how_to_load(results, task), ""]
    return ModelCard(f"---\n{data.to_yaml()}\n---\n\n" + "\n".join(body))


def write_model_card(folder: str | Path, results: dict[str, Any], overrides: list[str] | None, task: str) -> Path:
    """``README.md`` in `folder` (written atomically); returns its path."""
    text = str(model_card(results, overrides, task))
    return atomic_write(Path(folder) / "README.md", lambda tmp: tmp.write_text(text))
