"""`kvcap trace ...` commands (placeholder until the trace issue lands)."""
import typer

app = typer.Typer(no_args_is_help=True, help="Inspect, synthesise and convert traces.")
