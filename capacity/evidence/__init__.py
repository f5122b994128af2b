"""Production evidence: vLLM logs, client timings, attribution of TBT spikes, replay validation.

Must not import altair, typer or rich.
"""
