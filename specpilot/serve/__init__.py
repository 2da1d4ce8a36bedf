"""Serving (issue 27): an OpenAI-compatible HTTP server over a generation backend, and a load
generator that replays request sets against any OpenAI-compatible URL.

- backend.py: the seam between the server and an engine (`Backend`): `BatchBackend` over
  stock's continuous-batching engine (what the server uses), `SerialBackend` over the
  single-request stock system.
- protocol.py: the OpenAI request checks, response shapes and error bodies.
- detok.py: a reply's text piece by piece as its tokens arrive (streaming).
- app.py: the FastAPI app and the uvicorn server (`specpilot serve`).
- load.py: the load generator (`specpilot load`).
"""
