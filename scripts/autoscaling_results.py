"""The tables of docs/results/autoscaling.md from one run of the autoscaling experiment.

    python -m evaluation experiment=autoscaling tracking=off hydra.run.dir=DIR \
        'experiment.policies=[static,reactive,forecast,forecast_no_floor]'
    python scripts/autoscaling_results.py --summary DIR/summary.json --write-doc docs/results/autoscaling.md

Renders `replaylab.fleet.experiments.autoscaling.report.results_markdown(summary)` (per scenario and
policy: means and 95 % intervals over seeds; the target sweep; matched SLO; the
verdicts) and, with --write-doc, replaces the text between the doc's markers
`<!-- autoscaling_results -->` and `<!-- /autoscaling_results -->` with it, so the doc's
numbers are the run's. Without --write-doc it prints the tables.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

START, END = "<!-- autoscaling_results -->", "<!-- /autoscaling_results -->"


def replace_between_markers(doc: str, body: str) -> str:
    """`doc` with the text between START and END replaced by `body` (markers kept)."""
    if doc.count(START) != 1 or doc.count(END) != 1 or doc.index(START) > doc.index(END):
        raise ValueError(f"the doc needs exactly one {START} ... {END} pair")
    head, rest = doc.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{body.strip()}\n{END}{tail}"


def main() -> None:
    from replaylab.fleet.experiments.autoscaling.report import results_markdown

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--summary", required=True, help="DIR/summary.json of the run")
    ap.add_argument("--write-doc", default=None, help="a markdown file with the markers")
    args = ap.parse_args()
    summary = json.loads(Path(args.summary).read_text())
    if summary.get("experiment") != "autoscaling":
        sys.exit(f"error: {args.summary} is not an autoscaling summary")
    body = (f"Run: {len(summary['seeds'])} seeds, policies "
            f"{', '.join(next(iter(summary['scenarios'].values())))}; "
            f"{summary['speed']['runs']} simulations, "
            f"{summary['speed']['requests_simulated']:,} requests simulated in "
            f"{summary['speed']['wall_s'] / 60:.0f} min wall with "
            f"{summary['speed']['workers']} workers.\n\n" + results_markdown(summary))
    if args.write_doc is None:
        print(body)
        return
    doc = Path(args.write_doc)
    doc.write_text(replace_between_markers(doc.read_text(), body))
    print(f"wrote the tables of {doc}")


if __name__ == "__main__":
    main()
