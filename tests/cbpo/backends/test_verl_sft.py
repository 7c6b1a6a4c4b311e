"""SFT on verl (cbpo/backends/verl/sft.py) up to verl's trainer: the dataset verl's SFT trainer
reads holds the local trainer's tokens and loss mask (model tokens only), and the settings that
decide the update reach verl's config. The run itself is in test_verl_cpu.py (engine tier)."""
import dataclasses
from pathlib import Path

import pytest

pytest.importorskip("verl")

from cbpo.backends.verl import sft  # noqa: E402
from cbpo.chat import TOOL_TAGS  # noqa: E402
from cbpo.models import train_tokenizer  # noqa: E402
from cbpo.stages import SFTConfig  # noqa: E402
from cbpo.chat import encode_trace  # noqa: E402

ROWS = [{"question": "What is 12 + 7?", "trace": "<think>add</think><python>print(12 + 7)</python><result>\n19\n</result>"
                                                "<answer>\\boxed{19}</answer>"},
        {"question": "Who wrote it?", "trace": "<answer>\\boxed{Ann}</answer>"}]


def test_verls_sft_dataset_is_the_local_trainers_tokens_and_loss_mask(tmp_path):
    from omegaconf import OmegaConf

    tokenizer = train_tokenizer([r["question"] + r["trace"] for r in ROWS] * 20, 300)
    tokenizer.save_pretrained(tmp_path / "init")
    cfg = OmegaConf.create({"system_prompt": "none", "run_name": "sft"})
    sft.write_inputs(cfg, ROWS, tmp_path / "init", tmp_path, SFTConfig(max_len=256))
    data = sft.SuiteSFTDataset(str(tmp_path / "verl" / sft.TRAIN_FILE))
    assert len(data) == len(ROWS)
    for i, row in enumerate(ROWS):
        ids, mask = encode_trace(tokenizer, row["question"], row["trace"], None)
        item = data[i]
        assert item["input_ids"].tolist() == ids and item["loss_mask"].tolist() == mask
        assert item["position_ids"].tolist() == list(range(len(ids)))
    # the observation is not trained on: no token of "<result>...</result>" is in the mask
    ids, mask = data[0]["input_ids"].tolist(), data[0]["loss_mask"].tolist()
    text = tokenizer.decode([t for t, m in zip(ids, mask) if m])
    assert "19\n" not in text.split(TOOL_TAGS["python"][1])[-1].split("<answer>")[0]
    assert 0 < sum(mask) < len(ids)


def test_too_long_a_trace_stops_the_launch_before_verl_starts(tmp_path):
    from omegaconf import OmegaConf

    tokenizer = train_tokenizer([r["question"] + r["trace"] for r in ROWS] * 20, 300)
    tokenizer.save_pretrained(tmp_path / "init")
    cfg = OmegaConf.create({"system_prompt": "none", "run_name": "sft"})
    with pytest.raises(ValueError, match="2 SFT examples exceed max_len=4 tokens"):
        sft.write_inputs(cfg, ROWS, tmp_path / "init", tmp_path, SFTConfig(max_len=4))


def test_the_suites_sft_settings_reach_verls_config(tmp_path):
    from omegaconf import OmegaConf

    from cbpo.backends.verl.config import VerlConfig

    cfg = OmegaConf.create({"wandb": {"project": "p"}, "run_name": "sft"})
    settings = SFTConfig(steps=7, batch_size=16, lr=2e-4, weight_decay=0.1, warmup_steps=2, decay="cosine",
                         min_lr_ratio=0.1, max_len=300, seed=3, checkpoint_every=5)
    verl_cfg = VerlConfig(nodes=2, gpus_per_node=4, tensor_parallel=1, gpu_memory_utilization=0.5,
                          micro_batch_per_gpu=2, teacher_gpus=1, teacher_tensor_parallel=1)
    config = sft.compose(sft.overrides(cfg, settings, verl_cfg, Path("/models/init"), tmp_path, on_cpu=False))
    assert (config.trainer.total_training_steps, config.data.train_batch_size, config.data.max_length) == (7, 16, 300)
    assert (config.optim.lr, config.optim.weight_decay, config.optim.lr_warmup_steps) == (2e-4, 0.1, 2)
    assert (config.optim.lr_scheduler_type, config.optim.min_lr_ratio) == ("cosine", 0.1)
    assert (config.trainer.nnodes, config.trainer.n_gpus_per_node, config.data.micro_batch_size_per_gpu) == (2, 4, 2)
    assert (config.trainer.save_freq, config.trainer.resume_mode, config.engine.seed) == (5, "auto", 3)
    assert config.data.custom_cls.name == "SuiteSFTDataset" and config.model.path == "/models/init"
    assert "hf_model" in config.checkpoint.save_contents  # final/ is made from plain weights
    # 8 GPUs: 1 row each of a batch of 8, so micro-batches of 1; 6 rows do not split over 8 GPUs
    args = sft.overrides(cfg, dataclasses.replace(settings, batch_size=8), verl_cfg, Path("/m"), tmp_path, on_cpu=False)
    assert "data.micro_batch_size_per_gpu=1" in args
    with pytest.raises(ValueError, match="sft.batch_size=6 does not split over 8 GPUs") as refused:
        sft.overrides(cfg, dataclasses.replace(settings, batch_size=6), verl_cfg, Path("/m"), tmp_path, on_cpu=False)
    assert "--config verl_nodes=N verl_gpus_per_node=G" in str(refused.value)  # the DAG's keys that fix it


def test_sft_on_several_nodes_is_a_torchrun_per_node_of_the_slurm_allocation(tmp_path):
    from cbpo.backends.verl.config import VerlConfig

    def command(nodes, env):
        verl_cfg = VerlConfig(nodes=nodes, gpus_per_node=4, tensor_parallel=1, gpu_memory_utilization=0.5,
                              micro_batch_per_gpu=2, teacher_gpus=1, teacher_tensor_parallel=1)
        return sft.torchrun(verl_cfg, tmp_path, env)

    one = command(1, {})
    assert "--standalone" in one and "--nproc_per_node=4" in one and one[0] != "srun"
    two = command(2, {"SLURM_JOB_ID": "17", "SLURM_JOB_NUM_NODES": "2", "MASTER_PORT": "29611"})
    # one task per node, each a torchrun of 4 processes, meeting on this node (the allocation's first)
    assert two[:5] == ["srun", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--kill-on-bad-exit=1"], two
    assert {"--nnodes=2", "--nproc_per_node=4", "--master_port=29611"} <= set(two), two
    # each task's node rank is its SLURM node id, set in the task (torchrun reads PET_NODE_RANK)
    assert two[two.index("-c") + 1] == 'PET_NODE_RANK="$SLURM_NODEID" exec "$@"', two
    assert "--standalone" not in two and two[-2:] == [sft.__name__, str(tmp_path)]
    for env, held in (({}, "no SLURM allocation"), ({"SLURM_JOB_ID": "17", "SLURM_JOB_NUM_NODES": "1"}, "1 node")):
        with pytest.raises(RuntimeError, match=f"verl.nodes=2 trains SFT on 2 nodes.*{held}"):
            command(2, env)
