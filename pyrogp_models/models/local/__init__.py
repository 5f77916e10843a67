"""Local sparse variational GPs: the batched SVGP, its collapsed bound, all partitions as one
model."""
