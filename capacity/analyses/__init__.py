"""Pure analyses: sizing, modes, tuning, classification, headroom, stalls, priority.

Each takes replay results (or runs replays through `sweep`) and returns frozen results; none renders
charts or prints. Must not import altair, typer or rich.
"""
