"""The invariant corpus of issue 31: capacity answers checked as claims.

corpus.py    the scenarios (trace recipe, engine flags, SLOs, expected regime) and their traces
runner.py    runs every command of one scenario, caching each command's outcome as JSON
invariants.py one function per invariant: (status, detail), status pass | fail | n/a

`tests/test_answers_slice.py` runs a small slice in the default test suite; `make check-answers`
(tools/check_answers.py) runs the whole corpus and writes the table to docs/answers.md.
"""
