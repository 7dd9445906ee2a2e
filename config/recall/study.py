# The recall study's models (docs/recall.md): the anchor's recipe (base.py) at 4 heads, so that
# GQA (2 KV heads) and MQA (1) differ from MHA; width 64 here, 128 by --n_embd=128.
include("base.py")
n_head = 4
