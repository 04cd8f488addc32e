"""Checkpoints written and read back by the same script, one given by the user, and two loaded
straight onto a GPU."""
import argparse
import os

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--init", default="", help="weights to start from")
parser.add_argument("--out", default="runs")
args = parser.parse_args()
rank = int(os.environ.get("RANK", 0))
model = torch.nn.Linear(2, 2)
if args.init:
    model.load_state_dict(torch.load(args.init))

best = os.path.join(args.out, "best.pt")
torch.save(model.state_dict(), best)
model.load_state_dict(torch.load(best))
torch.save(model.state_dict(), os.path.join(args.out, "last.pt"))
model.load_state_dict(torch.load(os.path.join(args.out, "last.pt")))
with open(os.path.join(args.out, "whole.pt"), "wb") as handle:
    torch.save(model, handle)
with open(os.path.join(args.out, "whole.pt"), "rb") as handle:
    model = torch.load(handle)

shared = torch.load(os.path.join(args.out, "shared.pt"), map_location=f"cuda:{rank}")
first_gpu = "cuda:0"
weights = torch.load(args.init, map_location=first_gpu)
