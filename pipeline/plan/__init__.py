"""Capacity planning: many replays of one trace, judged against SLOs.

    sweep.py     ``tracereplay sweep``: a grid of scenarios in parallel under one run id
    grid.py      the sweep grid TOML: expand into scenarios, check before anything runs
    capacity.py  ``tracereplay capacity``: the most load a setup takes within its SLOs
    search.py    bisection along one knob, with a check of every probe made
    knobs.py     the knobs that sweeps and searches turn, named as each policy names them
    slo.py       SLOs: parse, check a replay against them, count goodput
    unloaded.py  the floor under an SLO: a latency statistic with no load at all
    tasks.py     one scenario as a unit of work, run in any process
    executor.py  run independent tasks in this process, local processes or Ray

This stage sits on the simulator (``pipeline.sim``): it imports the stages below
it and none of them imports it. docs/capacity.md is the user guide.
"""
