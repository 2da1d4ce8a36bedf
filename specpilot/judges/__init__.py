"""The judges: the only code that runs candidates, always confined.

- `worker_main.py`: the one minimal worker program every candidate runs in (stdlib, torch
  and the candidate's own `stock`; nothing of `specpilot`);
- `worker_proc.py`: clean checkouts and the parent's side of a worker;
- `forcing.py`, `gates.py`: stock's references and the correctness gates;
- `controller.py`, `stats.py`: the paired benchmark and its adoption rule;
- `costmodel.py`, `analyze.py`, `hardware.py`: where the gap to the ceiling is.
"""
