"""Comparing two sides: the aligned diff, the noise model (within and between
captures) and the comparison's JSON."""
