# Tiny Shakespeare in GPT-2 BPE tokens (make it with: python data/shakespeare/prepare.py).
# The variant configs switch to these tokens with --dataset=shakespeare, e.g.
#   python train.py config/gqa.py --dataset=shakespeare --out_dir=out-gqa-gpt2
# since the vocabulary size (50257) comes from data/shakespeare/meta.json, not from a config.
# Sized for a 2-core CPU: the tied 50257 x 128 embedding / output layer (6.4M of the 7.2M
# params) and its softmax over 50257 tokens cost most of the time (about 0.5 s per iteration
# on a 2-core CPU, 5 minutes in all), so the transformer stays as in the char base and the
# batch is smaller. A context of 64 BPE tokens is ~210 characters, three times the char
# model's. The 300k training tokens are seen about once in 600 iterations of 8 x 64 tokens;
# dropout delays memorizing them.
# GPU-sized: --n_layer=6 --n_head=6 --n_embd=384 --block_size=256 --batch_size=32 --max_iters=2000
include("base_shakespeare_char.py")
out_dir = "out-shakespeare-gpt2"
dataset = "shakespeare"
block_size = 64
batch_size = 8
dropout = 0.1
max_iters = 600
lr_decay_iters = 600
warmup_iters = 50
eval_interval = 100
eval_iters = 10
log_interval = 20
learning_rate = 1e-3
min_lr = 1e-4
