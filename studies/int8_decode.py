"""RetNet decode with 8-bit weights on the CPU: how much faster per token, and what it costs in perplexity.

``RecurrentDecoder(..., quantize="int8")`` (``model.generate(..., quantize="int8")``) runs every projection and the LM
head of the decode step with per-output signed 8-bit weights and inputs quantised per call (torch's x86 dynamic
INT8 linear kernel); the recurrent state, the norms and the retention stay float32. Two parts:

**speed** (random weights; ``retnet_base`` and ``retnet_1_3b``; batch 1, one thread): a 32-token prompt prefilled,
then the float32 decoder ``generate`` uses by default and the INT8 decoder time ``steps`` tokens each in interleaved
rounds; the speed-up is the median of the per-round ratios, with the spread of those ratios. Also the bytes of
weights each step reads.

**quality** (``retnet_small`` trained on the embedded byte corpus, ``--seeds`` seeds, each its own training): the
validation windows decoded token by token with teacher forcing, once by the float32 decoder and once by the INT8
decoder; perplexity of each, and the relative change. Over seeds: mean change and its one-sided 95 % upper bound
(scipy's t distribution).

Targets (:func:`checks`), stated before the first run: retnet_1_3b decodes >= 2.0x faster with INT8 weights; the
perplexity's relative increase, upper 95 % bound over seeds, <= 2 %.

Resumable: each finished part is stored with the fingerprint of its inputs; a rerun keeps matching parts.

    python -m studies.int8_decode                          # about 15 minutes on 2 cores
    python -m studies.int8_decode [--parts speed,quality] [--seeds 5] [--quick] [--resume FILE]
"""

from __future__ import annotations

import json
import math
import statistics
import time
from pathlib import Path
from typing import Any

import torch

import zoo
from benchmarks.common import (
    Check,
    CommandLine,
    count,
    environment,
    judge,
    names_from,
    out_folder,
    read_json,
    result_of,
    results_dir,
    write_result,
)
from studies.jobs import python_job
from zoo.errors import run_command
from zoo.files import json_digest, read_sealed_json
from zoo.latency.device import timing_context
from zoo.models.retnet import RecurrentDecoder

PROTOCOL = 1
SPEED_TARGET = {"retnet_1_3b": 2.0}  # INT8 decode speed-up against float32, batch 1, one thread
MAX_PPL_INCREASE = 0.02  # relative, one-sided 95 % upper bound over seeds
FULL = dict(speed_models=("retnet_base", "retnet_1_3b"), prompt=32, steps=4, rounds=7, quality_model="retnet_small",
            train=["experiment=retnet_bytes", "model=retnet_small", "trainer.max_epochs=4"], windows=32, seeds=5)
QUICK = dict(speed_models=("retnet_tiny",), prompt=8, steps=2, rounds=2, quality_model="retnet_tiny",
             train=["experiment=retnet_bytes", "trainer.max_epochs=1", "trainer.limit_train_batches=3",
                    "data.seq_len=32"], windows=4, seeds=2)


def weight_bytes(decoder: RecurrentDecoder) -> int:
    """Bytes of the weights one step multiplies by (packed float matrices, INT8 projections, or the modules')."""
    if decoder.packed is None:
        return sum(p.numel() * p.element_size() for n, p in decoder.model.named_parameters()
                   if n.endswith("weight") and p.dim() == 2 and not n.startswith("embed"))
    items = [w for block in decoder.packed[:-1] for sub in block if sub is not None for w in sub]
    items.append(decoder.packed[-1][0])
    return sum(w.numel() * w.element_size() if torch.is_tensor(w) else w.nbytes for w in items)


def speed_part(model_name: str, cfg: dict[str, Any]) -> dict[str, Any]:
    """Float32 and INT8 decoders of one random-weight model, timed in interleaved rounds."""
    torch.manual_seed(0)
    model = zoo.create_model(model_name).eval()
    prompt = torch.randint(0, model.vocab_size, (1, cfg["prompt"]), generator=torch.Generator().manual_seed(0))
    with timing_context(torch.device("cpu"), torch.float32, 1):
        _, state = model(prompt, mode="chunkwise", return_state=True)
        decoders = {"fp32": RecurrentDecoder(model, state, 1), "int8": RecurrentDecoder(model, state, 1,
                                                                                      quantize="int8")}
        token = prompt[:, -1:]
        for decoder in decoders.values():  # warm-up
            decoder(token)
        per_round: dict[str, list[float]] = {k: [] for k in decoders}
        for _ in range(cfg["rounds"]):
            for name, decoder in decoders.items():
                start = time.perf_counter()
                for _ in range(cfg["steps"]):
                    decoder(token)
                per_round[name].append((time.perf_counter() - start) / cfg["steps"])
    ratios = [a / b for a, b in zip(per_round["fp32"], per_round["int8"])]
    ms = {k: statistics.median(v) * 1e3 for k, v in per_round.items()}
    return {"ms_per_token": ms, "tokens_per_s": {k: 1e3 / v for k, v in ms.items()},
            "speedup": statistics.median(ratios), "speedup_range": [min(ratios), max(ratios)],
            "weight_mb": {k: weight_bytes(d) / 2**20 for k, d in decoders.items()},
            "params": sum(p.numel() for p in model.parameters()), "rounds": cfg["rounds"], "steps": cfg["steps"]}


@torch.no_grad()
def decode_perplexity(model: torch.nn.Module, windows: torch.Tensor, quantize: str | None) -> float:
    """Perplexity of `windows` [N, T] decoded token by token (teacher forcing) from an empty state."""
    state = model.init_state(windows.shape[0])
    decoder = RecurrentDecoder(model, state, windows.shape[0], pack=True if quantize is None else None,
                               quantize=quantize)
    total = 0.0
    for t in range(windows.shape[1] - 1):
        logits = decoder(windows[:, t:t + 1])
        total += float(torch.nn.functional.cross_entropy(logits.float(), windows[:, t + 1], reduction="sum"))
    return math.exp(total / (windows.shape[0] * (windows.shape[1] - 1)))


def quality_seed(seed: int, cfg: dict[str, Any], workdir: Path) -> dict[str, Any]:
    """One trained model's decode perplexity in float32 and INT8 on the validation windows."""
    from omegaconf import OmegaConf

    from zoo.training import build_loaders

    run_dir = workdir / f"{cfg['quality_model']}-seed{seed}"
    done = run_dir / "results.json"
    results = read_sealed_json(done) if done.is_file() else python_job(
        "train.py", [*cfg["train"], f"trainer.seed={seed}"], run_dir, workdir)
    model = zoo.load(results["checkpoint"]).eval().float()
    config = OmegaConf.load(run_dir / ".hydra" / "config.yaml")  # the data the model was trained and validated on
    data = build_loaders(config.data, seed=config.trainer.seed)
    windows = torch.cat([batch[0] for batch in data.val])[:cfg["windows"]]
    with timing_context(torch.device("cpu"), torch.float32, 1):
        fp32 = decode_perplexity(model, windows, None)
        int8 = decode_perplexity(model, windows, "int8")
    return {"seed": seed, "windows": list(windows.shape), "ppl_fp32": fp32, "ppl_int8": int8,
            "relative_increase": int8 / fp32 - 1, "val_ppl_parallel": results["metrics"].get("val/ppl")}


def quality_statistics(seeds: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean relative perplexity increase over seeds and its one-sided 95 % upper bound (t distribution)."""
    from scipy import stats

    values = [s["relative_increase"] for s in seeds]
    mean = statistics.fmean(values)
    if len(values) < 2:
        return {"n": len(values), "mean_increase": mean, "upper_95": None}
    sem = statistics.stdev(values) / math.sqrt(len(values))
    return {"n": len(values), "mean_increase": mean, "sem": sem,
            "upper_95": mean + float(stats.t.ppf(0.95, len(values) - 1)) * sem}


def run(quick: bool = False, device: str = "cpu", parts: tuple[str, ...] = ("speed", "quality"),
        seeds: int | None = None, workdir: str | Path | None = None, out: str | Path | None = None,
        budget: Any = None, resume: str | Path | None = None) -> dict[str, Any]:
    """Both parts; writes ``int8_decode.json`` (``int8_decode_quick.json``) after each piece."""
    if device not in ("cpu", "auto"):
        return {"suite": "int8_decode", "skipped": f"INT8 decode runs torch's x86 CPU kernels; device={device}"}
    cfg = dict(QUICK if quick else FULL)
    cfg["seeds"] = seeds or cfg["seeds"]
    path = results_dir(out) / ("int8_decode_quick.json" if quick else "int8_decode.json")
    source = Path(resume) if resume else path
    stored = json.loads(source.read_text()) if source.is_file() else {}
    work = Path(workdir or Path.home() / ".cache" / "depthzoo" / ("int8_decode_quick" if quick else "int8_decode"))
    work.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"suite": "int8_decode", "quick": quick, "protocol": PROTOCOL,
                              "env": environment(torch.device("cpu"), torch.float32, 1, 1),
                              "engine": torch.backends.quantized.engine,
                              "speed": dict(stored.get("speed", {})), "quality": dict(stored.get("quality", {}))}
    start = time.perf_counter()

    def save() -> None:
        result["time_s"] = round(time.perf_counter() - start, 1)
        judge("int8_decode", result)
        write_result(path.stem, result, out)

    versions = {"torch": torch.__version__, "protocol": PROTOCOL, "quick": quick}
    if "speed" in parts:
        for model in cfg["speed_models"]:
            key = json_digest({**versions, "model": model, **{k: cfg[k] for k in ("prompt", "steps", "rounds")}}, 20)
            if result["speed"].get(model, {}).get("fingerprint") == key:
                print(f"speed {model}: kept (same inputs)", flush=True)
                continue
            result["speed"][model] = {"fingerprint": key, **speed_part(model, cfg)}
            save()
    if "quality" in parts:
        key = json_digest({**versions, "model": cfg["quality_model"], "train": cfg["train"],
                           "windows": cfg["windows"]}, 20)
        kept = [s for s in result["quality"].get("seeds", []) if result["quality"].get("fingerprint") == key]
        result["quality"] = {"fingerprint": key, "model": cfg["quality_model"], "train": cfg["train"],
                             "seeds": [s for s in kept if s["seed"] < cfg["seeds"]]}
        for seed in range(len(result["quality"]["seeds"]), cfg["seeds"]):
            result["quality"]["seeds"].append(quality_seed(seed, cfg, work))
            result["quality"]["statistics"] = quality_statistics(result["quality"]["seeds"])
            save()
    save()
    return result


def checks(result: dict[str, Any]) -> list[Check]:
    """The stated targets on what was measured (None: not measured)."""
    out = []
    for model, target in (SPEED_TARGET if not result.get("quick") else {"retnet_tiny": 0.0}).items():
        out.append(Check(f"{model}: INT8 decode speed-up (batch 1, one thread)",
                         (result.get("speed", {}).get(model) or {}).get("speedup"), ">=", target))
    stats = (result.get("quality") or {}).get("statistics") or {}
    out.append(Check("decode perplexity: relative increase with INT8 weights (upper 95 % bound over seeds)",
                     stats.get("upper_95"), "<=", MAX_PPL_INCREASE))
    return out


def markdown(result: dict[str, Any]) -> str:
    """Speed per model, perplexity per seed, the verdicts."""
    if "skipped" in result:
        return f"skipped: {result['skipped']}"
    lines = ["| model | params | weights read per token fp32 -> INT8 | ms/token fp32 | ms/token INT8 | **speed-up** "
             "(range over rounds) |", "|---|---|---|---|---|---|"]
    for model, row in result.get("speed", {}).items():
        lines.append(f"| {model} | {row['params'] / 1e6:.0f} M | {row['weight_mb']['fp32']:.0f} -> "
                     f"{row['weight_mb']['int8']:.0f} MB | {row['ms_per_token']['fp32']:.2f} | "
                     f"{row['ms_per_token']['int8']:.2f} | **{row['speedup']:.2f}x** ({row['speedup_range'][0]:.2f}"
                     f"-{row['speedup_range'][1]:.2f}) |")
    quality = result.get("quality") or {}
    if quality.get("seeds"):
        lines += ["", f"Decode perplexity of {quality['model']} (teacher forcing, validation windows):", "",
                  "| seed | float32 | INT8 | change |", "|---|---|---|---|"]
        lines += [f"| {s['seed']} | {s['ppl_fp32']:.3f} | {s['ppl_int8']:.3f} | {s['relative_increase']:+.2%} |"
                  for s in quality["seeds"]]
        st = quality.get("statistics") or {}
        if st.get("upper_95") is not None:
            lines.append(f"| mean ({st['n']} seeds) | | | {st['mean_increase']:+.2%} (upper 95 %: "
                         f"{st['upper_95']:+.2%}) |")
    judged = result.get("verdicts", {})
    lines += ["", "Targets: " + "; ".join(f"{label}: {'-' if v is None else 'pass' if v else 'FAIL'}"
                                          for label, v in judged.items()),
              "", f"{result['env']['device']}, torch {result['env']['torch']} ({result['engine']} engine), batch 1, "
              f"one thread, status {result.get('status', '-')}."]
    return "\n".join(lines)


def command_line() -> CommandLine:
    parser = CommandLine("studies.int8_decode", __doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--parts", type=names_from(("speed", "quality"), "part"), default=["speed", "quality"])
    parser.add_argument("--seeds", type=count, default=None)
    parser.add_argument("--workdir", type=out_folder, default=None)
    parser.add_argument("--out", type=out_folder, default=None)
    parser.add_argument("--resume", type=result_of("int8_decode"), default=None, metavar="JSON")
    parser.add_argument("--summarise", type=result_of("int8_decode"), default=None, metavar="JSON",
                        help="judge a stored result again and print it")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = command_line().parse_args(argv)
    if args.summarise:
        print(markdown(judge("int8_decode", read_json(args.summarise))))
        return
    print(markdown(run(args.quick, "cpu", tuple(args.parts), args.seeds, args.workdir, args.out, resume=args.resume)))


if __name__ == "__main__":
    raise SystemExit(run_command(main))
