"""Trajectories, statistics, plots and exports of study results."""
