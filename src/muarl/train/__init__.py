"""Training: data preparation, packing, SFT, pretraining and the GRPO loop. A run's settings are resolved in
:mod:`muarl.train.settings`; the optimizer is :mod:`muarl.train.optim`'s, the forwards' precision
:mod:`muarl.train.precision`'s."""
