"""triage"""
