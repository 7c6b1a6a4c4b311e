"""verl 0.9.1 on a machine without a GPU: the one place the verl backend bends verl to run on
CPUs, so that the real Ray, FSDP and vLLM processes of ``backend=verl`` run (and are tested) on
a laptop or CI. Never used where torch sees a CUDA GPU: ``launch.py`` calls ``activate`` only
then, and importing this module with a GPU present raises.

verl 0.9.1 has no CPU platform (its main branch adds one, unreleased). Without a GPU it falls
back to CUDA and NCCL, and ``auto_set_device`` turns ``trainer.device=cpu`` back into ``cuda``.
What this module changes, each for one reason (measured on these machines, ../shared/NOTES.md):

* ``PlatformCPU``, registered in verl's ``PlatformRegistry`` as ``cpu`` and chosen with
  ``VERL_PLATFORM=cpu``: device "cpu", process groups on gloo (NCCL needs GPUs), a device module
  (``_DeviceModule``) that answers verl's ``torch.cuda``-style memory, stream and RNG calls for the
  CPU, and Ray's "GPU" resource: Ray is started with fake GPUs (``init_ray``) so verl's placement
  groups, which ask for GPUs, are met.
* verl asks torch for process groups on ``"cpu:gloo,<device>:<backend>"``, which names the CPU
  twice here and torch refuses: that one string becomes plain ``"gloo"``.
* ``VERL_ENGINE_DEVICE=cuda``: verl registers its FSDP training engines for cuda/npu only; the
  engine still places tensors on the platform's device (cpu).
* FSDP2 offloads the reference model with ``CPUOffloadPolicy(pin_memory=True)``; pinning needs
  CUDA, so the policy is built with ``pin_memory=False`` (the model is on the CPU already).
* Weight sync: vLLM's CPU build prepacks linear weights into oneDNN and empties
  ``layer.weight``, so verl's ``model.load_weights`` into the running engine fails. Each bucket is
  cloned out of the shared-memory buffer verl reuses for the next one, and the whole state goes
  through vLLM's own ``reload_weights`` (its model runner's API, on GPU too), which restores the
  checkpoint layout, loads, and prepacks again.
* ``rl.async_training`` (the actor and the vLLM servers in processes of their own): verl pushes
  the weights over NCCL (its checkpoint engines are NCCL, HCCL, NIXL and others, none on CPU).
  ``GlooCheckpointEngine``, registered as ``gloo``, sends them from the actor's rank 0 to the
  servers' checkpoint-engine workers over a gloo group of their own; the workers hand them to
  vLLM as for a colocated engine (below).
* Settings (``config_overrides``): FSDP2 (``strategy=fsdp2``), sdpa attention and no remove-
  padding (flash-attention is CUDA only), vLLM eager (its CPU compile costs ~1 min) with the
  KV cache kept between phases (``free_cache_engine=false``: sleep mode is GPU only), float32,
  and 32-token KV blocks (``CPU_BLOCK_SIZE``, as the local vLLM engine: the CPU default of 128
  would serve a branch's prefix from the cache only in 128-token steps); OPD's teacher servers
  the same (verl's default asks the teacher's vLLM for sleep mode, which it refuses).

The module is loaded by verl itself in every process that imports verl: the launch lists it in
``VERL_USE_EXTERNAL_MODULES`` before Ray starts, so Ray's workers inherit it.
"""
from __future__ import annotations

import asyncio
import contextlib
import datetime
import functools
import importlib.util
import os
import pickle
from typing import Any

import torch

if torch.cuda.is_available():
    raise ImportError("cbpo.backends.verl.cpu bends verl for machines without a GPU; this one has one")

PLATFORM = "cpu"
ENV = {
    "VERL_PLATFORM": PLATFORM,
    "VERL_ENGINE_DEVICE": "cuda",
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB of KV cache per vLLM engine
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",  # several processes share two cores
}
GLOO_ENGINE = "gloo"
# a checkpoint engine's group waits this long for its peers and each tensor (CPU weights are slow)
GLOO_TIMEOUT = datetime.timedelta(minutes=10)
# Ray placement: verl asks each worker bundle for CPUs beside its GPU; a laptop's 2 cores are
# counted as this many (with fewer the placement group waits forever).
RAY_CPUS_PER_GPU = 8


def config_overrides(dtype: str, teacher: bool = False, separate: bool = False) -> dict:
    """verl keys a CPU run needs on top of the generated config (see the module docstring);
    ``teacher``: OPD's teacher servers (verl's distillation) get the rollout's vLLM settings;
    ``separate``: the servers run apart from the actor (no hybrid engine), weights over gloo."""
    engine = {"strategy": "fsdp2", "fsdp_config": {"dtype": dtype}}
    from cbpo.rollout.vllm_engine import CPU_BLOCK_SIZE

    vllm = {"enforce_eager": True, "free_cache_engine": False, "enable_sleep_mode": False, "dtype": dtype,
            "engine_kwargs": {"vllm": {"block_size": CPU_BLOCK_SIZE}}}
    overrides = {
        "actor_rollout_ref": {
            "model": {"use_remove_padding": False, "override_config": {"attn_implementation": "sdpa"}},
            "actor": engine, "ref": engine, "rollout": vllm,
        },
        "trainer": {"device": PLATFORM},
    }
    if separate:
        vllm["checkpoint_engine"] = {"backend": GLOO_ENGINE, "custom_backend_module": __name__}
    if teacher:
        overrides["distillation"] = {"teacher_models": {"teacher_model": {"inference": vllm}}}
    return overrides


def sft_overrides() -> dict:
    """The same settings for verl's SFT trainer (``sft_trainer_engine``), as Hydra overrides;
    torch.compile off, as the rollout's vLLM runs eager."""
    return {"model.use_remove_padding": "false", "+model.override_config.attn_implementation": "sdpa",
            "engine.dtype": "float32", "engine.use_torch_compile": "false", "trainer.device": PLATFORM}


def activate() -> None:
    """Patch verl in this process, and make the Ray workers it starts load this module when
    they import verl (verl's own import of it here finds it imported already)."""
    os.environ.update(ENV)
    _patch_verl()


def init_ray(config) -> None:
    """Ray with verl's runtime env: the cluster named by ``RAY_ADDRESS`` (started with fake GPUs,
    ``ray start --num-gpus``, as slurm/ray-on-slurm.sh does), else a new one on this machine with
    as many fake GPUs as the run asks for (never another Ray cluster found on the machine)."""
    import ray
    from verl.trainer.constants_ppo import get_ppo_ray_runtime_env

    from omegaconf import OmegaConf

    runtime_env = OmegaConf.to_container(OmegaConf.merge(get_ppo_ray_runtime_env(config),
                                                         config.ray_kwargs.ray_init.runtime_env))
    if os.environ.get("RAY_ADDRESS"):
        ray.init(address=os.environ["RAY_ADDRESS"], runtime_env=runtime_env)
        return
    from cbpo.backends.verl.config import held_gpus

    gpus = held_gpus(config)
    ray.init(address="local", num_cpus=RAY_CPUS_PER_GPU * gpus, num_gpus=gpus, runtime_env=runtime_env)


class _Stream:
    """A CUDA stream's interface for code that waits on streams: the CPU runs in order."""

    def __init__(self, *args, **kwargs):
        pass

    def wait_stream(self, *_):
        pass

    def synchronize(self):
        pass

    def record_event(self, *_):
        return _Event()


class _Event:
    def __init__(self, *args, **kwargs):
        pass

    def record(self, *_):
        pass

    def synchronize(self):
        pass

    def wait(self, *_):
        pass


class _DeviceModule:
    """What verl calls on ``get_torch_device()`` (torch.cuda on a GPU), for the CPU: memory
    queries answer from the system, caches and streams are no-ops, RNG is torch's CPU RNG."""

    Stream = _Stream
    Event = _Event

    @staticmethod
    def is_available() -> bool:
        return True

    @staticmethod
    def device_count() -> int:
        return 1

    @staticmethod
    def current_device() -> str:
        return PLATFORM

    @staticmethod
    def get_device_name(*_) -> str:
        return "cpu"

    @staticmethod
    def mem_get_info(*_) -> tuple[int, int]:
        import psutil

        vm = psutil.virtual_memory()
        return vm.available, vm.total

    @staticmethod
    def memory_allocated(*_) -> int:
        return 0

    memory_reserved = max_memory_allocated = max_memory_reserved = memory_allocated

    @staticmethod
    def current_stream(*_) -> _Stream:
        return _Stream()

    @staticmethod
    def stream(*_):
        return contextlib.nullcontext()

    get_rng_state = staticmethod(torch.get_rng_state)
    set_rng_state = staticmethod(torch.set_rng_state)
    manual_seed = manual_seed_all = staticmethod(torch.manual_seed)

    @staticmethod
    def _noop(*_, **__) -> None:
        return None

    empty_cache = synchronize = set_device = ipc_collect = set_per_process_memory_fraction = _noop


def _register_platform() -> None:
    from verl.plugin.platform.platform_base import PlatformBase
    from verl.plugin.platform.platform_manager import PlatformRegistry

    @PlatformRegistry.register(platform=PLATFORM)
    class PlatformCPU(PlatformBase):
        device_name = PLATFORM
        vendor_name = PLATFORM
        device_module = _DeviceModule

        def is_available(self) -> bool:
            return True

        def is_platform_available(self, use_smi_check=False) -> bool:
            return os.environ.get("VERL_PLATFORM") == PLATFORM  # never auto-detected

        def current_device(self) -> str:
            # verl passes this to torch as a device (model.to(device=...)), where an int means cuda:N
            return PLATFORM

        def device_count(self) -> int:
            return 1

        def set_device(self, device_index: int) -> None:
            pass

        def synchronize(self, device_index=None) -> None:
            pass

        def manual_seed(self, seed: int) -> None:
            torch.manual_seed(seed)

        def manual_seed_all(self, seed: int) -> None:
            torch.manual_seed(seed)

        def set_allocator_settings(self, settings: str) -> None:
            pass

        def empty_cache(self) -> None:
            pass

        def get_device_capability(self, device_index: int = 0):
            return None, None

        def communication_backend_name(self) -> str:
            return "gloo"

        def visible_devices_envvar(self) -> str:
            return "CUDA_VISIBLE_DEVICES"  # what Ray sets for its (fake) GPUs

        def ray_resource_name(self) -> str:
            return "GPU"

        def ray_resource_options(self, num_gpus: float) -> dict[str, Any]:
            return {"num_gpus": num_gpus}

        def ray_noset_envvars(self) -> list[str]:
            return []

        def is_ipc_supported(self) -> bool:
            return False

        def rollout_env_vars(self) -> dict[str, str]:
            return {}

        def get_collective_module(self):
            return None

        @contextlib.contextmanager
        def nvtx_range(self, msg: str):
            yield

        def profiler_start(self) -> None:
            pass

        def profiler_stop(self) -> None:
            pass

        def cudart(self):
            return None


def _gloo_process_groups() -> None:
    init_process_group = torch.distributed.init_process_group
    twice = f"{PLATFORM}:gloo,{PLATFORM}:gloo"

    @functools.wraps(init_process_group)
    def init(*args, backend=None, **kwargs):
        return init_process_group(*args, backend="gloo" if backend == twice else backend, **kwargs)

    torch.distributed.init_process_group = init


def _unpinned_offload() -> None:
    from verl.workers.engine.fsdp import transformer_impl

    policy = transformer_impl.CPUOffloadPolicy
    if policy is not None:
        transformer_impl.CPUOffloadPolicy = lambda *args, **kwargs: policy(*args, **{**kwargs, "pin_memory": False})


def _reload_weights_through_vllm() -> None:
    from verl.workers.rollout.vllm_rollout import utils

    def update_weights_from_ipc(self, peft_config: dict = None, base_sync_done=False, use_shm: bool = False):
        from verl.workers.rollout.vllm_rollout.bucketed_weight_transfer import BucketedWeightReceiver

        if peft_config:
            raise NotImplementedError("LoRA weight sync on CPU: the suite trains full weights")
        weights: list[tuple[str, torch.Tensor]] = []
        receiver = BucketedWeightReceiver(zmq_handle=self._get_zmq_handle(), device=torch.device(PLATFORM),
                                          use_shm=use_shm)
        # clone: the receiver reuses its buffer for the next bucket
        receiver.receive_weights(on_bucket_received=lambda bucket, is_last: weights.extend(
            (name, tensor.clone()) for name, tensor in bucket))
        self.model_runner.reload_weights(weights_iterator=iter(weights))

    utils.vLLMColocateWorkerExtension.update_weights_from_ipc = update_weights_from_ipc


def _register_checkpoint_engine() -> None:
    from verl.checkpoint_engine.base import CheckpointEngine, CheckpointEngineRegistry
    from verl.utils.net_utils import get_free_port

    @CheckpointEngineRegistry.register(GLOO_ENGINE)
    class GlooCheckpointEngine(CheckpointEngine):
        """The actor's rank 0 broadcasts each weight, as bytes, to every server's checkpoint-
        engine worker over a gloo group built for one update (verl calls ``prepare``,
        ``build_topology`` and ``init_process_group`` before each push, ``finalize`` after);
        each weight's name, shape and dtype go ahead of it through the group's TCP store."""

        def __init__(self, bucket_size: int, is_master: bool = False, **_) -> None:
            self.is_master = is_master  # verl's actor rank 0; the servers' workers are not
            self.rank, self.store, self.group = -1, None, None

        def prepare(self) -> dict:
            if not self.is_master:
                return {}
            import ray

            host = ray.util.get_node_ip_address().strip("[]")
            return {"address": (host, get_free_port(host)[0])}

        @classmethod
        def build_topology(cls, actor_wg_world_size: int, rollout_world_size: int, metadata: list[dict]):
            world, address = 1 + rollout_world_size, metadata[0]["address"]
            # one sender: the actor's other ranks only walk their (collective) weight generator
            return ({"rank": [0] + [-1] * (actor_wg_world_size - 1), "world_size": [world] * actor_wg_world_size,
                     "address": [address] * actor_wg_world_size},
                    {"rank": list(range(1, world)), "world_size": [world] * rollout_world_size,
                     "address": [address] * rollout_world_size})

        def init_process_group(self, rank: int, world_size: int, address) -> None:
            self.rank = rank
            if rank < 0:
                return
            self.store = torch.distributed.TCPStore(address[0], address[1], world_size, is_master=rank == 0,
                                                    timeout=GLOO_TIMEOUT)
            self.group = torch.distributed.ProcessGroupGloo(self.store, rank, world_size, GLOO_TIMEOUT)

        def finalize(self) -> None:
            self.rank, self.store, self.group = -1, None, None

        async def _broadcast(self, weight: torch.Tensor) -> None:
            # as bytes (any dtype), off the event loop: gloo blocks until every rank has it
            await asyncio.to_thread(lambda: self.group.broadcast(weight.view(-1).view(torch.uint8), 0).wait())

        async def send_weights(self, weights, global_steps=None):
            if self.rank < 0:
                for _ in weights:
                    pass
                return
            count = 0
            for name, weight in weights:
                weight = weight.detach().to(PLATFORM).contiguous()
                self.store.set(f"weight/{count}", pickle.dumps((name, weight.shape, weight.dtype)))
                await self._broadcast(weight)
                count += 1
            self.store.set(f"weight/{count}", pickle.dumps(None))

        async def receive_weights(self, global_steps=None):
            count = 0
            while (meta := pickle.loads(await asyncio.to_thread(self.store.get, f"weight/{count}"))) is not None:
                name, shape, dtype = meta
                weight = torch.empty(shape, dtype=dtype)
                await self._broadcast(weight)
                yield name, weight
                count += 1


_patched = False


def _patch_verl() -> None:
    global _patched
    if _patched:
        return
    _patched = True
    _register_platform()
    _gloo_process_groups()
    _unpinned_offload()
    _register_checkpoint_engine()
    if importlib.util.find_spec("vllm") is not None:  # verl's vLLM module refuses to import without it
        _reload_weights_through_vllm()


if os.environ.get("VERL_PLATFORM") == PLATFORM:  # loaded by verl's import (VERL_USE_EXTERNAL_MODULES)
    _patch_verl()
