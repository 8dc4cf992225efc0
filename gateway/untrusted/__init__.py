"""What the gateway runs that a client or a policy wrote, and what it would have an engine
run or fetch for a client: JSON Schemas, regular expressions, grammars and URLs, each
bounded.

- `regex`: patterns compile with RE2, which matches in time linear in the text whatever the
  pattern (Python's `re` backtracks: `^(a+)+b$` against 28 `a`s takes seconds).
- `schemas`: a JSON Schema is data, never a fetcher. Only references inside the document
  resolve; its size, depth and reference structure are bounded before it is used, and
  checking a value against it stops after a fixed number of steps.
- `structured_outputs`: the constraints a client asks vLLM to compile in its own field
  (a schema, a regex, a grammar, choices) held to the same bounds.
- `lark_grammars`: custom tools' Lark grammars, compiled and matched by llguidance under
  its work caps, each match within a CPU budget.
- `media_urls`: media named by URL, which a multimodal engine would fetch, refused unless
  inline or from a host the policy lists.
"""
