"""Several processes through torch.distributed.run, run inside the launcher process."""
