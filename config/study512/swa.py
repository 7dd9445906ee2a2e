# swa at context 512: the last 128 tokens (a fixed, local pattern).
include("../swa.py")
include("ctx512.py")
sliding_window = 128
