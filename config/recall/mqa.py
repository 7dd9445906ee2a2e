# Multi-query attention: 1 KV head (a quarter of MHA's cache).
include("../mqa.py")
include("study.py")
out_dir = "out-recall-mqa"
