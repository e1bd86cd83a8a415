from __future__ import annotations

from gpuq.api.gpuqueue import LabelSelector
from gpuq.controller.selectors import describe, matches


def sel(**raw: object) -> LabelSelector:
    return LabelSelector.model_validate(raw)


def test_no_selector_matches_everything() -> None:
    assert matches(None, {})


def test_match_labels_and_expressions() -> None:
    s = sel(
        matchLabels={"team": "a"},
        matchExpressions=[
            {"key": "env", "operator": "In", "values": ["prod", "dev"]},
            {"key": "frozen", "operator": "DoesNotExist"},
        ],
    )
    assert matches(s, {"team": "a", "env": "dev"})
    assert not matches(s, {"team": "b", "env": "dev"})
    assert not matches(s, {"team": "a", "env": "test"})
    assert not matches(s, {"team": "a", "env": "prod", "frozen": "yes"})
    assert describe(s) == "team=a,env in (prod,dev),!frozen"


def test_not_in_and_exists() -> None:
    s = sel(
        matchExpressions=[
            {"key": "tier", "operator": "NotIn", "values": ["low"]},
            {"key": "gpu", "operator": "Exists"},
        ]
    )
    assert matches(s, {"gpu": "1"})
    assert matches(s, {"gpu": "1", "tier": "high"})
    assert not matches(s, {"gpu": "1", "tier": "low"})
    assert not matches(s, {})
