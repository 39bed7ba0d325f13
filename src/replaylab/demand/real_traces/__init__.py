"""The demand pipeline measured on public traces (docs/results/demand.md).

`datasets`: which traces, imported how, run with which overrides and why;
`scoring`: the paired session bootstrap and the verdict against issue 3's targets;
`markdown`: the results document. `scripts/demand_real_data.py` is the command
line that runs `python -m training` per dataset and calls these.
"""
