"""Measurement behind `mpslaunch bench`: devices, workloads, timing, and the report.

The command (commands/bench.py) uses three of these modules as they are: devices (which devices
and dtypes can be measured here), measure (one point) and report (the table, JSON, CSV and plot).
devices and measure import torch; report does not.
"""
