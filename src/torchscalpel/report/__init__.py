"""Rendering of records: terminal (rich) and a self-contained HTML report. Rendering never measures."""
