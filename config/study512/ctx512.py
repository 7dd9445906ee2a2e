# The sparse study's scale (issue 24, docs/sparse.md): context 512 with batch 2 (1,024 tokens a
# step), 4 layers of width 128 as base_shakespeare_char.py. Each sparse variant reads 128 keys per
# query (a quarter of the context): the budgets are matched in parameters and in keys read.
block_size = 512
batch_size = 2
