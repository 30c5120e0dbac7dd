"""The PNG charts, each drawn from summary.csv files (headless: matplotlib's Agg, imported when a
chart is drawn, and no torch): a tag's tok/s, memory and MFU bars (bar_charts.py), each step's
own effect (gain_chart.py), where each step's time goes by op category (time_chart.py) and by
phase (phase_chart.py), every tag side by side (comparison_chart.py), and what every chart
shares (chart_style.py: colors, labels, the layout that keeps labels inside, the atomic save).
A new chart is a module here whose plot function pages/redraw.py calls, and which
pages/tag_page.py links where the tag's page shows it."""
