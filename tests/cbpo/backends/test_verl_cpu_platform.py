"""cbpo/backends/verl/cpu.py, the CPU platform the engine tier trains verl on: what each patch
changes, in a fresh process (activating it patches verl and torch.distributed for good), and
that it refuses to load where torch sees a GPU. The whole run is in test_verl_cpu.py."""
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("verl")
CONFIGS = Path(__file__).resolve().parents[3] / "configs"


def python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300)


def test_the_platform_is_verls_cpu_one_on_gloo_with_unpinned_offload():
    done = python("""
        import torch
        from cbpo.backends.verl import cpu
        cpu.activate()
        from verl.utils.device import get_device_name, get_nccl_backend, get_torch_device, get_device_id
        from verl.workers.engine.fsdp import transformer_impl
        print(get_device_name(), get_nccl_backend(), get_device_id(), get_torch_device().device_count())
        x = torch.ones(3).to(get_device_id())  # verl moves models with .to(get_device_id())
        print(x.device, transformer_impl.CPUOffloadPolicy(pin_memory=True).pin_memory)
        torch.distributed.init_process_group(backend="cpu:gloo,cpu:gloo", rank=0, world_size=1,
                                             init_method="tcp://127.0.0.1:29611")
        print(torch.distributed.get_backend())
    """)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["cpu", "gloo", "cpu", "1", "cpu", "False", "gloo"]


def test_without_activation_verl_keeps_its_own_platform():
    done = python("""
        import cbpo.backends.verl.cpu
        import torch
        from verl.workers.engine.fsdp import transformer_impl
        print(transformer_impl.CPUOffloadPolicy(pin_memory=True).pin_memory, torch.distributed.init_process_group.__module__)
    """)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["True", "torch.distributed.distributed_c10d"]


def test_the_shim_refuses_to_load_where_torch_sees_a_gpu():
    done = python("""
        import torch
        torch.cuda.is_available = lambda: True
        import cbpo.backends.verl.cpu
    """)
    assert done.returncode != 0 and "this one has one" in done.stderr


def test_on_a_gpu_the_launch_never_imports_the_shim(tmp_path):
    done = python(f"""
        import sys
        from hydra import compose, initialize_config_dir
        from cbpo import schema
        from cbpo.backends.verl import launch
        launch.on_cpu = lambda: False  # what the launch sees where torch has a GPU
        schema.register()
        with initialize_config_dir("{CONFIGS}", version_base=None):
            cfg = compose("config", ["stage=rl", "method=aepo", "backend=verl", "preset=smoke", "verl.dry_run=true",
                                     "verl.gpus_per_node=1"])
        launch.run_verl(cfg, "{tmp_path}")
        import os
        print("shim" if "cbpo.backends.verl.cpu" in sys.modules else "no-shim", os.environ["VERL_USE_EXTERNAL_MODULES"])
    """)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[-2:] == ["no-shim", "baselines.aepo_loss"]


def test_the_gloo_checkpoint_engine_pushes_every_weight_from_the_actor_to_each_server():
    # rl.async_training on CPU: verl's manager calls prepare on every worker, build_topology once,
    # init_process_group, then send_weights on the actor's ranks and receive_weights on the servers'
    done = python("""
        import asyncio, multiprocessing as mp
        import torch
        from cbpo.backends.verl import cpu
        cpu.activate()
        from verl.checkpoint_engine.base import CheckpointEngineRegistry

        WEIGHTS = {"embed": torch.randn(7, 3), "norm": torch.randn(3).to(torch.bfloat16), "step": torch.tensor(4)}

        def actor(rank, kwargs, engine):
            async def send():
                engine.init_process_group(**kwargs)
                await engine.send_weights(iter(WEIGHTS.items()))
                engine.finalize()
            asyncio.run(send())

        def server(kwargs, engine, out):
            async def receive():
                engine.init_process_group(**kwargs)
                got = {name: w async for name, w in engine.receive_weights()}
                engine.finalize()
                return got
            got = asyncio.run(receive())
            out.put(sorted(name for name in got if got[name].dtype == WEIGHTS[name].dtype
                           and torch.equal(got[name], WEIGHTS[name])))

        if __name__ == "__main__":
            cls = CheckpointEngineRegistry.get(cpu.GLOO_ENGINE)
            actors = [cls(bucket_size=1 << 20, is_master=rank == 0) for rank in range(2)]
            servers = [cls(bucket_size=1 << 20) for _ in range(2)]
            metadata = [e.prepare() for e in actors + servers]
            actor_kw, server_kw = cls.build_topology(2, 2, metadata)
            print(actor_kw["rank"], server_kw["rank"])
            out = mp.get_context("fork").Queue()
            procs = [mp.get_context("fork").Process(target=actor, args=(r, {k: v[r] for k, v in actor_kw.items()}, actors[r]))
                     for r in range(2)]
            procs += [mp.get_context("fork").Process(target=server, args=({k: v[r] for k, v in server_kw.items()}, servers[r], out))
                      for r in range(2)]
            for p in procs:
                p.start()
            print(out.get(timeout=120), out.get(timeout=120))
            for p in procs:
                p.join(timeout=60)
            print([p.exitcode for p in procs])
    """)
    assert done.returncode == 0, done.stderr[-3000:]
    names = "['embed', 'norm', 'step']"
    assert done.stdout.splitlines() == ["[0, -1] [1, 2]", f"{names} {names}", "[0, 0, 0, 0]"]
