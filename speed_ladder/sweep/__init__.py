"""The sweep (`python -m speed_ladder run`): its command line, its plan and types, the
rounds, launching each step as a child process, and the preflight checks and duration model.
It may import measure and report; neither imports it."""
