# The fair study's GPU tier (docs/results.md, "GPU tier (to run)": the command, what it would settle and
# its cost table): ~30M parameters (of which 19M are the tied GPT-2 BPE embedding), context 1024,
# FineWeb-Edu, ~1 H100-hour per variant and seed. Included after a variant's own config, so these keys
# win. Prepare the data once (a 4B-token slice, test split):
#   python data/fineweb/prepare.py --max_tokens=4e9 --test_fraction=0.0005
# then one sweep (the CPU study's protocol):
#   C="mha gqa mqa mla bigbird gla mha_gate gla_bare gla_nodecay"
#   python -m tools.sweep $(printf 'config/study1024/%s.py ' $C) --out=sweeps/gpu1024 --match=params \
#       --lr_grid=3e-4,6e-4,1.2e-3,2.4e-3 --lr_fraction=0.1 --seeds=1,2,3,4,5
# Cost (python -m tools.plan $(printf 'config/study1024/%s.py ' $C) --context=1024): 0.18-0.21 GFLOP per
# training token; 24,000 iterations x 131,072 tokens = 3.1B tokens = 6.5e17 FLOPs (mha), 55 min at 20% of
# an H100's 989 TFLOP/s bf16 peak, 37 min at 30%. The lr grid adds 4 x 10% of that per variant.
dataset = "fineweb"
block_size = 1024
batch_size = 32
gradient_accumulation_steps = 4     # 131,072 tokens per iteration on one GPU
n_layer = 6
n_head = 6
n_embd = 384
dropout = 0.0
learning_rate = 6e-4
min_lr = 6e-5
max_iters = 24000
lr_decay_iters = 24000
warmup_iters = 500
beta2 = 0.95
weight_decay = 0.1
eval_interval = 500
eval_iters = 50
log_interval = 50
compile = True
