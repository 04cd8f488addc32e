"""A distributed trainer that states its need for a GPU before it uses one."""
import os
import sys

import torch

local_rank = int(os.environ.get("LOCAL_RANK", 0))


def setup(model, checkpoint):
    state = torch.load(checkpoint)
    assert torch.cuda.device_count() > local_rank, "one GPU per process"
    torch.cuda.set_device(local_rank)
    model.load_state_dict(state)
    return model.cuda(local_rank)


def evaluate(model):
    if not torch.cuda.is_available():
        sys.exit("evaluation needs a GPU")
    torch.cuda.synchronize()
    return model(torch.ones(1, 4).cuda())


if __name__ == "__main__":
    evaluate(setup(torch.nn.Linear(4, 4), sys.argv[1]))
