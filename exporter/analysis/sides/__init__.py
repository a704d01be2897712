"""What a BASE or HEAD names (a capture, a session, ``run:<id>[~N]``, a baseline, a
Pyroscope selection), read into flame graphs and per-step samples, and cached."""
