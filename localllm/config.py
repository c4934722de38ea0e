"""Config file → typed declarations, with every load-time check.

DECLS-PLACEHOLDER
"""
