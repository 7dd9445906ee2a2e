# The base run every variant config includes: Tiny Shakespeare characters, sized to finish
# on a 2-core CPU in a few minutes (nanoGPT's CPU recipe).
# GPU-sized (nanoGPT's train_shakespeare_char): --n_layer=6 --n_head=6 --n_embd=384
#   --block_size=256 --batch_size=64 --dropout=0.2 --max_iters=5000 --lr_decay_iters=5000
out_dir = "out-shakespeare-char"
dataset = "shakespeare_char"
eval_interval = 250
eval_iters = 20
log_interval = 50
batch_size = 12
block_size = 64
n_layer = 4
n_head = 4
n_embd = 128
dropout = 0.0
learning_rate = 1e-3
max_iters = 2000
lr_decay_iters = 2000
min_lr = 1e-4
beta2 = 0.99
warmup_iters = 100
