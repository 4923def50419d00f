"""Streamlit layout pieces shared by several pages (the tree panel)."""
