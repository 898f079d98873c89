"""`gridbid simulate`: replay a real GPU cluster trace under several scheduling policies
and measure what each buys (utilisation, capacity at an SLO, job times, cost, carbon).

``trace.py`` reads a trace and maps it onto GridBid's catalogue and regions (the one
place that mapping lives); ``sim.py`` is the discrete-event simulator and its policies;
``metrics.py`` turns what a simulation did into the figures of ``summary.json``; see
docs/simulate.md for every definition. Pure Python and numpy: no Django.
"""
