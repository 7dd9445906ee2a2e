# The fair study's scale (tools.sweep --match=params ...; docs/results.md): context 256 with
# batch 3, so a step holds 768 tokens as the 64 x 12 of base_shakespeare_char.py does.
block_size = 256
batch_size = 3
