"""Agents: the planner and the sub-agent backends (reuse, tune, anthropic, command)."""
