"""Quantisation: rounding values to an instruction's element formats (:mod:`.elements`) and the
block-scaled MX / NVFP4 recipes (:mod:`.blocks`). Below the GEMM, which quantises its inputs
with them, and above the numerics engine, whose conversions they use."""
