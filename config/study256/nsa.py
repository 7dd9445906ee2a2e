# NSA at context 256: blocks of 16 (16 blocks), 4 of them read per query besides the 16 compressed keys
# and a window of 64: at most 16 + 64 + 64 = 144 keys per query, of 256.
include("../nsa.py")
include("ctx256.py")
sparse_block = 16
sliding_window = 64
