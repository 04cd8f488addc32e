"""Running a plan: one process (single), or several through torch.distributed.run (torchrun)."""
