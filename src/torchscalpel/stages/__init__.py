"""Orchestration of each stage, below the CLI: run, enrich, save, report.

The CLI's verb modules parse flags and call these; the in-process API calls them too, so both
ways in produce the same Run record and the same files.
"""
