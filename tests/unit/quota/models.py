"""The two model aliases the quota tests share: `large` (pool `big`) and `tiny` (pool
`small`, what an over-budget tenant is downgraded to)."""

TWO_MODELS = """\
version: 1
pools:
  big: {served_model: served-big, replicas: [{url: "http://b.test:1"}]}
  small: {served_model: served-small, replicas: [{url: "http://s.test:1"}]}
models:
  large: {pool: big}
  tiny: {pool: small}
"""
