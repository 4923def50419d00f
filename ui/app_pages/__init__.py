"""Streamlit page scripts routed by ``ui/app.py`` (``st.navigation``); thin layouts over
``ui.shaping``. A package so the scripts ship with the distribution."""
