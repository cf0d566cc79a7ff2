"""The CPU experiments ``muarl demo`` and ``muarl ablate`` are made of: the recipe (:mod:`.recipe`: the
presets, the SFT and GRPO settings, :class:`~muarl.experiments.recipe.DemoConfig`), the stages that build,
train and evaluate models, each resumable in a folder of its own (:mod:`.stages`), and the comparison of
the models they trained: tables, plots, changed conversations, the report page (:mod:`.comparison`).
:mod:`muarl.demo` strings them into the demo; :mod:`muarl.ablation` into the ablation.
"""
