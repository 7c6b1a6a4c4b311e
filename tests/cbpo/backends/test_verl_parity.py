"""Issue 39: the verl backend trains what the local trainer trains, for every method in the
registry. On random grouped rollouts (observation runs, some shared across rollouts and some
not; rollouts cut off inside an observation; a branch with no token of its own; right padding;
rows in verl's balanced order), ``cbpo/backends/verl/credit.py:assign`` on verl's batch gives
each model token the advantage and loss mask the method's credit gives it locally, and verl's
actor loss (verl's ``ppo_loss`` with the actor config the suite generates and the normalisers
verl's trainer passes) equals ``cbpo.objective.policy_objective`` with the local trainer's
(``trainer.loss_normalisers``), in value and gradient. Methods are read from the registry: a new
one is covered without editing this file. OPD is the one exception: its advantage is verl's
distillation loss's, whose parity with OPD's credit is test_verl_credit.py's."""
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir

from cbpo import schema
from cbpo.backends.verl import credit
from cbpo.objective import LOSS_AGG_MODES, policy_objective
from cbpo.registry import get_method, known_methods, reward_kl
from cbpo.logprobs import rollout_tensors
from cbpo.objective import loss_normalisers
from cbpo.trajectory import Trajectory

pytest.importorskip("verl")

CONFIGS = Path(__file__).resolve().parents[3] / "configs"
RL = [m for m in known_methods() if get_method(m).trains and not get_method(m).distilled]
M, PROBLEMS = 8, 3
# Observation runs: shared ones give GiGPO's anchor states in several rollouts, the others split them
OBSERVATIONS = ([1, 2, 1], [1, 3, 1], [2, 4], [1, 2, 2, 2])
MAX_RESPONSE = 30  # where a method caps the response (DAPO's L_max): some rollouts pass it


def turns(rng, n_turns: int, trailing: bool) -> tuple[list[int], list[bool]]:
    ids, mask = [], []
    for turn in range(n_turns):
        n = int(rng.integers(2, 8))
        ids += rng.integers(5, 50, n).tolist()
        mask += [True] * n
        if turn < n_turns - 1 or trailing:
            obs = OBSERVATIONS[int(rng.integers(len(OBSERVATIONS)))]
            ids += obs
            mask += [False] * len(obs)
    return ids, mask


def rollout(rng, prefix: Trajectory | None = None, own_tokens: bool = True) -> Trajectory:
    """A finished rollout, or ``prefix`` continued; one in four is cut off inside an observation
    (the length limit hit while a tool answered); ``own_tokens`` False: the continuation is that
    cut observation alone."""
    trailing = not own_tokens or rng.random() < 0.25
    ids, mask = ([], []) if not own_tokens else turns(rng, int(rng.integers(1, 5)), trailing)
    if not own_tokens:
        ids, mask = list(OBSERVATIONS[0]), [False] * len(OBSERVATIONS[0])
    t = prefix or Trajectory(prompt_ids=rng.integers(5, 50, int(rng.integers(2, 6))).tolist())
    t.response_ids, t.model_mask = t.response_ids + ids, t.model_mask + mask
    t.entropies = t.entropies + rng.random(len(ids)).tolist()
    t.logprobs = t.logprobs + [0.0] * len(ids)
    t.finish, t.reward = ("length" if trailing else "answer"), float(rng.random() < 0.5)
    return t


def random_groups(seed: int, privileged: bool) -> list[list[Trajectory]]:
    """``PROBLEMS`` groups of M: parents, branches from their model tokens (two at one node, one
    with no token of its own), a filler (the first problem's with no model token); with
    ``privileged`` the last two are privileged rollouts."""
    rng = np.random.default_rng(seed)
    groups = []
    for _ in range(PROBLEMS):
        parents = [rollout(rng) for _ in range(4)]
        while parents[0].n_model_tokens < 3:
            parents[0] = rollout(rng)
        at = int(rng.integers(1, parents[0].n_model_tokens))
        branches = [rollout(rng, parents[0].branch_prefix(at, 0)), rollout(rng, parents[0].branch_prefix(at, 0)),
                    rollout(rng, parents[0].branch_prefix(at, 0), own_tokens=False)]
        for b in branches:
            b.kind, b.parent, b.at = "branch", 0, at
        # the first problem's filler has no model token (cut off in its first observation)
        fill = rollout(rng, own_tokens=bool(groups))
        fill.kind = "fill"
        group = [*parents, *branches, fill]
        if privileged:
            group = [*parents, rollout(rng), fill, rollout(rng), rollout(rng)]
            for t in group[-2:]:
                t.kind = "privileged"
        group[0].reward, group[1].reward = 1.0, 0.0  # every group has something to learn
        groups.append(group)
    return groups


def method_overrides(name: str) -> dict:
    """The test's sizes for the knobs a method has: its group size and response cap."""
    knobs = get_method(name).config.__dataclass_fields__
    return {k: v for k, v in {"budget": M, "max_response_len": MAX_RESPONSE}.items() if k in knobs}


def run_config(name: str, *overrides: str):
    """The run config of ``name`` at the test's sizes, on the verl backend (paper preset)."""
    schema.register()
    sizes = [f"method.{k}={v}" for k, v in method_overrides(name).items()]
    with initialize_config_dir(str(CONFIGS), version_base=None):
        cfg = compose("config", overrides=["preset=paper", "backend=verl", f"method={name}", f"rl.problems_per_step={PROBLEMS}",
                                           "rl.ppo_mini_batches=1", *sizes, *overrides])
    schema.validate(cfg)
    return cfg


def both_credits(name: str, verl_batch, seed: int):
    """(flat rollouts, local credit tensors, verl batch after ``credit.assign``, verl row of each
    flat rollout) for one random batch; the method's hooks (a KL in the reward, off-context
    weights) fed the same log-probs on both sides."""
    groups = random_groups(seed, privileged=get_method(name).off_context_credit)
    flat = [t for g in groups for t in g]
    rng = np.random.default_rng(seed + 100)
    order = rng.permutation(len(flat))  # verl's batch balancing reorders rows
    width = max(len(t.response_ids) for t in flat) + 4
    old = torch.from_numpy(rng.normal(-2.0, 0.5, (len(flat), width))).float()
    ref = old + torch.from_numpy(rng.normal(0.0, 0.3, (len(flat), width))).float()
    behaviour = torch.from_numpy(rng.normal(-2.0, 0.5, (len(flat), width))).float()
    leaked = {(g, k) for g, group in enumerate(groups) for k, t in enumerate(group) if t.kind == "privileged" and k % 2}
    batch = verl_batch(groups, width, order, fields=lambda g, k, t: {"cbpo_leaked": (g, k) in leaked})
    batch.batch["old_log_probs"], batch.batch["ref_log_prob"] = old, ref
    row_of = np.argsort(order)  # the verl row of flat rollout i

    local = get_method(name)(vocab_size=64, **method_overrides(name))
    if reward_kl(local) > 0:
        for i, t in enumerate(flat):
            t.ref_kl = ((old - ref)[row_of[i], : len(t.response_ids)].numpy() * np.asarray(t.model_mask)).tolist()
    if get_method(name).off_context_credit:
        index = {id(t): i for i, t in enumerate(flat)}

        def on_model_tokens(values, t):
            return values[row_of[index[id(t)]], torch.as_tensor(t.model_positions())].double().numpy()

        local.off_context(
            [{k: (on_model_tokens(old, t), on_model_tokens(behaviour, t)) for k, t in enumerate(group) if t.kind == "privileged"}
             for group in groups],
            [{k for k in range(len(group)) if (g, k) in leaked} for g, group in enumerate(groups)])
    credits = [c for g in local.credit(groups) for c in g]
    tensors = rollout_tensors(flat, credits, pad_id=0)

    remote = get_method(name)(vocab_size=64, **method_overrides(name))
    if get_method(name).off_context_credit:
        credit.off_context(batch, remote, behaviour[credit.privileged_rows(batch)])
    credit.assign(batch, remote)
    return flat, credits, tensors, batch, row_of


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("name", RL)
def test_verls_credit_is_the_local_credit_per_model_token(verl_batch, name, seed):
    flat, _, local, batch, row_of = both_credits(name, verl_batch, seed)
    r = local["advantages"].shape[1]
    adv, loss_mask = batch.batch["advantages"][row_of], batch.batch["response_mask"][row_of]
    torch.testing.assert_close(adv[:, :r], local["advantages"], atol=1e-5, rtol=0)
    assert torch.equal(loss_mask[:, :r].float(), local["loss_mask"])
    assert not adv[:, r:].any() and not loss_mask[:, r:].any()
    assert local["advantages"].abs().sum() > 0  # the batch has credit to compare


@pytest.mark.parametrize(("name", "agg"), [(name, None) for name in RL] + [("grpo", mode) for mode in LOSS_AGG_MODES])
def test_verls_actor_loss_is_the_local_loss_with_the_trainers_normalisers(verl_batch, monkeypatch, name, agg):
    """verl's actor loss on the credited batch, as its trainer hands it the mini-batch (the whole
    step here: ``ppo_mini_batch_size x rollout.n`` rows, those without a loss token included)
    and with the actor config the suite generates, against the local trainer's loss on the same
    rollouts, log-probs and credit: value and gradient w.r.t. the log-probs. Each method with its
    own aggregation, and GRPO with each of verl's (``agg``)."""
    import baselines.aepo_loss  # noqa: F401  AEPO's verl policy loss, as verl's processes import it
    from tensordict import TensorDict
    from verl.utils import tensordict_utils as tu
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.utils import losses

    from cbpo.backends.verl import config as verl_config

    flat, credits, local, batch, row_of = both_credits(name, verl_batch, seed=2)
    cfg = run_config(name, *([f"method.loss_agg_mode={agg}"] if agg else []))
    method_cfg, rl = schema.method_config(cfg), schema.settings(cfg, "rl")
    generated = verl_config.build(cfg, method_cfg, rl, schema.settings(cfg, "verl"), "train.parquet", Path("."))
    actor = omega_conf_to_dataclass(generated.actor_rollout_ref.actor)
    rows = len(flat)
    assert generated.actor_rollout_ref.actor.ppo_mini_batch_size * generated.actor_rollout_ref.rollout.n == rows
    assert any(not np.any(m) for _, m in credits)  # a row without a loss token counts in 1/M

    g = torch.Generator().manual_seed(3)
    width = batch.batch["advantages"].shape[1]
    log_prob = (batch.batch["old_log_probs"].double() + 0.5 * torch.randn(rows, width, generator=g, dtype=torch.float64)).requires_grad_()
    mask = batch.batch["response_mask"]
    data = TensorDict({"response_mask": mask, "old_log_probs": batch.batch["old_log_probs"].double(),
                       "advantages": batch.batch["advantages"].double(), "ref_log_prob": batch.batch["ref_log_prob"].double()},
                      batch_size=[rows])
    # as verl's trainer (_update_actor) and engine (forward_backward_batch) set them, one rank
    tu.assign_non_tensor(data, dp_size=1, batch_num_tokens=int(mask.sum()),
                         global_batch_size=generated.actor_rollout_ref.actor.ppo_mini_batch_size * generated.actor_rollout_ref.rollout.n)
    monkeypatch.setattr(losses, "no_padding_2_padding", lambda tensor, data: tensor)  # the tensors are padded
    remote, _ = losses.ppo_loss(actor, {"log_probs": log_prob}, data)

    r = local["advantages"].shape[1]
    mine, _ = policy_objective(log_prob[row_of][:, :r], batch.batch["old_log_probs"].double()[row_of][:, :r],
                               local["advantages"].double(), local["loss_mask"].double(),
                               ref_log_prob=batch.batch["ref_log_prob"].double()[row_of][:, :r], objective=method_cfg.objective(),
                               **loss_normalisers(credits, range(rows), rl.agent.max_total_tokens))
    assert float(mine) == pytest.approx(float(remote), abs=1e-5, rel=1e-5)
    (grad_local,) = torch.autograd.grad(mine, log_prob, retain_graph=True)
    (grad_remote,) = torch.autograd.grad(remote, log_prob)
    torch.testing.assert_close(grad_local, grad_remote, atol=1e-5, rtol=1e-5)
