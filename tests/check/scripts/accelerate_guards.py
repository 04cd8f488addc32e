"""An Accelerate trainer whose branches test the main process, gradient sync and a GPU option:
none of them tests the device, so none of them keeps cuda away from a Mac."""
import argparse

import torch
from accelerate import Accelerator


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--gpu", type=int, default=None, help="the GPU to load the checkpoint on")
    parser.add_argument("--resume", default="")
    args = parser.parse_args()
    accelerator = Accelerator()
    model = torch.nn.Linear(4, 4)
    shadow = torch.nn.Linear(4, 4)
    if args.resume:
        if args.gpu is None:
            state = torch.load(args.resume)
        else:
            state = torch.load(args.resume, map_location=f"cuda:{args.gpu}")
        model.load_state_dict(state)
    optimizer = torch.optim.AdamW(model.parameters())
    model, optimizer = accelerator.prepare(model, optimizer)
    for _ in range(4):
        with accelerator.accumulate(model):
            loss = model(torch.randn(2, 4, device=accelerator.device)).sum()
            accelerator.backward(loss)
            optimizer.step()
        if accelerator.sync_gradients:
            shadow.to(device="cuda")
        if accelerator.is_main_process:
            with torch.autocast("cuda"):
                print(shadow(torch.ones(1, 4)).sum().item())


if __name__ == "__main__":
    main()
