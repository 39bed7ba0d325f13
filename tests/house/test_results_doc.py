"""Re-rendering docs/results/demand.md keeps the sections other scripts measured."""

from __future__ import annotations

from replaylab.demand.real_traces.markdown import KEPT_BEGIN, KEPT_END, keep_other_results


def test_other_results_survive_a_rerender_before_the_caveats():
    old = f"# T\n\n## A\nold a\n\n{KEPT_BEGIN}\n\n## Online\nrows\n\n{KEPT_END}\n\n## Caveats\n- c\n"
    new = "# T\n\n## A\nnew a\n\n## Caveats\n- c\n"
    out = keep_other_results(old, new)
    assert "new a" in out and "old a" not in out
    assert out.index("## Online") < out.index("## Caveats") and out.count(KEPT_BEGIN) == 1
    assert keep_other_results(out, new) == out  # idempotent
    assert keep_other_results("no markers", new) == new
