"""traces: the canonical request trace (DESIGN §3) and everything that makes one.

schema (columns, TraceError) · loaders (load_trace, LoadReport, write_trace) · formats (layouts,
detection) · sources (file access, line numbers) · timeparse (times -> seconds) · validate (checks,
assembly) · stats (trace_info) · lengths / synth (scenarios, DEFAULT_SCENARIO) · transforms.
Imports nothing here on purpose: `import traces` stays free; import the module you need.
Must not import replay/, capacity/, duckdb or torch.
"""
