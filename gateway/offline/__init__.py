"""Tools that run beside serving, never in it: training and evaluating the
learned tier router, evaluating trimming, replaying traces against routers. Serving never
imports this package (tests/unit/test_layering.py)."""
