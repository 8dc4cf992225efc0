"""What the gateway runs that a client or a policy wrote: JSON Schemas and regular
expressions, each bounded.

- `regex`: patterns compile with RE2, which matches in time linear in the text whatever the
  pattern (Python's `re` backtracks: `^(a+)+b$` against 28 `a`s takes seconds).
- `schemas`: a JSON Schema is data, never a fetcher. Only references inside the document
  resolve; its size, depth and reference structure are bounded before it is used, and
  checking a value against it stops after a fixed number of steps.
"""
