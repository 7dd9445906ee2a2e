# GPT-2 small (124M) on OpenWebText, nanoGPT's train_gpt2 recipe: ~300B tokens seen, one 8-GPU node.
#   python data/openwebtext/prepare.py                      # ~9B GPT-2 tokens (or --max_tokens for a slice)
#   torchrun --standalone --nproc_per_node=8 train.py config/owt_gpt2_124m.py
#   ... config/owt_gpt2_124m.py --attention=gqa --n_kv_head=4 --out_dir=out-owt-gqa   # another variant
# Tokens per iteration: batch 12 x block 1024 x grad accum 40 (5 per GPU on 8 GPUs) = 491,520.
# nanoGPT's GPT-2 uses learned positions with MHA; here they are keys like any other.
out_dir = "out-owt-gpt2-124m"
dataset = "openwebtext"
wandb_run_name = "gpt2-124m"
# model: 12 layers, 12 heads, 768 wide, context 1024 (vocab_size comes from meta.json: 50257)
n_layer = 12
n_head = 12
n_embd = 768
block_size = 1024
dropout = 0.0
bias = False
attention = "mha"
pos_encoding = "learned"
# batch
batch_size = 12
gradient_accumulation_steps = 5 * 8
# AdamW with warmup and cosine decay to min_lr over the whole run
learning_rate = 6e-4
max_iters = 600000
lr_decay_iters = 600000
min_lr = 6e-5
warmup_iters = 2000
weight_decay = 1e-1
beta1 = 0.9
beta2 = 0.95
grad_clip = 1.0
# evaluation and logging
eval_interval = 1000
eval_iters = 200
log_interval = 10
# system
compile = True
