"""The adaptive policy: each request to the (GPU group, mode) where it is predicted to decode fastest.

`policy.py` (the `Policy` itself: what it learns from each completion and the order of its rules),
`rules.py` (the pure (group, mode) rule and the tier rules on plain data), `arms.py` (what it keeps
per backend and believes per kind and group), `fit.py` (the robust TPOT-vs-load fit it learns with),
`forecast.py` (the load over the next request life), `engine.py` (what the engines' own counters teach).
The rule in a page: docs/adaptive.md.
"""

from gateway.policies.adaptive.policy import AdaptivePolicy

__all__ = ["AdaptivePolicy"]
