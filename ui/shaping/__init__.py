"""Pure data shaping for the UI: snapshots and store DataFrames in, DataFrames / dicts /
plotly figures / DOT text out. Nothing here imports streamlit; every function has a plain test."""
