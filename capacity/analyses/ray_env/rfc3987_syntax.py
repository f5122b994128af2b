"""Left out of the Ray processes kvcap starts (capacity/analyses/distributed.py `start_local_ray`).

jsonschema imports this optional format plugin (installed with the Jupyter stack) when it is
present; its import builds an Earley parser, ~3.6 s of CPU in every Ray process (raylet agents,
workers). Ray 2.60's raylet gives its agents 15 s to start, which a loaded 2-core machine missed.
Without it jsonschema only skips its "iri" format checks, which nothing kvcap runs uses.
"""
raise ImportError("rfc3987_syntax is left out of kvcap's Ray processes (slow import)")
