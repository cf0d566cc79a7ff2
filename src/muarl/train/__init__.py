"""Training: data preparation, packing, and (next) the SFT and GRPO loops."""
