# %% [markdown]
# # Released MoE checkpoints: import, generate, fine-tune, export
#
# moejax reads and writes the Hugging Face safetensors layout of five MoE families
# (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE, DeepSeek-V3; `moejax/interop/`). A real
# checkpoint (`Qwen/Qwen3-30B-A3B`, ...) works the same way, but does not fit a
# notebook's minutes, so here transformers makes a *tiny random* Qwen3-MoE
# (hidden size 32, 2 layers, 8 experts, top-2, a 256-token vocabulary so that it
# can be fine-tuned on bytes) and saves it as a real checkpoint directory. Then:
#
# 1. import it (`moejax.interop.import_hf`) and check moejax's logits and routing
#    against transformers';
# 2. generate from it with moejax's KV-cache decoder;
# 3. fine-tune it a few steps with the trainer (`configs/finetune_hf.py`);
# 4. export the fine-tuned model (`moejax.interop.export_hf`; on the command line
#    `python -m experiments.convert --workdir=... --out_hf_dir=...`) and load the
#    export in transformers: same logits, same greedy continuation.
#
# Needs torch and transformers (on Colab they are installed; locally
# `bash scripts/setup.sh --test`).

# %% [setup]

# %%
import numpy as np
import torch
import transformers

hf_dir = os.path.join(WORK, "tiny_qwen3_moe")
torch.manual_seed(0)
hf_config = transformers.Qwen3MoeConfig(
    vocab_size=256, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16, intermediate_size=48, moe_intermediate_size=16,
    num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, max_position_embeddings=256,
    initializer_range=0.2, bos_token_id=1, eos_token_id=2, pad_token_id=0)
hf_model = transformers.AutoModelForCausalLM.from_config(hf_config, attn_implementation="eager")
hf_model.eval().save_pretrained(hf_dir)
print(sorted(os.listdir(hf_dir)))

# %% [markdown]
# ## Import and compare with transformers
#
# `import_hf` reads `config.json` into moejax's model schema and the tensors into
# the decoder's parameters. `moejax.interop.parity` runs both models on the same
# left-padded batch (float32) and returns the logits and, per MoE layer, the
# experts each token chose.

# %%
from moejax.interop import import_hf
from moejax.interop.parity import hf_forward, moejax_forward, padded_batch

loaded = import_hf(hf_dir)
print("family", loaded.config.family, "| experts", loaded.config.moe.num_experts,
      "| top-k", loaded.config.moe.top_k, "| layers", loaded.config.num_layers)

tokens, mask, positions = padded_batch()
theirs, their_experts = hf_forward(hf_model, tokens, mask, positions)
ours, our_experts = moejax_forward(loaded, tokens, mask)
real = mask.astype(bool)
print(f"max |logit difference| over real tokens: {np.abs(ours - theirs)[real].max():.2e} "
      f"(logits up to {np.abs(theirs[real]).max():.2f})")
for layer, (a, b) in enumerate(zip(our_experts, their_experts)):
  same = np.array_equal(np.sort(a, -1)[real.reshape(-1)], np.sort(b, -1)[real.reshape(-1)])
  print(f"MoE layer {layer}: same top-2 experts for every real token: {same}")
assert np.abs(ours - theirs)[real].max() < 1e-4

# %% [markdown]
# ## Generate
#
# `generate` takes the model config, parameters and state of any moejax decoder:
# a trained run's (notebook 01) or an imported checkpoint's. Greedy decoding
# (temperature 0) of a random model is noise, but it is the same noise
# transformers produces: compare the first prompt with `hf_model.generate`.

# %%
from moejax.inference.generate import generate

prompts = [[1, 72, 101, 108, 108, 111], [1, 84, 111]]
out = generate(loaded.config, loaded.params, loaded.rest, prompts, max_new_tokens=12)
hf_out = hf_model.generate(torch.tensor([prompts[0]]), max_new_tokens=12, do_sample=False,
                           pad_token_id=0)[0, len(prompts[0]):].tolist()
print("moejax      :", out.row(0))
print("transformers:", hf_out)
print("second prompt:", out.row(1))

# %% [markdown]
# ## Fine-tune
#
# `configs/finetune_hf.py` starts training from `init.hf_dir` (the model section
# comes from the checkpoint) on the embedded Shakespeare plays, byte tokens. The
# loss starts high (a random model) and drops.

# %%
from moejax.configs import finetune_hf
from moejax.train.loop import train_and_evaluate

steps = 100 if ACCELERATOR else 30
config = finetune_hf.get_config(f"family=qwen3_moe,steps={steps},seq_len=32,batch_size=8")
config.init.hf_dir = hf_dir
config.train.learning_rate, config.train.warmup_steps = 3e-3, 3
config.train.log_every, config.train.eval_batches, config.train.progress_bar = 5, 2, False
workdir = os.path.join(WORK, "finetuned")
run = train_and_evaluate(config, workdir)
print("loss every 5 steps:", [round(r["loss"], 3) for r in run.history])
print(f"held-out bits per byte after {steps} steps: {run.eval['val_bpb']:.3f}")

# %% [markdown]
# ## Export and check the export in transformers
#
# `load_model(workdir=...)` reads the fine-tuning run's latest checkpoint (the
# same reader `experiments.convert` uses); `export_hf` writes config.json and
# safetensors that transformers loads as a Qwen3-MoE.
# `export_logit_difference` loads the export with transformers and compares its
# float32 logits with moejax's (what `experiments.convert --check_logits` does).

# %%
from moejax.interop import export_hf
from moejax.train.load import load_model
from moejax.interop.parity import export_logit_difference

tuned, _, _ = load_model(workdir=workdir)
export_dir = os.path.join(WORK, "finetuned_hf")
written = export_hf(tuned.config, tuned.params, tuned.rest, export_dir)
print("exported", written["architectures"], "to", sorted(os.listdir(export_dir)))
diff, scale = export_logit_difference(tuned, export_dir)
print(f"export: max |moejax - transformers| logit {diff:.2e} (logits up to {scale:.2f})")
assert diff < 1e-4

reloaded = transformers.AutoModelForCausalLM.from_pretrained(export_dir, dtype="float32").eval()
prompt = [1] + list(b"ROMEO:")
hf_text = reloaded.generate(torch.tensor([prompt]), max_new_tokens=24, do_sample=False,
                            pad_token_id=0)[0, len(prompt):].tolist()
ours = generate(tuned.config, tuned.params, tuned.rest, [prompt], max_new_tokens=24).row(0)
print("moejax      :", repr(bytes(t for t in ours if t < 256).decode("latin-1")))
print("transformers:", repr(bytes(t for t in hf_text if t < 256).decode("latin-1")))
print("same greedy tokens:", ours == hf_text)
