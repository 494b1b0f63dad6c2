"""TODO declare"""
