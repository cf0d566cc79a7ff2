"""The GRPO run's settings (:class:`GRPOConfig`), their checks and the named presets.

Every option of ``muarl grpo`` is a field here, its help text in the field's metadata (the command line is
generated from it, :mod:`muarl.cli.config_options`); a config that cannot run is refused when it is built,
naming the option, rather than as a tensor error mid-step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from muarl.rollout import EpisodeConfig, EpisodeLimits
from muarl.train.engine_spec import SERVER, check_user_beside_policy, server_endpoints
from muarl.train.settings import RunSettings, from_preset


@dataclass
class GRPOConfig(RunSettings, EpisodeLimits):
    """GRPO settings; the defaults are the paper's released script (see :data:`PRESETS`)."""

    model: str = field(default="tiny", metadata={
        "help": "the starting checkpoint (normally the SFT output; a directory, Hub id, tiny or smollm2); also "
                "the KL reference"})
    domain: str = field(default="retail", metadata={"help": "domain name (see `muarl domains`) or module:attr"})
    split: str = field(default="train", metadata={"help": "task split to train on"})
    user: str = field(default="scripted", metadata={
        "help": "scripted | static (the task stated whole in one message, no dialogue) | llm:URL#MODEL | module:attr"})
    out: str = field(default="runs/grpo", metadata={"help": "run directory: model/, metrics.jsonl, config.json"})
    steps: int = field(default=25, metadata={"help": "optimizer steps (each plays a batch of rollouts)"})
    tasks_per_step: int = field(default=32, metadata={"help": "training tasks played per step"})
    group_size: int = field(default=8, metadata={
        "help": "episodes per task, one user seed per group: the group whose rewards give the advantages"})
    algorithm: str = field(default="grpo", metadata={
        "help": "grpo, or dr_grpo (Dr.GRPO: advantages not divided by the group's std, each sequence's loss "
                "over a constant length)",
        "choices": ["grpo", "dr_grpo"]})
    lr: float = field(default=1e-6, metadata={"help": "learning rate"})
    weight_decay: float = field(default=0.01, metadata={"help": "the optimizer's weight decay"})
    grad_clip: float = field(default=1.0, metadata={"help": "gradient norm clip"})
    clip_low: float = field(default=0.2, metadata={"help": "PPO clip below: the ratio's floor is 1 - this"})
    clip_high: float = field(default=0.2, metadata={
        "help": "PPO clip above: the ratio's ceiling is 1 + this (DAPO's clip-higher raises it)"})
    kl_beta: float = field(default=0.001, metadata={
        "help": "weight of the k3 KL term against the reference (0: off, and no reference pass)"})
    temperature: float = field(default=1.0, metadata={
        "help": "sampling temperature (also scales the trained log-probs)"})
    max_new_tokens: int = field(default=1024, metadata={"help": "sampled tokens per assistant turn"})
    max_turns: int = field(default=30, metadata={"help": "tool executions + user replies per episode"})
    dynamic_sampling: bool = field(default=False, metadata={
        "help": "DAPO: leave all-equal groups out of the update and play more tasks instead (see "
                "--max-rollout-batches)"})
    max_rollout_batches: int = field(default=4, metadata={
        "help": "with --dynamic-sampling: play up to this many batches of --tasks-per-step tasks per step to "
                "fill the update with groups that have a learning signal"})
    mask_sim_faults: bool = field(default=True, metadata={
        "help": "leave episodes the simulator spoiled (user and tool-server faults and timeouts: muarl.faults) "
                "out of the gradient and their group's baseline; a policy fault is never masked (the agent's "
                "failure, reward 0)"})
    penalize_violations: bool = field(default=False, metadata={
        "help": "train on --violation-reward for an episode that broke a policy rule, even if its database is "
                "right (the paper's reward is the database alone; the CPU demo penalizes)"})
    # the training reward of a rule-breaking episode when penalized: 0 only equals it with a plain failure, so
    # a group of failures gives no signal against the rule; below 0 it does
    violation_reward: float = field(default=0.0, metadata={
        "help": "with --penalize-violations: the reward of a rule-breaking episode (below 0 it also ranks under "
                "a plain failure, so all-failed groups still teach the rule)"})
    # None: a truncated episode trains on its own reward (0, a failure); below 0 it ranks under a clean failure
    truncation_reward: float | None = field(default=None, metadata={
        "help": "the training reward of an episode cut off at the per-turn token, context or turn limit (default: "
                "its own, a failure's 0); below 0 it ranks under a clean failure, so groups teach the agent to "
                "stop talking (issue 45; with --mask-truncated it only moves the group's baseline)"})
    # DAPO's overlong filtering: episodes cut at the per-turn token limit stay out of the gradient (they still
    # count, as failures, in their group's advantages), so their run-on tokens cannot dominate the token-mean
    mask_truncated: bool = field(default=False, metadata={
        "help": "leave episodes cut at the per-turn token limit out of the gradient (DAPO's overlong "
                "filtering); they still count as failures in their group's advantages"})
    # None: by need, see set_checkpointing (never on the CPU; on a GPU when the micro-batch's activations
    # would not fit well)
    gradient_checkpointing: bool | None = field(default=None, metadata={
        "help": "recompute activations in backward (default: by need; never on the CPU)"})
    shared_prefix: bool = field(default=True, metadata={
        "help": "compute the batch's shared opening (the system turn) once in the reference pass and the "
                "update; same result, less work (--no-shared-prefix: every sequence whole)"})
    skip_zero_advantage: bool = field(default=True, metadata={
        "help": "no forward or backward for zero-advantage sequences whose KL term is 0, which changes nothing "
                "(--no-skip-zero-advantage: run them too)"})
    zero_advantage_kl: float = field(default=0.0, metadata={
        "help": "also skip zero-advantage sequences whose kl_beta * mean KL is at most this (an approximation; "
                "0: only exact skips)"})
    micro_batch_size: int = field(default=8, metadata={
        "help": "sequences per forward/backward in the update (the gradient is the whole batch's)"})
    num_iterations: int = field(default=1, metadata={
        "help": "optimizer steps on each step's rollouts (GRPO's mu); above 1 the rollouts are reused and the "
                "clip bounds each step"})
    # truncated importance sampling against the rollout-training mismatch (muarl.algorithms.mismatch)
    tis_cap: float | None = field(default=None, metadata={
        "help": "truncated importance sampling against the rollout-training mismatch: ratio against the "
                "trainer's pre-update log-probs, each token weighed by min(trainer / sampler probability, C); 2 "
                "is the published choice (0: off; unset: 2 with --max-staleness, else off). The mismatch is "
                "logged either way (mismatch_kl, mismatch_outside)", "metavar": "C"})
    # None: by need, see recomputes_old_logprobs in muarl.train.grpo_update
    recompute_old_logprobs: bool | None = field(default=None, metadata={
        "help": "take the PPO ratio against the trainer's own log-probs from before the update instead of the "
                "rollout engine's (default: whenever the two differ in numerics: a vLLM engine, bf16, "
                "--tis-cap; --no-recompute-old-logprobs: the engine's, and no --tis-cap)"})
    # asynchronous GRPO (muarl.train.async_rollouts): episodes keep being played while the trainer updates
    max_staleness: int = field(default=0, metadata={
        "help": "asynchronous rollouts: groups are played on the newest synced weights while the trainer "
                "updates, and a step takes finished groups at most N updates old, the policy term weighed by "
                "the truncated importance ratio (--tis-cap, 2 unless set); 0: sample, then update (docs/training.md)",
        "metavar": "N"})
    # a vLLM engine's weights are synced to the trainer's after each update
    rollout_engine: str = field(default="hf", metadata={
        "help": "what samples the rollouts: muarl's transformers engine (hf) or vLLM, whose weights follow the "
                "trainer's after every update (LoRA: the adapter reloaded in place; full: the weights pushed "
                "in): in this process (vllm, needs `muarl[vllm]`) or a running vLLM server "
                "(vllm-server:URL#MODEL, MODEL its --served-model-name; no vLLM needed here), or several: "
                "vllm-server:URL1#M,URL2#M (whole groups to the least busy, all synced); docs/vllm.md",
        "metavar": "{hf,vllm,vllm-server:URL#MODEL}"})
    vllm_gpu_memory: float = field(default=0.3, metadata={
        "help": "with --rollout-engine vllm on a GPU the trainer shares: the share of its memory vLLM's weights "
                "and KV cache take"})
    # vLLM's sleep mode, level 1
    vllm_sleep: bool = field(default=False, metadata={
        "help": "with --rollout-engine vllm on a GPU: the engine sleeps through each update (weights offloaded "
                "to CPU memory, KV cache freed) and wakes for the weight sync (vLLM's sleep mode; not on the CPU "
                "build)"})
    vllm_sync_dir: str | None = field(default=None, metadata={
        "help": "with --rollout-engine vllm-server:...: the directory the synced weights or adapter are written "
                "to for the server to load (default: a temporary one; a server on another machine needs a "
                "shared one)", "metavar": "DIR"})
    vllm_weight_sync: str = field(default="memory", metadata={
        "help": "with --rollout-engine vllm-server:... and full fine-tuning: how the updated weights reach the "
                "servers: memory (broadcast in the engine's dtype over a process group with the servers' "
                "workers, NCCL between GPUs, else gloo; a server started without muarl's receiver falls back to "
                "files, with a warning), changed (the same broadcast sending only the values that changed since "
                "the last sync, a tensor with many changes whole; one more copy of the weights in the engine's "
                "dtype on each end) or file (safetensors in --vllm-sync-dir); docs/vllm.md",
        "choices": ["memory", "changed", "file"]})
    save_every: int = field(default=5, metadata={
        "help": "steps between checkpoints in OUT/checkpoints/step_N (0: only at the end; "
                "muarl.train.checkpoint)"})

    def __post_init__(self) -> None:
        """A config that cannot run fails here, with the option's name, not as a tensor error mid-step."""
        self.check_sharding()
        for name in ("steps", "tasks_per_step", "group_size", "max_rollout_batches", "max_new_tokens", "max_turns",
                     "micro_batch_size", "num_iterations"):
            if getattr(self, name) < 1:
                raise ValueError(f"GRPO {name} must be at least 1 (got {getattr(self, name)})")
        if self.temperature <= 0 or self.lr <= 0:
            raise ValueError(f"GRPO samples and learns: temperature and lr must be above 0 "
                             f"(got {self.temperature}, {self.lr})")
        self.episode_config()  # refuses a negative time limit, naming its option
        if self.violation_reward != 0.0 and not self.penalize_violations:
            raise ValueError("GRPO violation_reward applies only with penalize_violations "
                             "(--violation-reward needs --penalize-violations)")
        if self.tis_cap is not None and self.tis_cap < 0:
            raise ValueError(f"--tis-cap must be above 0 (or 0: off), not {self.tis_cap:g}")
        if self.recompute_old_logprobs is False and (self.tis_cap or (self.tis_cap is None and self.max_staleness)):
            raise ValueError("--tis-cap weighs tokens by the trainer's old log-probs over the engine's, which "
                             "--no-recompute-old-logprobs leaves out: use one of the two (--tis-cap 0 to keep "
                             "the engine's)")
        if self.max_staleness < 0:
            raise ValueError(f"--max-staleness must be 0 (synchronous) or more, not {self.max_staleness}")
        if self.max_staleness and self.vllm_sleep:
            raise ValueError("--vllm-sleep stops the engine for every update and --max-staleness keeps it sampling "
                             "through them: use one of the two")
        if self.rollout_engine.startswith(SERVER):
            server_endpoints(self.rollout_engine)  # a malformed URL#MODEL[,...]: one line (no connection yet)
            check_user_beside_policy(self)
        elif self.rollout_engine not in ("hf", "vllm"):
            raise ValueError(f"--rollout-engine must be hf, vllm or {SERVER}URL#MODEL, not {self.rollout_engine!r}")
        if self.vllm_sleep and self.rollout_engine != "vllm":
            raise ValueError("--vllm-sleep puts an engine in this process to sleep: it needs --rollout-engine vllm")
        if self.vllm_sync_dir is not None and not self.rollout_engine.startswith(SERVER):
            raise ValueError(f"--vllm-sync-dir is where a vLLM server reads synced weights: it needs "
                             f"--rollout-engine {SERVER}URL#MODEL")
        if self.vllm_weight_sync not in ("memory", "changed", "file"):
            raise ValueError(f"--vllm-weight-sync must be memory, changed or file, not {self.vllm_weight_sync!r}")
        if not 0 < self.vllm_gpu_memory <= 1:
            raise ValueError(f"--vllm-gpu-memory is a share of the GPU's memory in (0, 1], not {self.vllm_gpu_memory:g}")
        if self.user_http_timeout is not None and self.user_http_timeout <= 0:
            raise ValueError(f"--user-http-timeout must be above 0 seconds, not {self.user_http_timeout:g}")
        if self.user_max_tokens is not None and self.user_max_tokens < 1:
            raise ValueError(f"--user-max-tokens must be at least 1 (got {self.user_max_tokens})")

    def derived(self) -> dict[str, Any]:
        """The options left unset whose value follows from others (resolved last,
        :func:`muarl.train.settings.resolve`): ``tis_cap`` 2 with ``--max-staleness`` (stale tokens weighed
        by the truncated ratio to their behaviour log-probs), else 0 (off)."""
        found: dict[str, Any] = {}
        if self.tis_cap is None:
            found["tis_cap"] = 2.0 if self.max_staleness else 0.0
        return found

    def episode_config(self) -> EpisodeConfig:
        """The episodes' settings: the paper's training ones (required outputs not graded) and the limits."""
        return EpisodeConfig(max_turns=self.max_turns, require_outputs=False, user_timeout=self.user_timeout or None,
                             agent_timeout=self.agent_timeout or None, tool_timeout=self.tool_timeout or None)


PRESETS: dict[str, GRPOConfig] = {
    "paper": GRPOConfig(),
    "tiny": GRPOConfig(steps=10, tasks_per_step=4, group_size=4, lr=1e-4, max_new_tokens=128, max_turns=12),
}


def preset(name: str, **overrides: Any) -> GRPOConfig:
    """The preset ``name`` (:data:`PRESETS`) with the ``overrides`` given (None keeps the preset's value), for a
    config built in code; the derived defaults are filled in by the run (:func:`muarl.train.settings.complete`)."""
    return from_preset(PRESETS, name, "GRPO", **overrides)
