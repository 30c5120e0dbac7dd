"""Other results set beside a tag's: the published reference ladder the charts and pages draw
beside ours (reference.py), the committed tag of the same hardware, the sweep's closing table
(committed.py), and a peer implementation's runs on the same machine (peers.py)."""
