"""Measuring one run: the Run a step makes, the device's clocks and peaks, the GPU peak
table, step 05's mixed precision on the device, the checks that say a step does nothing on a
device, the data, the memory model and the profile. Nothing here imports speed_ladder.sweep
or speed_ladder.report."""
