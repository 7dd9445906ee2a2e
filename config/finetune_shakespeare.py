# Fine-tune OpenAI's GPT-2 on Tiny Shakespeare in GPT-2 BPE tokens (nanoGPT's finetune_shakespeare):
#   python data/shakespeare/prepare.py
#   python train.py config/finetune_shakespeare.py                       # gpt2 (124M), from the hub
#   python train.py config/finetune_shakespeare.py --init_from=gpt2-xl   # nanoGPT's choice, on a GPU
#   python train.py config/finetune_shakespeare.py --init_from=path/to/folder   # config.json + model.safetensors
# Model keys a pretrained run may change: attention, n_kv_head, kv_lora_rank, mla_latent_norm,
# mla_decode, dropout, block_size (a crop of the 1024 learned positions), attn_impl; the others
# come from the weights. The ones below equal GPT-2's, so that bench.py and plan.py, which build
# models from these keys, build GPT-2's architecture too.
# Sized for a CPU: 8 x 256 tokens per iteration (nanoGPT: 32 x 1024 with gpt2-xl on a GPU).
out_dir = "out-shakespeare-finetune"
dataset = "shakespeare"
init_from = "gpt2"
# GPT-2's architecture (from the weights; listed for the tools that build from keys)
n_layer = 12
n_head = 12
n_embd = 768
bias = True
pos_encoding = "learned"
gelu_approximate = "tanh"
attention = "mha"
dropout = 0.0
block_size = 256
# a few small steps at a constant, small learning rate (nanoGPT: 20 iterations at 3e-5)
batch_size = 1
gradient_accumulation_steps = 8
max_iters = 20
learning_rate = 3e-5
decay_lr = False
eval_interval = 5
eval_iters = 20
log_interval = 1
