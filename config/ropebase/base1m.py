# The RoPE base study (docs/rope.md): config/mha.py at rope_base = 1000000.
include("../mha.py")
rope_base = 1000000.0
