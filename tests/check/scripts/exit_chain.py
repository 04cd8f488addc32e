"""Distributed set-up as self-supervised training repositories write it (DINO's way): torchrun's
variables, else SLURM's, else one GPU, else stop."""
import argparse
import os
import sys

import torch
import torch.distributed as dist


def init_distributed_mode(args):
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        args.rank = int(os.environ["RANK"])
        args.world_size = int(os.environ["WORLD_SIZE"])
        args.gpu = int(os.environ["LOCAL_RANK"])
    elif "SLURM_PROCID" in os.environ:
        args.rank = int(os.environ["SLURM_PROCID"])
        args.gpu = args.rank % torch.cuda.device_count()
    elif torch.cuda.is_available():
        args.rank, args.gpu, args.world_size = 0, 0, 1
        os.environ["MASTER_ADDR"] = "127.0.0.1"
    else:
        print("Does not support training without GPU.")
        sys.exit(1)
    dist.init_process_group(backend="nccl", world_size=args.world_size, rank=args.rank)
    torch.cuda.set_device(args.gpu)


def setup(args):
    if "LOCAL_RANK" not in os.environ:
        print("Not using distributed mode")
        return
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))


def main():
    args = argparse.ArgumentParser().parse_args()
    init_distributed_mode(args)
    setup(args)


if __name__ == "__main__":
    main()
