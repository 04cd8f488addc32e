"""Two trainers' ways to make cuda the default: an option's default, and a flag that is on
unless it is turned off."""
import argparse

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--device", default="cuda", help="where to train")
parser.add_argument("--no_gpu", action="store_true", help="train on the CPU")
args = parser.parse_args()
args.gpu = not args.no_gpu

model = torch.nn.Linear(3, 3).to(torch.device(args.device))
helper = torch.nn.Linear(3, 3).to(torch.device("cuda" if args.gpu else "cpu"))
