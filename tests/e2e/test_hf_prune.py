"""prune.py and train.py on any transformers causal LM (model=hf): a folder this machine made pruned from its own
weights to a measured prefill speed-up and written back as a stock folder that AutoModelForCausalLM loads with the
pruned model's logits; the packaged tiny Llama config trained by train.py and as prune.py's baseline."""

from __future__ import annotations

import json

import pytest
import torch

from ..helpers import QUICK_TIMING, prune_in_process, run_train

transformers = pytest.importorskip("transformers")

TINY_TEXT = ["data=bytes", "data.seq_len=32", "data.batch_size=8", "trainer.max_epochs=1",
             "trainer.limit_train_batches=4", "trainer.progress=false", "optim.warmup_epochs=0", "logger=none"]
TINY_HF_PRUNE = [*TINY_TEXT, "prune.batch_size=2", "prune.calib_batches=1", "finetune.epochs=1", *QUICK_TIMING]


def test_a_local_folder_prunes_from_its_own_weights_and_ships_as_a_stock_folder(tmp_path):
    import zoo

    source = tmp_path / "my-llama.v2"
    torch.manual_seed(0)
    config = transformers.AutoConfig.from_pretrained(zoo.models.hf_lm.PACKAGED / "tiny_llama")
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(source)
    out = prune_in_process("model=hf", f"model.name={source}", "model.pretrained=true", *TINY_HF_PRUNE,
                           "prune.target_speedup=1.3", "prune.export=hf", base=tmp_path)
    assert out.returncode == 0, out.stdout[-3000:]
    assert "training the baseline" not in out.stdout  # the folder's weights are the baseline
    run = tmp_path / "run"
    results = json.loads((run / "results.json").read_text())
    assert results["model"] == f"hf/{source}" and results["workload"] == "forward"
    removed = results["plan"]["remove"]
    assert removed and all(name.startswith("lm.model.layers.") for name in removed)
    assert results["predicted_speedup"] > 1.0 and results["export"]["passed"] is True  # measured: beside a worker
    workloads = results["workloads"]  # the plan measured where an LM is served: its prefill and its decode step
    assert workloads["forward"]["chosen_here"] and workloads["decode"]["condition_workload"] == "decode@32"
    assert workloads["decode"]["baseline_ms"] > 0 and workloads["decode"]["pruned_ms"] > 0
    stock = transformers.AutoModelForCausalLM.from_pretrained(run / "hf").eval()
    assert stock.config.num_hidden_layers == config.num_hidden_layers - len(removed)
    pruned = zoo.load(run / "pruned.safetensors").eval()
    tokens = torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours, theirs = pruned(tokens), stock(input_ids=tokens).logits
    assert float((ours - theirs).abs().max()) <= 1e-5 * float(ours.abs().max())
    assert (run / "hf" / "README.md").is_file()  # the model card beside the weights


def test_train_py_trains_the_packaged_tiny_llama_and_prune_py_trains_it_as_its_baseline(tmp_path):
    proc = run_train("model=hf", "model.name=tiny_llama", *TINY_TEXT, run_dir=tmp_path / "train")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    trained = json.loads((tmp_path / "train" / "results.json").read_text())
    assert trained["steps"] == 4 and trained["metrics"]["val/ppl"] < 256  # better than a uniform guess already
    out = prune_in_process("model=hf", "model.name=tiny_llama", *TINY_HF_PRUNE, "prune.target_speedup=1.2",
                           base=tmp_path / "prune")
    assert out.returncode == 0, out.stdout[-3000:]
    results = json.loads((tmp_path / "prune" / "run" / "results.json").read_text())
    assert results["baseline"]["metrics"]["val/ppl"] > 0 and results["pruned"]["metrics"]["val/ppl"] > 0
    assert "hf/tiny_llama" in results["baseline"]["source"]  # trained once, cached under the model's name


def test_prune_py_plans_on_the_decode_step_at_the_data_context_with_the_model_kv_cache(tmp_path):
    out = prune_in_process("model=hf", "model.name=tiny_llama", *TINY_HF_PRUNE, "prune.workload=decode",
                           "prune.target_speedup=1.2", "prune.export=hf", base=tmp_path)
    assert out.returncode == 0, out.stdout[-3000:]
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["workload"] == "decode" and results["condition"]["workload"] == "decode@32"  # data.seq_len
    assert results["condition"]["input_size"] == [1] and results["plan"]["remove"]
    assert results["export"]["passed"] is True


def test_sub_layers_are_searched_unless_the_run_ships_a_stock_folder_and_a_given_sub_layer_plan_is_refused(tmp_path):
    """Without prune.export=hf the search may remove a layer's attention or MLP alone; with it, whole layers only
    (a stock config has every layer's); a given plan removing a sub-layer with prune.export=hf: exit 2 before the
    baseline."""
    out = prune_in_process("model=hf", "model.name=tiny_llama", *TINY_HF_PRUNE, "prune.target_speedup=1.2",
                           "prune.export=hf", base=tmp_path / "a")
    assert out.returncode == 0, out.stdout[-3000:]
    results = json.loads((tmp_path / "a" / "run" / "results.json").read_text())
    assert all(name.count(".") == 3 for name in results["plan"]["remove"])  # lm.model.layers.<i>: whole layers
    table = json.loads((tmp_path / "a" / "run" / "latency_table.json").read_text())
    assert any(".mlp" in str(segment) for segment in table["segments"])  # the table has the sub-layers' variants
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"remove": ["lm.model.layers.2.mlp"]}))
    out = prune_in_process("model=hf", "model.name=tiny_llama", *TINY_HF_PRUNE, f"prune.plan={plan}",
                           "prune.export=hf", base=tmp_path / "b")
    assert out.returncode == 2, out.stdout[-2000:]
    assert "prune.export=hf writes a folder whose stock config" in out.stdout
    assert "training the baseline" not in out.stdout
    out = prune_in_process("model=hf", "model.name=tiny_llama", *TINY_HF_PRUNE, f"prune.plan={plan}",
                           "prune.export=onnx", base=tmp_path / "c")  # the same plan as ONNX: written and checked
    assert out.returncode == 0, out.stdout[-3000:]
    export = json.loads((tmp_path / "c" / "run" / "results.json").read_text())["export"]
    assert export["passed"] is True and export["checked_shapes"] == [[[2, 32]], [[3, 32]]]


def test_a_lora_fine_tune_trains_adapters_only_and_ships_them_merged_into_a_stock_folder(tmp_path):
    out = prune_in_process("model=hf", "model.name=tiny_llama", *TINY_HF_PRUNE, "finetune.lora_rank=4",
                           "prune.target_speedup=1.2", "prune.export=hf", base=tmp_path)
    assert out.returncode == 0, out.stdout[-3000:]
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    lora = results["finetune_lora"]
    assert lora["rank"] == 4 and 0 < lora["lora_trainable_params"] < lora["lora_total_params"] / 5
    assert lora["lora_merge_rel_diff"] < 1e-5 and results["export"]["passed"] is True
    stock = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "hf")  # no adapter left in it
    assert not any("lora" in name for name, _ in stock.named_parameters())
