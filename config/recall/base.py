# The recall study's recipe (docs/recall.md): MQAR rows of 64 tokens with 4 pairs, Zoology's
# anchor model (2 layers, width 64, 1 head) and training setup (AdamW with weight decay 0.1, a
# learning rate tuned per variant, a stop once val accuracy reaches 0.99).
# Data: python data/mqar/prepare.py --seq_len=64 --num_pairs=4 --out_dir=data/mqar64p4
dataset = "mqar64p4"
block_size = 64
n_layer = 2
n_embd = 64
n_head = 1
dropout = 0.0
batch_size = 64
learning_rate = 3e-3
min_lr = 3e-4
weight_decay = 0.1
warmup_iters = 100
max_iters = 4000
lr_decay_iters = 4000
eval_interval = 100
eval_iters = 8              # 8 x 64 = 512 val rows per evaluation
log_interval = 100
stop_val_acc = 0.99
device = "cpu"
compile = False
