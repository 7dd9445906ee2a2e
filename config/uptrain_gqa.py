# Convert GPT-2's MHA to GQA on load and train a little more (the GQA paper's "uptraining",
# Ainslie et al. 2023: mean-pooled K/V heads per group, then ~5% of the original compute;
# here a short CPU run on Shakespeare BPE):
#   python data/shakespeare/prepare.py
#   python train.py config/uptrain_gqa.py                              # 12 query heads share 4 K/V heads
#   python train.py config/uptrain_gqa.py --n_kv_head=1 --attention=mqa --out_dir=out-uptrain-mqa
#   python train.py config/uptrain_gqa.py --attention=mla --kv_lora_rank=256 --n_kv_head=0 --out_dir=out-uptrain-mla
# The conversion prints each layer's relative K/V error on stderr (pretrained.py).
include("finetune_shakespeare.py")
out_dir = "out-uptrain-gqa"
attention = "gqa"
n_kv_head = 4
max_iters = 100
learning_rate = 1e-4
decay_lr = True
warmup_iters = 10
lr_decay_iters = 100
min_lr = 1e-5
eval_interval = 25
