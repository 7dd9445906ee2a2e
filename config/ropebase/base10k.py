# The RoPE base study (docs/rope.md): config/mha.py at rope_base = 10000.
include("../mha.py")
rope_base = 10000.0
