"""The sweep (`python -m speed_ladder run`): its command line, its plan and types, the
rounds, launching each step as a child process, the preflight checks and duration model,
and the plan for a lent GPU. It may import measure and report; neither imports it."""
