"""``muarl ablate`` (:mod:`muarl.ablation.run`): the method's claim as a command, the same RL with and without the user in the loop.

MUA-RL's claim is that the simulated user inside the rollouts is what makes an agent better at multi-turn tool
use. The ablation trains, from one cold start, one GRPO model per training user (default: the interactive
scripted user, the method, and the static user of :mod:`muarl.users.static`, which states the whole task in
its first message and then only says yes, as single-turn tool-use RL data does), with the same steps, seeds,
tasks and user seeds, and evaluates the cold start and every model with every evaluation user on the same
held-out tasks and trials: a matrix of (trained with) x (evaluated with). The table's first column of
differences is the method minus the other training users' RL, with paired 95% intervals clustered by task
(:mod:`muarl.compare`), on interactive held-out users first.

The recipe is the demo's (:mod:`muarl.experiments`: its presets, its stages and comparisons): ``--preset default`` is
``muarl demo``'s, ``smoke`` every stage briefly (CI). The run directory::

    ablate.json                 the settings; a rerun of the same command resumes, other settings are refused
    model/ synth/ sft/          the cold start (with --base scratch; the shipped base otherwise)
    rl-<user>/grpo/             one GRPO run per training user (the method's may be a demo run's, --method-from)
    eval/<model>/<user>[-greedy]/   every model (cold-start, rl-<user>) evaluated with every evaluation user
    comparisons/                paired comparisons (muarl compare's reports)
    summary.json table.md changed.md plots/ report.html

(the dev split's evaluations and results in ``dev/``, as the demo's). ``--method-from DEMO_RUN`` takes the
method arm's trained model from a finished ``muarl demo`` run whose recorded recipe, seed and cold start match
exactly (:func:`muarl.ablation.records.verify_method_from`), so three seeds cost one GRPO run each.
"""
