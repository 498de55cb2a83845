"""Channels: a job's stage reading its upstream stages' outputs, aligned epoch by epoch."""
