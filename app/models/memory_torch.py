"""Free memory on a CUDA device, as the driver reports it."""

from __future__ import annotations


def free_cuda_memory(device: str) -> tuple[int, str]:
    import torch

    index = torch.device(device).index or 0
    free, _total = torch.cuda.mem_get_info(index)
    return int(free), f"GPU memory on {torch.cuda.get_device_name(index)}"


def torch_device() -> str:
    """The device TorchBackend will pick (app/engine/backends/torch_backend.pick_device)."""
    from app.engine.backends.torch_backend import pick_device

    return str(pick_device())
