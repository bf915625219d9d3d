"""Which transformers causal LMs the zoo prunes (issue 61): every model type ``AutoModelForCausalLM`` knows, built
here from its config at a small size with random weights (no download), through ``zoo.models.hf_lm``.

Per model type: the config builds at the small size? the model builds (under a parameter limit)? its decoder layers
are found? how many layers and sub-layers are proven removable, or why not? every offered unit rechecked by a second
computation (the zoo's removal applied by ``apply_plan`` against that unit's parameters zeroed, float32, 1e-4 of the
logits' scale: none may fail)? one decode step with the model's KV cache equal to the whole sequence's last token?
a whole-layer plan written as a stock folder that reloads with equal logits? A model type that fails a step is a row
with the step and the reason (a model-specific refusal), not a crash.

    python -m studies.hf_census --out results              # about 10 minutes on 2 cores
    python -m studies.hf_census --types llama,gemma2 --out /tmp
"""

from __future__ import annotations

import copy
import tempfile
import time
import traceback
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import CommandLine, count, machine, names_from, out_folder, results_dir, write_result
from zoo.errors import run_command

SMALL = {"vocab_size": 128, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "intermediate_size": 128, "max_position_embeddings": 128, "head_dim": 16,
         "moe_intermediate_size": 32, "num_experts": 4, "num_local_experts": 4, "n_routed_experts": 4,
         "num_experts_per_tok": 2, "shared_expert_intermediate_size": 32, "q_lora_rank": 16, "kv_lora_rank": 16,
         "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 16}
MAX_PARAMS = 5_000_000  # a config whose other sizes stay large at these settings is left out, said so
TOLERANCE = 1e-4


def _logits(model: torch.nn.Module, tokens: torch.Tensor, **kwargs: Any) -> torch.Tensor:
    with torch.no_grad():
        return model.eval()(tokens, **kwargs).float()


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and float((a - b).abs().max()) <= TOLERANCE * (float(b.abs().max()) or 1.0)


def small_config(config: Any) -> Any:
    """`config` with each of :data:`SMALL`'s sizes it has (a field or an alias) set, where it can be set, and its
    per-layer lists (``layer_types``, ...) cut to the layers it now has, as a consistent config has them."""
    count = getattr(config, "num_hidden_layers", None)
    for key, value in config.to_dict().items():
        if isinstance(value, list) and isinstance(count, int) and len(value) == count and key != "architectures":
            setattr(config, key, value[:SMALL["num_hidden_layers"]])
    for key, value in SMALL.items():
        if hasattr(config, key) and not isinstance(getattr(config, key), (list, dict)):
            try:
                setattr(config, key, value)
            except (AttributeError, ValueError):  # a derived size (a property without a setter): left to derive
                pass
    return config


def examine(model_type: str) -> dict[str, Any]:
    """One model type's row (module docstring)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    import zoo
    from zoo.models import hf_causal
    from zoo.models.hf_lm import HFCausalLM

    row: dict[str, Any] = {"type": model_type}
    step = "config"
    try:
        config = small_config(AutoConfig.for_model(model_type))
        step = "size"
        with torch.device("meta"):
            params = sum(p.numel() for p in AutoModelForCausalLM.from_config(config).parameters())
        row["params"] = params
        if params > MAX_PARAMS:
            return {**row, "step": "size", "reason": f"{params / 1e6:.1f} M parameters at the census's small "
                    f"settings (limit {MAX_PARAMS / 1e6:.0f} M): its config has other size fields"}
        step = "build"
        torch.manual_seed(0)
        lm = AutoModelForCausalLM.from_config(config).float().eval()
        step = "layers"
        proofs = hf_causal.prove_layers(lm, length=8)
        model = HFCausalLM(lm, proofs, 8)
        units = [u for u in model.depth_unit_specs() if u.removable]
        row.update(layers=len(model.proofs), layers_removable=sum(u.kind == "block" for u in units),
                   sublayers_removable=sum(u.kind == "sublayer" for u in units),
                   refusals=sorted(set(model.refusals().values()))[:3])
        if not units:
            return {**row, "step": "prunable", "reason": (row["refusals"] or ["no unit proven"])[0]}
        step = "recheck"
        tokens = torch.randint(0, config.vocab_size, (2, 8), generator=torch.Generator().manual_seed(1))
        failing = []
        for unit in units:
            zeroed = copy.deepcopy(model)
            with torch.no_grad():
                for param in zeroed.get_submodule(unit.name).parameters():
                    param.zero_()
            removed = zoo.apply_plan(model, {"remove": [unit.name]}, inplace=False)
            if not _close(_logits(removed, tokens), _logits(zeroed, tokens)):
                failing.append(unit.name)
        row["recheck_failed"] = failing
        step = "decode"
        try:
            token, inputs = tokens[:, -1:], model.decode_inputs(2, 7)  # (its own check: refused where not equal)
            stepped = _logits(model, token, **inputs)
            whole = _logits(model, torch.cat([inputs["state"].prompt, token], 1))[:, -1:]
            row["decode"] = "equal" if _close(stepped, whole) else "differs"
        except Exception as exc:  # noqa: BLE001 - a model without a usable KV cache: prefill only, said so
            row["decode"] = f"refused: {type(exc).__name__}: {str(exc)[:160]}"
        step = "stock"
        whole_layers = [u.name for u in units if u.kind == "block"]
        if whole_layers and len(model.proofs) > 1:
            pruned = zoo.apply_plan(model, {"remove": whole_layers[:1]}, inplace=False)
            with tempfile.TemporaryDirectory() as folder:
                _, error = pruned.save_stock(Path(folder) / "stock")
            row["stock_error"] = error
        return {**row, "step": "done", "reason": ""}
    except Exception as exc:  # noqa: BLE001 - every failure is a row: the step it stopped at and why
        last = traceback.format_exc().strip().splitlines()[-1]
        return {**row, "step": step, "reason": f"{type(exc).__name__}: {last[:240]}"}


def _examined(model_type: str) -> dict[str, Any]:
    """:func:`examine` in a fresh worker process (one model type each: what one model's code loads, such as a
    kernel package, cannot change another's row), timed."""
    torch.set_num_threads(1)
    started = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        row = examine(model_type)
    return {**row, "seconds": round(time.perf_counter() - started, 2)}


def run(types: list[str] | None = None, out: str | None = None, jobs: int = 2) -> dict[str, Any]:
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    names = types or sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
    rows = []
    with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn"), max_tasks_per_child=1) as pool:
        for model_type, row in zip(names, pool.map(_examined, names)):
            print(f"{model_type}: {row['step']} {row.get('reason', '')[:100]}", flush=True)
            rows.append(row)
    done = [r for r in rows if r["step"] == "done"]
    built = [r for r in rows if "layers" in r or r["step"] not in ("config", "size", "build")]
    result = {"suite": "hf_census", "transformers": transformers.__version__, "torch": torch.__version__,
              "small": SMALL, "max_params": MAX_PARAMS, "tolerance": TOLERANCE, "machine": machine("cpu"),
              "summary": {"types": len(rows), "built": len(built), "prunable": len(done),
                          "units_offered": sum(r["layers_removable"] + r["sublayers_removable"] for r in done),
                          "units_failing_recheck": sum(len(r["recheck_failed"]) for r in done),
                          "decode_equal": sum(r.get("decode") == "equal" for r in done),
                          "stock_folders_equal": sum(r.get("stock_error", 1.0) <= 1e-5 for r in done),
                          "stopped_at": dict(Counter(r["step"] for r in rows if r["step"] != "done"))},
              "rows": rows}
    write_result("hf_census", result, out)
    return result


def command_line() -> CommandLine:
    parser = CommandLine("studies.hf_census", __doc__)
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    parser.add_argument("--types", type=names_from(sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES), "causal LM type"),
                        default=None, help="comma-separated model types (default: every causal LM type transformers "
                        "knows)")
    parser.add_argument("--jobs", type=count, default=2, help="model types examined at a time (worker processes)")
    parser.add_argument("--out", type=out_folder, default=None)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = command_line().parse_args(argv)
    result = run(args.types, args.out, args.jobs)
    print(result["summary"])
    print(f"result: {results_dir(args.out)}")


if __name__ == "__main__":
    raise SystemExit(run_command(main))
