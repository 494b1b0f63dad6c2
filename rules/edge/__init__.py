"""TODO edge"""
