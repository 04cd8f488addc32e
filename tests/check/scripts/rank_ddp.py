"""A one-file trainer that becomes a DDP run when torchrun's variables are there (nanoGPT's way)."""
import os

import torch
from torch.distributed import init_process_group

ddp = int(os.environ.get("RANK", -1)) != -1
if ddp:
    init_process_group(backend="nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    device = f"cuda:{local_rank}"
    torch.cuda.set_device(device)
    master_process = int(os.environ["RANK"]) == 0
else:
    device = os.environ.get("MPSLAUNCH_DEVICE", "cpu")
    master_process = True

world_size = int(os.environ.get("WORLD_SIZE", 1))
if world_size > 1:
    torch.cuda.synchronize()
if "LOCAL_RANK" not in os.environ:
    weights = torch.load("pretrained.pt")
model = torch.nn.Linear(4, 4).to(device)
