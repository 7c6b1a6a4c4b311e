"""The local backend's SFT loop (cbpo/backends/local/sft.py): micro-batches change memory only,
and the learning-rate schedule."""
import json

import pytest
import torch


def _sft_params(net, tokenizer, tmp_path, micro_batches):
    from cbpo.stages import SFTConfig
    from cbpo.backends.local.sft import sft
    from cbpo.runlog import MetricsLog

    rows = [{"question": f"What is {a} plus {b}?" + " Think." * (a % 4),
             "trace": f"<python>print({a} + {b})</python><result>\n{a + b}\n</result><answer>\\boxed{{{a + b}}}</answer>"}
            for a in range(1, 9) for b in range(1, 3)]
    run = tmp_path / f"mb{micro_batches}"
    sft(net, tokenizer, rows, SFTConfig(steps=2, batch_size=8, lr=1e-2, warmup_steps=1, micro_batches=micro_batches),
        run, MetricsLog(run / "m.jsonl"), None)
    loss = [json.loads(line)["sft_loss"] for line in (run / "m.jsonl").read_text().splitlines()]
    return torch.cat([p.detach().flatten() for p in net.parameters()]), loss


def test_sft_micro_batches_give_the_same_update(tokenizer, tiny_causal_lm, tmp_path):
    # Splitting the length-sorted batch only removes padding: the token-mean loss and the
    # step are those of the whole batch.
    (one, loss_one), (three, loss_three) = (_sft_params(tiny_causal_lm(tokenizer), tokenizer, tmp_path, n) for n in (1, 3))
    assert torch.allclose(one, three, atol=1e-5)
    assert loss_one == pytest.approx(loss_three, rel=1e-5) and loss_one[0] > 1.0
    # Each logged SFT step carries its wall time (the tables' device-hours add them up).
    records = [json.loads(line) for line in (tmp_path / "mb1" / "m.jsonl").read_text().splitlines()]
    assert all(r["wall_seconds"] > 0 for r in records)


def test_sft_schedule_warms_up_then_decays():
    from cbpo.stages import SFTConfig
    from cbpo.backends.local.sft import _lr_lambda

    f = _lr_lambda(SFTConfig(steps=110, warmup_steps=10, decay="cosine", min_lr_ratio=0.1))
    assert f(0) == pytest.approx(0.1) and f(9) == pytest.approx(1.0) and f(10) == pytest.approx(1.0)
    assert f(60) == pytest.approx(0.55) and f(110) == pytest.approx(0.1)
    assert _lr_lambda(SFTConfig(steps=110, warmup_steps=10))(100) == 1.0
    with pytest.raises(ValueError, match="decay"):
        _lr_lambda(SFTConfig(decay="linear"))
