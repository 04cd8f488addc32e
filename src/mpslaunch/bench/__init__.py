"""Measurement behind `mpslaunch bench`: devices, workloads, timing, and the report."""
