# Grouped-query attention: 2 KV heads for 4 query heads (half MHA's cache).
include("../gqa.py")
include("study.py")
out_dir = "out-recall-gqa"
