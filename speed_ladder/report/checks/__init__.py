"""Whether results can be trusted: `python -m speed_ladder check` (check.py, whose docstring
numbers every check), its checks of the records (record_checks.py) and of summary.csv and its
gain claims (summary_checks.py), and whether one record can be right and belongs to its tag
(validity.py), which the summary asks too. A new check of a record goes in record_checks.py (of
what a record says) or validity.py (a record that cannot be right), one of summary.csv in
summary_checks.py; check.py's docstring names it."""
