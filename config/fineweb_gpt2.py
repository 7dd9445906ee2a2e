# GPT-2 small (124M) on FineWeb-Edu sample-10BT: the OpenWebText recipe with FineWeb's tokens.
#   python data/fineweb/prepare.py                          # ~10B GPT-2 tokens (or --max_tokens)
#   torchrun --standalone --nproc_per_node=8 train.py config/fineweb_gpt2.py
# 10B tokens at 491,520 tokens/iteration is ~20,000 iterations per epoch: this run makes one
# pass (19,073 iterations, as in llm.c's GPT-2 124M on FineWeb 10B).
include("owt_gpt2_124m.py")
out_dir = "out-fineweb-gpt2-124m"
dataset = "fineweb"
wandb_run_name = "gpt2-124m-fineweb"
max_iters = 19073
lr_decay_iters = 19073
warmup_iters = 700
