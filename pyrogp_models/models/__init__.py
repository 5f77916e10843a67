"""The models, one folder each: local SVGPs, meta-GPs, products of experts, the distributed
kernel, multitask deep GPs."""
