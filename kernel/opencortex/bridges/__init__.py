"""Bridges: chat platforms (Telegram, Signal, Matrix) as frontends of the same kernel.

Shared policy lives in the modules here (see `contract`); one module per
platform speaks that platform's protocol only.
"""
