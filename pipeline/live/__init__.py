"""Live engines: replay requests through a real engine (in-process or over HTTP) and time it.

The stage sits beside the simulator: it reads the same requests, and its results
(``live_requests``, ``live_metrics``) are compared with the simulator's by ``validate``.
"""
