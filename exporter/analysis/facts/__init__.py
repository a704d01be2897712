"""The measured facts of one capture: steps, breakdown, hosts, programs, kernels,
collectives, torch traces, and XProf's converters where they run."""
