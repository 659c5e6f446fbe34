"""The config's rules across keys: what pydantic checks one field at a time cannot see, e.g.
`explorer.engine_num` above 1 needs `synchronizer.method` 'checkpoint' or 'nccl', and a key that
would do nothing in its combination (a run does what its config says). Each rule names the key to
blame and the keys it reads."""
from collections.abc import Mapping

from workers.rft.algorithms import ALGORITHMS, EXPERT, LOSS_PARTS, PAIRS, USUAL, resolve
from workers.rft.config_issues import named_spec_issues, operator_issues, reward_fn_issues
from workers.rft.config_text import ConfigIssue
from workers.rft.pipelines import EXPERIENCE_OPERATORS, TASK_OPERATORS
from workers.rft.sampling import pair_use_limit
from workers.rft.synchronizer import SPLIT_SYNC_METHODS
from workers.rft.task_selectors import DEFAULT, TASK_SELECTORS, selector_spec
from workers.rft.workflows import WORKFLOWS, workflow_args_problems
from workers.rft.workflows.multi_turn import EnvironmentWorkflow, MultiTurnWorkflow

MAX_ROLLOUTS_PER_STEP = 65_536  # explorer.batch_size * algorithm.repeat_times


def _loss_fits(loss: str, algorithm: str) -> bool:
    """Whether algorithm.policy_loss `loss` may replace the preset's loss of `algorithm`: it must
    train on the data the algorithm samples (LOSS_PARTS), or on an RL algorithm add expert data to
    the rollouts (mix, mix_chord). The sft losses read no reward: on rollouts they would imitate
    the model's own answers whatever they scored (RL that ignores its rewards), so they are refused
    rather than given that meaning; SFT on expert data is algorithm 'sft'."""
    preset = LOSS_PARTS[ALGORITHMS[algorithm].policy_loss]
    return LOSS_PARTS[loss] == preset or (preset == (USUAL,) and LOSS_PARTS[loss] == (USUAL, EXPERT))


def _loss_misfit(loss: str | None, algorithm: str) -> str:
    preset = ALGORITHMS[algorithm]
    parts = LOSS_PARTS.get(loss)
    if parts == (EXPERT,) and preset.uses_rollouts:
        why = ("it reads no reward, so on rollouts it would imitate the model's own answers "
               "(use algorithm 'sft', or policy_loss 'mix' to add expert data to RL)")
    elif parts == (PAIRS,):
        why = "it trains on preference pairs (use algorithm 'dpo')"
    elif not preset.uses_rollouts:
        why = f"it trains on rollouts, and algorithm '{algorithm}' collects none"
    else:
        why = f"algorithm '{algorithm}' samples expert data, which '{loss}' cannot train on (use algorithm 'grpo')"
    return f"'{loss}' cannot replace the '{preset.policy_loss}' loss of algorithm '{algorithm}': {why}"


def _algorithm_option_rules(algo, spec) -> list[tuple]:
    """The algorithm's knobs that only some advantage fns or losses read (rules as _combination_issues')."""
    by = ("algorithm.name", "algorithm.advantage_fn", "algorithm.policy_loss")
    loss, adv = spec.policy_loss, spec.advantage_fn
    tau_read = loss == "opmd" or (adv == "opmd" and algo.opmd.baseline == "logavgexp")
    correction = algo.rollout_correction
    clips = loss in ("ppo", "gspo", "cispo", "mix", "mix_chord")
    return [
        *[(key, changed and not clips,
           f"has no effect with policy loss '{loss}': it clips the ratio of ppo, gspo, cispo, mix and mix_chord", by)
          for key, changed in (("algorithm.clip_range", algo.clip_range != 0.2),
                               ("algorithm.clip_range_low", algo.clip_range_low is not None),
                               ("algorithm.clip_range_high", algo.clip_range_high is not None))],
        ("algorithm.epsilon", algo.epsilon != 1e-6 and not (adv == "grpo" and algo.std_normalize),
         f"has no effect with advantage fn '{adv}'" + ("" if adv != "grpo" else " and std_normalize false")
         + ": grpo adds it to the std it divides by", (*by, "algorithm.std_normalize")),
        ("algorithm.gae.gamma", algo.gae.gamma != 1.0 and not spec.token_advantages,
         f"has no effect with advantage fn '{adv}': it discounts the returns of ppo and reinforce_plus_plus", by),
        ("algorithm.gae.lam", algo.gae.lam != 0.95 and adv != "ppo",
         f"has no effect with advantage fn '{adv}': it is GAE's (ppo)", by),
        ("algorithm.mix.mu", algo.mix.mu != 0.1 and loss != "mix",
         f"has no effect with policy loss '{loss}': it weighs mix's SFT loss"
         + (" (mix_chord's weight is algorithm.chord)" if loss == "mix_chord" else ""), by),
        ("algorithm.mix.expert_data_ratio", algo.mix.expert_data_ratio != 0.25 and spec.sample_strategy != "mix",
         f"has no effect with policy loss '{loss}': it is the expert share of mix and mix_chord's batches", by),
        ("algorithm.dpo.beta", algo.dpo.beta != 0.1 and loss != "dpo",
         f"has no effect with policy loss '{loss}': it is dpo's", by),
        ("algorithm.clip_ratio_c", algo.clip_ratio_c != 3.0 and loss not in ("ppo", "mix", "mix_chord"),
         f"has no effect with policy loss '{loss}': the dual clip bounds the ppo surrogate (ppo, mix, mix_chord)", by),
        ("algorithm.std_normalize", not algo.std_normalize and adv != "grpo",
         f"has no effect with advantage fn '{adv}': it is grpo's (Dr. GRPO)", by),
        ("algorithm.std_unbiased", not algo.std_unbiased and (adv != "grpo" or not algo.std_normalize),
         f"has no effect with advantage fn '{adv}'" + ("" if adv != "grpo" else " and std_normalize false")
         + ": it picks the std grpo divides by", (*by, "algorithm.std_normalize")),
        ("algorithm.loss_agg_mode", algo.loss_agg_mode != "token-mean" and loss == "dpo",
         "has no effect with policy loss 'dpo': it sums each response's log-probs and averages over pairs", by),
        ("algorithm.drop_zero_std_groups", algo.drop_zero_std_groups and not spec.group_advantages,
         f"has no effect with {f'advantage fn {adv!r}' if adv else f'algorithm {algo.name!r}'}: it drops groups "
         "before a group advantage fn (grpo, rloo, reinforce_plus_plus_baseline, opmd) compares them", by),
        ("algorithm.loss_scale_factor",
         algo.loss_scale_factor is not None and algo.loss_agg_mode != "seq-mean-token-sum-norm",
         f"has no effect with loss_agg_mode '{algo.loss_agg_mode}': it divides 'seq-mean-token-sum-norm'",
         ("algorithm.loss_agg_mode",)),
        ("algorithm.opmd.baseline", algo.opmd.baseline != "mean" and adv != "opmd",
         f"has no effect with advantage fn '{adv}': it is opmd's", by),
        ("algorithm.opmd.tau", algo.opmd.tau != 1.0 and not tau_read,
         "has no effect here: the opmd loss reads it, and the opmd advantage fn with baseline 'logavgexp'",
         (*by, "algorithm.opmd.baseline")),
        ("algorithm.chord", algo.chord != type(algo.chord)() and loss != "mix_chord",
         f"has no effect with policy loss '{loss}': it schedules mix_chord's SFT weight", by),
        ("algorithm.dpo.label_smoothing", algo.dpo.label_smoothing > 0 and loss != "dpo",
         f"has no effect with policy loss '{loss}': it is dpo's", by),
        ("algorithm.dpo.max_pair_uses", algo.dpo.max_pair_uses is not None and loss != "dpo",
         f"has no effect with policy loss '{loss}': it bounds how often dpo trains on one preference pair", by),
        ("algorithm.rollout_correction.mode", correction.mode != "none" and not spec.uses_rollouts,
         f"'{correction.mode}' weights rollouts, and algorithm '{algo.name}' trains on none", by),
        ("algorithm.rollout_correction.clip_max", correction.clip_max != 3.0 and correction.mode == "none",
         "has no effect with rollout_correction.mode 'none'", ("algorithm.rollout_correction.mode",)),
        ("algorithm.rollout_correction.clip_min", correction.clip_min is not None and correction.mode == "none",
         "has no effect with rollout_correction.mode 'none'", ("algorithm.rollout_correction.mode",)),
    ]


def samples_expert(spec) -> bool:
    """Whether the trainer samples expert data (the expert taskset's answers, human edits, promoted
    rollouts): sft's batches, the expert share of mix's. dpo's pairs strategy reads none of it."""
    return spec.uses_expert and spec.sample_strategy != "pairs"


def promotes_rollouts(c) -> bool:
    """Whether the explorer copies good rollouts into expert data (promote_to_expert): a source of
    sft's data that the explorer's steps bring, as they bring rollouts."""
    return c.mode == "both" and any(
        (op.get("name") if isinstance(op, Mapping) else op) == "promote_to_expert" for op in c.explorer.pipeline)


def data_sources(c, *, web: bool) -> list[str]:
    """Where the trainer of run config `c` could get data to train on, for a person; [] where
    nothing could ever arrive. `web`: the web app serves the run, where annotators judge a mode
    'both' run's rollouts while it trains (edits: sft's expert data; comparisons: dpo's pairs;
    docs/feedback.md) and the buffer holds imported datasets and other runs' judgements (the
    Postgres buffer's _sampleable and sample_pairs). Headless (the CLI), the engine gets only what
    its config gives it: rollouts, the expert taskset's answers, promote_to_expert's copies."""
    spec, buffer, feedback = resolve(c), c.buffer, c.feedback
    both, runs = c.mode == "both", ", ".join(map(str, feedback.source_runs))
    if c.mode not in ("both", "train"):
        return []
    if spec.uses_rollouts:
        return ["its explorer's rollouts"] if both else []
    if spec.sample_strategy == "pairs":
        return [text for text, present in (
            (f"the imported preference pairs {buffer.expert_dataset!r}", web and buffer.expert_dataset),
            (f"annotators' comparisons on run {runs}", web and feedback.source_runs),
            ("annotators' comparisons of this run's answers (Annotate, c)", web and both),
        ) if present]
    return [text for text, present in (
        (f"the answers of taskset {buffer.expert_taskset!r}", buffer.expert_taskset),
        (f"the imported expert data {buffer.expert_dataset!r}", web and buffer.expert_dataset),
        (f"human edits on run {runs}", web and feedback.source_runs),
        ("annotators' edits of this run's answers (Annotate, e)", web and both and feedback.edits_as_expert),
        ("the rollouts promote_to_expert copies", promotes_rollouts(c)),
    ) if present]


def waiting_for_data(c, *, trained: bool) -> str:
    """What the trainer of a web run (config `c`) that found nothing to train on waits for, for its
    duty line: the sources it could get data from (data_sources) and, for dpo once it has trained
    (`trained`), that each pair so far trained in as many steps as sampling.pair_use_limit allows."""
    sources = "; ".join(data_sources(c, web=True))  # none: stores that code feeds
    limit = pair_use_limit(c) if resolve(c).sample_strategy == "pairs" else None
    if trained and limit is not None:
        steps = f"{limit} step{'s' if limit > 1 else ''}"
        return (f"every pair so far has trained in {steps} (algorithm.dpo.max_pair_uses), the most it may; new ones "
                "come" + (sources and f" from {sources}"))
    return "nothing to train on yet" + (sources and f" from {sources}")


def data_issues(c, *, web: bool) -> list[ConfigIssue]:
    """A trainer that no data could ever reach (data_sources): each of its steps would find
    nothing, and a run of 100 such steps ended 'completed', model v100, having trained nothing.
    A launch refuses it (the web app's validate_config, the headless CLI); the schema does not
    (combination_issues), since the engine's stores may be handed data by code (tests, benchmarks)."""
    if c.mode not in ("both", "train") or data_sources(c, web=web):
        return []
    spec, name = resolve(c), c.algorithm.name
    if spec.uses_rollouts:
        return [ConfigIssue("mode", f"'train' rolls nothing out, and algorithm '{name}' trains on rollouts: every "
                                    "step would find nothing to train on (use mode 'both', or an algorithm that "
                                    "trains on expert data or pairs: sft, dpo)")]
    if spec.sample_strategy == "pairs" and not web:
        return [ConfigIssue("algorithm.name", "'dpo' trains on preference pairs, and a headless run has none: they "
                                              "come from annotators' comparisons and imported datasets, which the "
                                              "web app holds (launch the run there)")]
    if spec.sample_strategy == "pairs":
        return [ConfigIssue("feedback.source_runs", "required by algorithm 'dpo' in mode 'train' (or "
                            "buffer.expert_dataset), which trains on preference pairs alone: list the runs whose "
                            "annotators' comparisons it trains on, or name imported pairs in buffer.expert_dataset "
                            "(in mode 'both' annotators compare this run's own answers while it trains)")]
    if web:
        people = ("in mode 'both' annotators' edits of its answers train it too" if c.mode == "train" else
                  "feedback.edits_as_expert is false, so annotators' edits of its answers do not train it")
        return [ConfigIssue("buffer.expert_taskset", f"required by algorithm '{name}' (or buffer.expert_dataset, "
                            "or feedback.source_runs), which trains on expert data alone: name a taskset whose "
                            "answers it imitates, imported expert data, or runs whose human edits it trains on "
                            f"({people})")]
    return [ConfigIssue("buffer.expert_taskset", f"required by algorithm '{name}' in a headless run, which trains "
                        "on expert data alone: name a taskset whose answers it imitates (or, in mode 'both', copy "
                        "good rollouts with explorer.pipeline promote_to_expert)")]


def _algorithm_named(c, spec) -> str:
    return f"algorithm '{c.algorithm.name}'" + (f" with policy loss '{spec.policy_loss}'"
                                                 if c.algorithm.policy_loss else "")


def _data_option_rules(c, spec) -> list[tuple]:
    """The data, feedback and workflow keys that only some algorithms, modes or workflows read
    (rules as combination_issues'): read by the trainer's sampling (sampling.py; the Postgres
    buffer's _sampleable and sample_pairs), the loop's seed_expert_data and the explorer's steps."""
    by = ("algorithm.name", "algorithm.policy_loss")
    algorithm, expert, pairs = _algorithm_named(c, spec), samples_expert(spec), spec.sample_strategy == "pairs"
    readers = "sft, mix and mix_chord (or policy loss 'mix') train on expert data" + (
        ", dpo on preference pairs" if pairs else "")
    feedback, buffer, explorer = c.feedback, c.buffer, c.explorer
    workflow = WORKFLOWS.get(explorer.workflow) if explorer.workflow in WORKFLOWS else None
    default_reward_fn = type(explorer).model_fields["reward_fn"].default
    no_trainer, no_explorer_steps = c.mode in ("explore", "bench"), c.mode in ("train", "bench")
    return [
        ("buffer.expert_taskset", buffer.expert_taskset is not None and not expert,
         f"has no effect with {algorithm}: its answers are expert data, and {readers}", by),
        ("buffer.expert_dataset", buffer.expert_dataset is not None and not expert and not pairs,
         f"has no effect with {algorithm}: it is expert data or preference pairs, and {readers}"
         + ("" if pairs else ", dpo on preference pairs"), by),
        ("feedback.edits_as_expert", not feedback.edits_as_expert and not expert,
         f"has no effect with {algorithm}: human edits are expert data, and {readers}", by),
        ("feedback.source_runs", bool(feedback.source_runs) and not pairs and not expert,
         f"has no effect with {algorithm}: other runs give it their human edits (expert data) and preference "
         f"pairs, and {readers}", by),
        ("feedback.source_runs", bool(feedback.source_runs) and expert and not feedback.edits_as_expert,
         f"has no effect with feedback.edits_as_expert false: other runs give {algorithm} their human edits only",
         (*by, "feedback.edits_as_expert")),
        ("feedback.rated_only", feedback.rated_only and not spec.uses_rollouts,
         f"has no effect with {algorithm}: it holds back unrated rollouts, and {algorithm} trains on none", by),
        ("buffer.max_staleness", buffer.max_staleness is not None and not spec.uses_rollouts,
         f"has no effect with {algorithm}: it bounds the age of the rollouts a batch takes, and {algorithm} "
         "trains on none", by),
        ("buffer.max_staleness", buffer.max_staleness is not None and no_trainer,
         f"has no effect with mode '{c.mode}': it bounds the age of the rollouts a trainer step takes, and mode "
         f"'{c.mode}' runs no trainer", ("mode",)),
        *[(key, bool(ops) and no_explorer_steps,
           f"has no effect with mode '{c.mode}': it runs on each explorer step's "
           f"{'experiences' if key == 'explorer.pipeline' else 'tasks'}, and mode '{c.mode}' "
           + ("rolls nothing out" if c.mode == "train" else "only evaluates"), ("mode",))
          for key, ops in (("explorer.pipeline", explorer.pipeline), ("buffer.task_pipeline", buffer.task_pipeline))],
        ("buffer.task_selector", selector_spec(buffer.task_selector)[0] != DEFAULT and no_explorer_steps,
         f"has no effect with mode '{c.mode}': it picks each explorer step's tasks, and mode '{c.mode}' "
         + ("rolls nothing out" if c.mode == "train" else "only evaluates"), ("mode",)),
        # EnvironmentWorkflow: the episode's reward is the environment's return (tool_calling's
        # environment scores the final answer with the reward fn, so it reads it).
        ("explorer.reward_fn", explorer.reward_fn != default_reward_fn and workflow is not None
         and issubclass(workflow, EnvironmentWorkflow),
         f"has no effect with workflow '{explorer.workflow}': the environment's return is the episode's reward "
         "(less explorer.workflow_args.invalid_penalty); remove it, or use workflow 'tool_calling', whose final "
         "answers it scores", ("explorer.workflow",)),
    ]


def _unread_rules(c, spec) -> list[tuple]:
    """Each key that would do nothing in its combination (rules as combination_issues'): refused
    where the person set it, and put back to its default where they did not (config_keys.reset_unread)."""
    algo = c.algorithm
    rules = [
        *_algorithm_option_rules(algo, spec),
        ("explorer.eval_interval", c.explorer.eval_interval > 0 and c.mode in ("explore", "train"),
         f"has no effect with mode '{c.mode}': "
         + ("its weights never change (it trains nothing)" if c.mode == "explore" else "it runs no explorer")
         + "; mode 'bench' scores a model on buffer.eval_taskset", ("mode",)),
        ("algorithm.kl.fn", algo.kl.fn != "none" and not spec.uses_rollouts,
         f"'{algo.kl.fn}' estimates the KL from the policy's own samples (rollouts), and algorithm '{algo.name}' "
         "trains on none", ("algorithm.name",)),
        ("algorithm.kl.coef", algo.kl.coef > 0 and algo.kl.fn == "none",
         "has no effect with algorithm.kl.fn 'none': name an estimator (k1, k2, k3, low_var_kl)", ("algorithm.kl.fn",)),
        ("algorithm.entropy_coef", algo.entropy_coef > 0 and spec.policy_loss == "dpo",
         "the 'dpo' loss has no entropy bonus", ("algorithm.name", "algorithm.policy_loss")),
        *[(key, changed and not spec.needs_critic,
           f"has no effect with advantage fn '{spec.advantage_fn}': it is the critic's (ppo)",
           ("algorithm.name", "algorithm.advantage_fn"))
          for key, changed in (("algorithm.value_clip", algo.value_clip != 0.2),
                               ("trainer.critic_lr", c.trainer.critic_lr != 1e-5),
                               ("model.critic_path", c.model.critic_path is not None))],
        ("feedback.reward_mode", c.feedback.reward_mode != "none" and not spec.uses_rollouts,
         f"'{c.feedback.reward_mode}' turns ratings into rewards, and algorithm '{algo.name}' trains on no rewards",
         ("algorithm.name",)),
        ("feedback.reward_weight", c.feedback.reward_weight != 1.0 and c.feedback.reward_mode != "weight",
         f"has no effect with feedback.reward_mode '{c.feedback.reward_mode}': it weighs ratings in mode 'weight'",
         ("feedback.reward_mode",)),
        ("feedback.rating_wait_s", c.feedback.rating_wait_s > 0 and not c.feedback.rated_only,
         "has no effect without feedback.rated_only: a step waits for rated rollouts only then",
         ("feedback.rated_only",)),
        *_data_option_rules(c, spec),
    ]
    return [*rules, *_no_trainer_rules(c, {key for key, broken, *_ in rules if broken})]


# What only a trainer reads, by section (loop.py: modes explore and bench build no trainer). Not
# here: trainer.total_steps (mode explore's count of explorer steps), the synchronizer's method
# (bench evaluates each version a checkpoint sync published), buffer.expert_* (mix requires them:
# the "mode" rule refuses what trains on no rollouts), the feedback keys the annotation pages read,
# and the trainer's shape (strategy, num_processes, num_nodes, fsdp): the strategy rules of
# combination_issues refuse it for these modes, naming trainer.strategy.
TRAINER_ONLY = {
    "model": ("ref_path",),  # model.lora: its own rule says these modes put adapters on nothing
    "trainer": ("lr", "critic_lr", "batch_size", "micro_batch_size", "micro_batch_tokens", "activation_checkpointing",
                "save_interval", "save_interval_s", "keep_checkpoints", "grad_clip", "weight_decay", "warmup_steps",
                "update_epochs", "collective_timeout_s"),
    "synchronizer": ("interval", "offset"),
    # Not exclude_flagged: a flag reads it in every mode, to reject the row or only record the flag.
    "feedback": ("reward_mode", "reward_weight", "rated_only", "rating_wait_s", "edits_as_expert", "source_runs"),
}


def _no_trainer_rules(c, refused: set) -> list[tuple]:
    """Each TRAINER_ONLY key set off its default in mode explore or bench, unless another rule
    refuses it already (rules as combination_issues'). Kept, `trainer: {lr: 0.5, update_epochs: 5}`
    in mode explore was accepted and silently did nothing, where buffer.max_staleness was refused."""
    if c.mode not in ("explore", "bench"):
        return []
    rules = []
    for section, keys in TRAINER_ONLY.items():
        values, fields = getattr(c, section), type(getattr(c, section)).model_fields
        for key in keys:
            default = fields[key].get_default(call_default_factory=True)
            if getattr(values, key) != default and f"{section}.{key}" not in refused:
                rules.append((f"{section}.{key}", True, f"has no effect with mode '{c.mode}': only a trainer reads it, "
                              f"and mode '{c.mode}' runs none", ("mode",)))
    return rules


def unread_keys(c) -> dict[str, tuple[str, ...]]:
    """{key: the keys its rule reads} for each key the RunConfig `c` sets that its combination
    would not read (each refused by combination_issues)."""
    unread = {}
    for key, broken, _, reads in _unread_rules(c, resolve(c)):
        if broken:
            unread[key] = (*unread.get(key, ()), *reads)
    return unread


def _pipeline_rules(c, spec, operator_problems: list[ConfigIssue]) -> list[tuple]:
    """Experience operators (explorer.pipeline) that would do nothing here, or change what the
    group advantage compares: the explorer appends it after them (explorer.py), as Trinity-RFT does.
    An operator with problems of its own (operator_issues) is left to them."""
    if c.mode in ("train", "bench"):
        return []  # the whole pipeline goes unread (_data_option_rules)
    rules, adv = [], spec.advantage_fn
    for i, op in enumerate(c.explorer.pipeline):
        at = f"explorer.pipeline[{i}]"
        if any(issue.key == at or issue.key.startswith(at + ".") for issue in operator_problems):
            continue
        params = dict(op) if isinstance(op, Mapping) else {"name": op}
        name, bounded = params["name"], params.get("min") is not None or params.get("max") is not None
        if name == "promote_to_expert" and not samples_expert(spec):
            rules.append((at, True, f"promote_to_expert copies good rollouts into expert data, and "
                                    f"{_algorithm_named(c, spec)} trains on none (sft, mix and mix_chord do)",
                          ("algorithm.name", "algorithm.policy_loss")))
        # Measured (tests/workers/rft/test_config_rules.py): 4 identical correct answers get
        # advantages [0, 0, 0, 0] as a group, and 1.0 as dedupe's group of one; reward_filter
        # {min: 0.5} on 3 correct + 1 wrong gives [0, 0, 0] where the group gives [0.5, 0.5, 0.5, -1.5].
        if name == "dedupe" and spec.group_advantages:
            rules.append((at, True, f"dedupe runs before advantage fn '{adv}' compares each task's rollouts, and "
                                    "changes the comparison: 4 identical correct answers (advantages 0: no signal) "
                                    "become a group of one that keeps its reward (advantage 1.0). Repeats are the "
                                    "group saying the model is sure: leave them in (algorithm.drop_zero_std_groups "
                                    "drops groups without signal)", ("algorithm.name", "algorithm.advantage_fn")))
        if name == "reward_filter" and bounded and spec.group_advantages:
            rules.append((at, True, f"reward_filter drops rollouts before advantage fn '{adv}' compares each task's "
                                    "rollouts, so the rest are compared among themselves: min 0.5 on 3 correct "
                                    "answers and 1 wrong gives advantages 0, 0, 0 where the group gives 0.5 each and "
                                    "-1.5. Drop groups without signal with algorithm.drop_zero_std_groups; a reward "
                                    "filter fits advantage fns that compare no groups (ppo, reinforce_plus_plus)",
                          ("algorithm.name", "algorithm.advantage_fn")))
    return rules


def _turn_rules(c) -> list[tuple]:
    """A multi-turn workflow whose episodes cannot reach a second turn. MultiTurnWorkflow.advance
    takes a turn only while prompt + the replies so far + the environment's answer + a whole
    explorer.max_new_tokens fit in workflow_args.max_tokens; a prompt is at most
    model.max_prompt_tokens. (Call with workflow_args that passed their checks.)"""
    workflow = WORKFLOWS.get(c.explorer.workflow)
    if not issubclass(workflow, MultiTurnWorkflow):
        return []
    settings = workflow.settings(c.explorer.workflow_args)
    prompt, new, limit = c.model.max_prompt_tokens, c.explorer.max_new_tokens, settings["max_tokens"]
    two_turns = prompt + 2 * new
    # The key the person set: max_tokens where they named it, else the reply length they raised.
    key = "explorer.workflow_args.max_tokens" if "max_tokens" in c.explorer.workflow_args else "explorer.max_new_tokens"
    return [(key, settings["max_turns"] > 1 and two_turns > limit,
             f"an episode would end after its first turn: a turn is taken only while the prompt, the replies so "
             f"far, the environment's answer and a whole explorer.max_new_tokens fit in "
             f"explorer.workflow_args.max_tokens ({limit:,}), and model.max_prompt_tokens ({prompt:,}) + 2 x "
             f"explorer.max_new_tokens ({new:,}) is {two_turns:,}: raise max_tokens to at least {two_turns:,} plus "
             "the environment's answers, or lower max_new_tokens",
             ("explorer.workflow", "explorer.workflow_args", "explorer.max_new_tokens", "model.max_prompt_tokens"))]


def _selector_rules(c) -> list[tuple]:
    """buffer.task_selector's name and params (task_selectors.TASK_SELECTORS), and the task operator it
    would leave unread: sequential reads no priority."""
    issues = []
    named_spec_issues(c.buffer.task_selector, TASK_SELECTORS, "buffer.task_selector", issues)
    rules = [(issue.key, True, issue.message, ("buffer.task_selector",)) for issue in issues]
    if selector_spec(c.buffer.task_selector)[0] == "sequential":
        rules += [(f"buffer.task_pipeline[{i}]", True,
                   "'priority' has no effect with buffer.task_selector 'sequential': it draws the taskset in order, "
                   "whatever the priority (the default selector draws the highest first)", ("buffer.task_selector",))
                  for i, op in enumerate(c.buffer.task_pipeline)
                  if (op.get("name") if isinstance(op, Mapping) else op) == "priority"]
    return rules


def combination_issues(c, bad: set) -> list[ConfigIssue]:
    """Each rule names the key to blame and the keys it reads; it is skipped when any of them
    already has an error (their values here are defaults standing in for the bad ones).
    A key that would do nothing in its combination is refused too: a run does what its config says.
    (kl.fn with kl.coef 0 is allowed: the KL is then logged, not penalised.)"""
    algo, spec, preset = c.algorithm, resolve(c), ALGORITHMS[c.algorithm.name]
    sync = c.synchronizer
    rules = [  # (key, broken, message, other keys read)
        ("explorer.engine_num",
         c.explorer.engine_num > 1 and (c.mode != "both" or sync.method not in SPLIT_SYNC_METHODS),
         f"{c.explorer.engine_num} explorers run in workers of their own beside the trainer's: set mode 'both' and "
         "synchronizer.method 'checkpoint' or 'nccl'", ("mode", "synchronizer.method")),
        ("synchronizer.method", sync.method == "nccl" and c.mode != "both",
         f"'nccl' sends the trainer's weights to explorers, and mode '{c.mode}' runs "
         f"{'no trainer' if c.mode in ('explore', 'bench') else 'no explorer'}: use 'memory' or 'checkpoint'",
         ("mode",)),
        ("synchronizer.timeout_s", sync.timeout_s != 120.0 and sync.method != "nccl",
         f"has no effect with synchronizer.method '{sync.method}': it bounds an nccl transfer",
         ("synchronizer.method",)),
        ("synchronizer.verify_every", sync.verify_every != 10 and sync.method != "nccl",
         f"has no effect with synchronizer.method '{sync.method}': it checksums nccl transfers",
         ("synchronizer.method",)),
        ("buffer.expert_taskset",
         spec.sample_strategy == "mix" and c.buffer.expert_taskset is None and c.buffer.expert_dataset is None,
         f"required by {'algorithm' if algo.name == 'mix' else 'policy loss'} 'mix', which mixes expert data into "
         "every trainer batch (or buffer.expert_dataset: imported expert data)",
         ("algorithm.name", "algorithm.policy_loss")),
        ("mode", not spec.uses_rollouts and c.mode == "explore",
         f"'explore' only collects rollouts, and algorithm '{algo.name}' does not train on rollouts",
         ("algorithm.name",)),
        ("trainer.total_steps",
         c.mode == "both" and c.explorer.eval_interval > 0 and c.trainer.total_steps % sync.interval != 0,
         f"with explorer.eval_interval, a multiple of synchronizer.interval ({sync.interval}): explorers get the "
         f"weights every {sync.interval} steps, so the final eval would score step "
         f"{c.trainer.total_steps - c.trainer.total_steps % sync.interval}'s, not the last",
         ("explorer.eval_interval", "synchronizer.interval", "mode")),
        ("algorithm.advantage_fn", algo.advantage_fn is not None and preset.advantage_fn is None,
         f"algorithm '{algo.name}' uses no advantages", ("algorithm.name",)),
        ("algorithm.policy_loss", algo.policy_loss is not None and not _loss_fits(algo.policy_loss, algo.name),
         _loss_misfit(algo.policy_loss, algo.name), ("algorithm.name",)),
        *_unread_rules(c, spec),
        ("algorithm.mix.expert_data_ratio", spec.sample_strategy == "mix" and algo.mix.expert_data_ratio == 0,
         f"0 puts no expert data in the batches of policy loss '{spec.policy_loss}', so its SFT term and "
         "buffer.expert_taskset would do nothing: set it above 0, or use algorithm 'grpo' for RL alone",
         ("algorithm.name", "algorithm.policy_loss")),
        ("algorithm.rollout_correction.mode",
         algo.rollout_correction.mode != "none" and c.explorer.top_p < 1 and c.explorer.engine in ("vllm", "auto"),
         "corrects nothing with explorer.top_p below 1 on vLLM"
         + (" (engine 'auto' is vLLM on a GPU)" if c.explorer.engine == "auto" else "")
         + ": vLLM renormalises its log-probs in the nucleus, so the trainer drops them; set explorer.top_p 1 or "
         "explorer.engine 'transformers'", ("explorer.top_p", "explorer.engine")),
        ("buffer.eval_taskset", c.mode == "bench" and c.buffer.eval_taskset is None,
         "required by mode 'bench'", ("mode",)),
        ("buffer.eval_taskset", c.explorer.eval_interval > 0 and c.buffer.eval_taskset is None,
         "required when explorer.eval_interval > 0", ("explorer.eval_interval",)),
    ]
    trainer = c.trainer
    world = trainer.num_processes * trainer.num_nodes
    rules += [
        ("trainer.num_processes", trainer.strategy == "single" and trainer.num_processes > 1,
         f"strategy 'single' trains in one process, got {trainer.num_processes}: set trainer.strategy 'ddp' "
         "or 'fsdp'", ("trainer.strategy",)),
        ("trainer.num_nodes", trainer.strategy == "single" and trainer.num_nodes > 1,
         f"strategy 'single' trains on one machine, got {trainer.num_nodes}: set trainer.strategy 'ddp' or 'fsdp'",
         ("trainer.strategy",)),
        ("trainer.fsdp", trainer.fsdp is not None and trainer.strategy != "fsdp",
         f"has no effect with trainer.strategy '{trainer.strategy}': its settings are FSDP's (trainer.strategy "
         "'fsdp')", ("trainer.strategy",)),
        ("trainer.fsdp.cpu_offload", trainer.fsdp is not None and trainer.fsdp.cpu_offload and c.model.device == "cpu",
         "has no effect with model.device 'cpu': the weights are in CPU memory already", ("model.device",)),
        # peft's adapters inside FSDP's sharded layers (merging them for the explorer, the
        # base-as-reference switch) are not built; adapters are small, ddp replicates them cheaply.
        ("model.lora", c.model.lora is not None and trainer.strategy == "fsdp",
         "is not available with trainer.strategy 'fsdp' yet: use trainer.strategy 'ddp' with adapters",
         ("trainer.strategy",)),
        ("trainer.strategy", c.trainer.strategy != "single" and world == 1,
         f"'{c.trainer.strategy}' with one rank is 'single': set trainer.num_processes (ranks per node) above 1",
         ("trainer.num_processes", "trainer.num_nodes")),
        ("trainer.strategy", c.trainer.strategy != "single" and c.mode in ("explore", "bench"),
         f"mode '{c.mode}' runs no trainer to spread over ranks", ("mode",)),
        ("model.lora", c.model.lora is not None and c.mode in ("explore", "bench"),
         f"mode '{c.mode}' runs no trainer to put adapters on", ("mode",)),
    ]
    rollouts = c.explorer.batch_size * algo.repeat_times
    rules += [
        ("explorer.batch_size", rollouts > MAX_ROLLOUTS_PER_STEP,
         f"batch_size x algorithm.repeat_times is {rollouts} rollouts a step; at most {MAX_ROLLOUTS_PER_STEP}",
         ("algorithm.repeat_times",)),
        ("feedback.scale_max", c.feedback.scale_max <= c.feedback.scale_min,
         f"must be greater than feedback.scale_min ({c.feedback.scale_min}), got {c.feedback.scale_max}",
         ("feedback.scale_min",)),
    ]
    if "explorer.workflow" not in bad:
        arg_problems = workflow_args_problems(c.explorer.workflow, c.explorer.workflow_args)
        rules += [(f"explorer.workflow_args.{key}", True, message, ()) for key, message in arg_problems]
        if not arg_problems:
            rules += _turn_rules(c)
    rules += [
        (issue.key, True, issue.message, ("explorer.reward_fn",)) for issue in reward_fn_issues(c.explorer.reward_fn)
    ]
    operator_problems = {key: operator_issues(ops, registry, key)
                         for key, ops, registry in (("explorer.pipeline", c.explorer.pipeline, EXPERIENCE_OPERATORS),
                                                    ("buffer.task_pipeline", c.buffer.task_pipeline, TASK_OPERATORS))}
    rules += [(issue.key, True, issue.message, (key,)) for key, issues in operator_problems.items() for issue in issues]
    rules += _pipeline_rules(c, spec, operator_problems["explorer.pipeline"])
    rules += _selector_rules(c)
    return [
        ConfigIssue(key, message)
        for key, broken, message, reads in rules
        if broken and not any(k == b or k.startswith(b + ".") for k in (key, *reads) for b in bad)
    ]
