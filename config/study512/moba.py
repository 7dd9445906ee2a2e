# moba at context 512: blocks of 32, its own block + the 3 earlier blocks it scores highest (128 keys,
# a pattern chosen by content).
include("../moba.py")
include("ctx512.py")
sparse_block = 32
moba_topk = 3
